#!/usr/bin/env python3
"""bench_serve.py - load generator for `salafw serve` (or any OpenAI-compatible
server): output tok/s, requests/s, time to first token and inter-token latency
(p50/p99) at each concurrency, through HTTP, with asyncio + aiohttp; from
salafw serve, also its engine's counters over each level (/metrics): the
decode rate of the steps that carried decode rows only, and the share of the
engine thread's own work between steps.

Every request streams a /v1/completions reply of exactly --gen tokens
(ignore_eos, greedy) to a prompt of exactly --prompt-tokens token ids (random,
seeded, distinct per request), so the figures do not depend on the weights.

  python3 bench/bench_serve.py --url http://127.0.0.1:8080/v1 --model NAME \\
      --concurrency 1,8,32 --prompt-tokens 1024 --gen 256

Per concurrency C: C clients each send requests back to back until
--requests (default max(8, 4*C)) have been sent. TTFT: from sending a request
to its first text chunk. Inter-token latency: per request, (last chunk - first
chunk) / (tokens - 1); p50/p99 over the requests. "max gap" is the longest
pause between two chunks of one stream (the server may put several tokens in
one chunk when the client reads slower than it decodes)."""
import argparse
import asyncio
import json
import random
import sys
import time

import aiohttp


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


async def one(session, a, ids, out):
    body = {"model": a.model, "prompt": ids, "max_tokens": a.gen, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    gap = 0.0
    tokens = 0
    async with session.post(a.url + "/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError("HTTP %d: %s" % (r.status, (await r.text())[:300]))
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError("stream error: %s" % ev["error"])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gap = max(gap, now - last)
                last = now
    if first is None:
        raise RuntimeError("no text came back")
    out.append({"ttft": first - t0, "itl": (last - first) / max(1, tokens - 1), "tokens": tokens, "gap": gap,
                "end": time.perf_counter()})


METRICS = ("salafw_engine_steps_total", "salafw_engine_step_seconds_total", "salafw_engine_host_seconds_total",
           "salafw_engine_decode_steps_total", "salafw_engine_decode_rows_total",
           "salafw_engine_decode_seconds_total")


async def engine_metrics(session, a):
    """salafw serve's engine counters from /metrics (None from another server)."""
    base = a.url[:-3] if a.url.endswith("/v1") else a.url
    try:
        async with session.get(base + "/metrics") as r:
            if r.status != 200:
                return None
            text = await r.text()
    except aiohttp.ClientError:
        return None
    got = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in METRICS:
            got[parts[0]] = float(parts[1])
    return got if len(got) == len(METRICS) else None


async def level(a, c, rng, vocab_lo, vocab_hi):
    n = a.requests or max(8, 4 * c)
    prompts = [[rng.randrange(vocab_lo, vocab_hi) for _ in range(a.prompt_tokens)] for _ in range(n)]
    out = []
    headers = {"Authorization": "Bearer " + a.api_key} if a.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    conn = aiohttp.TCPConnector(limit=c)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=conn) as session:
        await one(session, a, prompts[0], [])  # warm-up, not counted
        m0 = await engine_metrics(session, a)
        queue = list(range(n))

        async def client():
            while queue:
                i = queue.pop()
                await one(session, a, prompts[i], out)
        t0 = time.perf_counter()
        await asyncio.gather(*[client() for _ in range(c)])
        wall = time.perf_counter() - t0
        m1 = await engine_metrics(session, a)
    toks = sum(x["tokens"] for x in out)
    return {"concurrency": c, "requests": len(out), "wall_s": wall, "output_tok_s": toks / wall,
            "requests_s": len(out) / wall,
            "ttft_p50_ms": 1e3 * pct([x["ttft"] for x in out], 50),
            "ttft_p99_ms": 1e3 * pct([x["ttft"] for x in out], 99),
            "itl_p50_ms": 1e3 * pct([x["itl"] for x in out], 50),
            "itl_p99_ms": 1e3 * pct([x["itl"] for x in out], 99),
            "max_gap_ms": 1e3 * max(x["gap"] for x in out),
            "tokens_per_request": sorted({x["tokens"] for x in out}),
            "engine": {k: m1[k] - m0[k] for k in METRICS} if m0 and m1 else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--requests", type=int, default=0, help="per concurrency (default max(8, 4*C))")
    ap.add_argument("--ids", default="1000:30000", help="token id range LO:HI of the random prompts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="", help="also write the results here")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.ids.split(":"))
    rng = random.Random(a.seed)
    res = []
    print("%-4s %8s %8s %10s %8s %9s %9s %8s %8s %9s" % ("C", "requests", "wall s", "out tok/s", "req/s",
                                                          "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
                                                          "max gap"))
    for c in (int(x) for x in a.concurrency.split(",")):
        r = asyncio.run(level(a, c, rng, lo, hi))
        res.append(r)
        print("%-4d %8d %8.2f %10.1f %8.2f %7.1fms %7.1fms %6.2fms %6.2fms %7.1fms" % (
            c, r["requests"], r["wall_s"], r["output_tok_s"], r["requests_s"], r["ttft_p50_ms"], r["ttft_p99_ms"],
            r["itl_p50_ms"], r["itl_p99_ms"], r["max_gap_ms"]), flush=True)
        e = r["engine"]
        if e and e["salafw_engine_decode_seconds_total"] > 0:
            busy = e["salafw_engine_step_seconds_total"] + e["salafw_engine_host_seconds_total"]
            print("     engine: %d steps, %d of decode rows only (mean batch %.1f): %.1f tok/s while only "
                  "decoding; its own work between steps %.1f%% of its time" % (
                      e["salafw_engine_steps_total"], e["salafw_engine_decode_steps_total"],
                      e["salafw_engine_decode_rows_total"] / max(1, e["salafw_engine_decode_steps_total"]),
                      e["salafw_engine_decode_rows_total"] / e["salafw_engine_decode_seconds_total"],
                      100.0 * e["salafw_engine_host_seconds_total"] / busy if busy > 0 else 0.0), flush=True)
        if r["tokens_per_request"] != [a.gen]:
            print("bench_serve: replies had %s tokens, not %d" % (r["tokens_per_request"], a.gen), file=sys.stderr)
            return 1
    print("prompt %d tokens, %d output tokens per request, %s" % (a.prompt_tokens, a.gen, a.url))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
