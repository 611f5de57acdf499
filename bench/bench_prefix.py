#!/usr/bin/env python3
"""bench_prefix.py - time to first token of prompts that share a prefix, on a
running `salafw serve` (issue 25): request A, a prompt of --prefix random
token ids, then B, A's ids and --suffix more; with the prefix cache B
prefills only its suffix. Each request is streamed and timed from sending to
its first token; the usage's cached tokens are printed. With --turns T, a
conversation instead: a --prefix-id start, then T turns, each prompt the
previous one, its reply (--reply tokens generated, ids as
return_tokens_as_token_ids names them) and a 512-id user message; with the
cache a turn starts from the state at the previous reply's end and
prefills the last reply token and the message only.
Token-id prompts (the completions API takes a list of ids), so the lengths
are exact.
  bench_prefix.py --url http://127.0.0.1:8080/v1 --model ID --prefix 131072 --suffix 64
  bench_prefix.py --url http://127.0.0.1:8080/v1 --model ID --prefix 32768 --turns 8
"""
import argparse
import json
import random
import time
import urllib.request


def request(url, model, ids, gen, out=None):
    """Streams a completion of ids; TTFT, cached tokens, total time. out: a
    list that gets the reply's token ids."""
    body = {"model": model, "prompt": ids, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if out is not None:
        body.update({"logprobs": 0, "return_tokens_as_token_ids": True})
    body = json.dumps(body).encode()
    req = urllib.request.Request(url + "/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, cached, n = None, None, 0
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("choices") and ttft is None:
                ttft = time.monotonic() - t0
            if d.get("choices"):
                n += 1
                lp = d["choices"][0].get("logprobs")
                if out is not None and lp:
                    out.extend(int(t.split(":", 1)[1]) for t in lp["tokens"])
            u = d.get("usage")
            if u:
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    return ttft, cached, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefix", type=int, default=131072)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--turns", type=int, default=0)
    ap.add_argument("--reply", type=int, default=256)
    a = ap.parse_args()
    r = random.Random(25)
    if a.turns:
        ids = [r.randrange(3, a.vocab) for _ in range(a.prefix)]
        for t in range(1, a.turns + 1):
            reply = []
            ttft, cached, total = request(a.url, a.model, ids, a.reply, reply)
            print("turn %d %7d tokens: TTFT %.3f s, cached %s, prefilled %d, total %.3f s (%d reply tokens)" %
                  (t, len(ids), ttft, cached, len(ids) - (cached or 0), total, len(reply)), flush=True)
            ids = ids + reply + [r.randrange(3, a.vocab) for _ in range(512)]
        return
    a_ids = [r.randrange(3, a.vocab) for _ in range(a.prefix)]
    b_ids = a_ids + [r.randrange(3, a.vocab) for _ in range(a.suffix)]
    c_ids = a_ids + [r.randrange(3, a.vocab) for _ in range(a.suffix)]
    for name, ids in (("A (the prefix alone)", a_ids), ("B (prefix + suffix)", b_ids),
                      ("C (prefix + another suffix)", c_ids)):
        ttft, cached, total = request(a.url, a.model, ids, a.gen)
        print("%-28s %7d tokens: TTFT %.3f s, cached %s, total %.3f s" % (name, len(ids), ttft, cached, total),
              flush=True)


if __name__ == "__main__":
    main()
