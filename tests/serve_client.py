#!/usr/bin/env python3
"""serve_client.py - `salafw serve` through the real `openai` client (PyPI).

usage: serve_client.py BASE_URL MODEL_ID RUN_JSON
  RUN_JSON: the argv (JSON list) that runs `salafw run MODEL_DIR ...` with
  the gate options, to which -p/--chat/-n/... are appended.
Prints one "PASS name" or "FAIL name: why" line per check (tests/test_serve.sh
counts them)."""
import concurrent.futures
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.parse

import openai

BASE, MODEL, RUN = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=60)
failed = 0


def check(name, ok, why=""):
    global failed
    if ok:
        print("PASS " + name, flush=True)
    else:
        failed += 1
        print("FAIL %s: %s" % (name, why), flush=True)


def run(*args):
    """salafw run's text: its stdout without the closing newline."""
    p = subprocess.run(RUN + list(args), capture_output=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError("salafw run %s: exit %d: %s" % (args, p.returncode, p.stderr.decode()[-300:]))
    out = p.stdout.decode("utf-8", "replace")
    return out[:-1] if out.endswith("\n") else out


def stream_text(it, chat):
    text, finish, usage, done_role = "", None, None, False
    for ch in it:
        if ch.usage is not None:
            usage = ch.usage
        if not ch.choices:
            continue
        c = ch.choices[0]
        if chat:
            if c.delta.role == "assistant":
                done_role = True
            text += c.delta.content or ""
        else:
            text += c.text or ""
        if c.finish_reason:
            finish = c.finish_reason
    return text, finish, usage, done_role


def main():
    prompt = "The quick brown fox"
    # completions: greedy equals salafw run --greedy on the same prompt
    want = run("--raw", "-p", prompt, "-n", "24", "--greedy")
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    check("completion greedy == run --greedy", r.choices[0].text == want, "%r vs %r" % (r.choices[0].text, want))
    check("completion finish_reason length", r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
    check("completion usage", r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 0 and
          r.usage.total_tokens == r.usage.prompt_tokens + 24, str(r.usage))
    text, fin, usage, _ = stream_text(client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}), False)
    check("completion stream == run --greedy", text == want, "%r vs %r" % (text, want))
    check("completion stream finish and usage", fin == "length" and usage is not None and
          usage.completion_tokens == 24, "%s %s" % (fin, usage))

    # chat: the ChatML template, system + user
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    want = run("--chat", "--system", "You are terse.", "-p", "Name a colour.", "-n", "20", "--greedy")
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    m = r.choices[0].message
    check("chat greedy == run --chat --greedy", m.content == want and m.role == "assistant",
          "%r vs %r" % (m.content, want))
    text, fin, _, role = stream_text(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=20, temperature=0, stream=True), True)
    check("chat stream == run --chat --greedy", text == want and role, "%r vs %r" % (text, want))
    # an assistant turn in the history renders as ChatML too
    hist = msgs + [{"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another."}]
    r = client.chat.completions.create(model=MODEL, messages=hist, max_tokens=8, temperature=0)
    check("chat with history answers", r.choices[0].finish_reason in ("stop", "length") and
          r.usage.prompt_tokens > 20, str(r.usage))

    # sampling: seed, temperature, top_p, top_k as run's sampler
    want = run("--raw", "-p", prompt, "-n", "24", "--temp", "0.8", "--top-p", "0.9", "--top-k", "40", "--seed", "11")
    kw = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0.8, top_p=0.9, seed=11,
              extra_body={"top_k": 40})
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    check("seeded sampling == run --seed", a == want, "%r vs %r" % (a, want))
    check("seeded sampling repeats", a == b)
    # stop strings (a string, a list): as run --stop, finish_reason stop
    full = run("--raw", "-p", prompt, "-n", "24", "--greedy")
    cut = next((full[i:i + 2] for i in range(3, len(full) - 2) if full[i:i + 2].strip()), None)
    if cut:
        want = run("--raw", "-p", prompt, "-n", "24", "--greedy", "--stop", cut)
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=cut)
        check("stop string == run --stop", r.choices[0].text == want and r.choices[0].finish_reason == "stop",
              "%r vs %r (%s)" % (r.choices[0].text, want, r.choices[0].finish_reason))
        text, fin, _, _ = stream_text(client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=["\x01never", cut], stream=True), False)
        check("stream stop list == run --stop", text == want and fin == "stop", "%r vs %r (%s)" % (text, want, fin))
    # models
    ms = client.models.list()
    check("models lists the served model", [x.id for x in ms.data] == [MODEL], str(ms))

    # 64 concurrent streaming clients, each with the output it gets alone
    prompts = ["Story %d: once upon a time" % i for i in range(64)]
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0).choices[0].text
             for p in prompts]
    check("alone output == run --greedy", alone[5] == run("--raw", "-p", prompts[5], "-n", "12", "--greedy"))

    def one(p):
        return stream_text(client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0,
                                                     stream=True), False)[0]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(64) as ex:
        got = list(ex.map(one, prompts, timeout=120))
    bad = [i for i in range(64) if got[i] != alone[i]]
    check("64 concurrent streams each == alone (%.1f s)" % (time.time() - t0), not bad,
          "differ at %s: %r vs %r" % (bad[:5], got[bad[0]] if bad else "", alone[bad[0]] if bad else ""))

    # a client that disconnects half-way frees its sequence at once
    u = urllib.parse.urlparse(BASE)

    def metrics():
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request("GET", "/metrics")
        t = c.getresponse().read().decode()
        c.close()
        return {k: float(v) for k, v in re.findall(r"^(salafw_[a-z_]+) ([0-9.e+]+)$", t, re.M)}

    before = metrics().get("salafw_requests_cancelled_total", 0)
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4000, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = c.getresponse()
    events = 0
    while events < 5:
        line = resp.fp.readline()
        if line.startswith(b"data: {"):
            events += 1
    c.sock.shutdown(2)
    c.close()
    t0 = time.time()
    while time.time() - t0 < 5:
        mt = metrics()
        if mt.get("salafw_requests_cancelled_total", 0) > before and mt.get("salafw_running") == 0:
            break
        time.sleep(0.02)
    check("a stream closed half-way frees its sequence (%.2f s)" % (time.time() - t0),
          mt.get("salafw_requests_cancelled_total", 0) == before + 1 and mt.get("salafw_running") == 0, str(mt))
    # the same for a request that is not streamed
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4000, "temperature": 0, "ignore_eos": True})
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    time.sleep(0.3)
    c.sock.shutdown(2)
    c.close()
    t0 = time.time()
    while time.time() - t0 < 5:
        mt = metrics()
        if mt.get("salafw_requests_cancelled_total", 0) > before + 1 and mt.get("salafw_running") == 0:
            break
        time.sleep(0.02)
    check("a waiting client that goes away frees its sequence",
          mt.get("salafw_requests_cancelled_total", 0) == before + 2 and mt.get("salafw_running") == 0, str(mt))
    # and the server still answers
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    check("the server answers after the disconnects", r.choices[0].text == full)
    mt = metrics()
    check("metrics count tokens and latencies", mt.get("salafw_generation_tokens_total", 0) > 64 * 12 and
          mt.get("salafw_time_to_first_token_seconds_count", 0) > 64 and
          mt.get("salafw_inter_token_latency_seconds_count", 0) > 64 * 11 and
          mt.get("salafw_queue_depth") == 0, str(mt))
    # errors reach the client as OpenAI errors
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        check("unknown model is a 400 BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("unknown model is a 400 BadRequestError", e.status_code == 400 and "no-such-model" in str(e), str(e))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a crash is one failure, with its reason
        print("FAIL serve_client crashed: %r" % (e,))
        sys.exit(1)
