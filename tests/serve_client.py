#!/usr/bin/env python3
"""serve_client.py - `salafw serve` through the real `openai` client (PyPI).

usage: serve_client.py BASE_URL MODEL_ID ALIAS RUN_JSON
  MODEL_ID: the id /v1/models lists; ALIAS: another id the server takes.
  RUN_JSON: the argv (JSON list) that runs `salafw run MODEL_DIR ...` with
  the gate options, to which -p/--chat/-n/... are appended (and whose
  "run" becomes "score" for the logprobs check).
Prints one "PASS name" or "FAIL name: why" line per check (tests/test_serve.sh
counts them)."""
import concurrent.futures
import http.client
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse

import openai

BASE, MODEL, ALIAS, RUN = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
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


def post(path, body):
    """POST JSON to the server's root (not /v1): status and parsed body."""
    u = urllib.parse.urlparse(BASE)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, json.loads(r.read().decode())
    c.close()
    return out


def read_safetensors(path):
    """{name: list of floats or ints} of a safetensors file (F32, I32)."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        a, e = v["data_offsets"]
        fmt = {"F32": "f", "I32": "i"}[v["dtype"]]
        vals = list(struct.unpack("<%d%s" % ((e - a) // 4, fmt), b[8 + n + a:8 + n + e]))
        if len(v["shape"]) == 2:
            w = v["shape"][1]
            vals = [vals[i * w:(i + 1) * w] for i in range(v["shape"][0])]
        out[k] = vals
    return out


def log_softmax(row, T=1.0):
    m = max(x / T for x in row)
    z = sum(math.exp(x / T - m) for x in row)
    return [x / T - m - math.log(z) for x in row]


def extras(prompt, full, msgs):
    """Issue 26: names, leniency, sampling controls, tools, tokenize."""
    # a request written for vLLM: extra_body fields at values that change nothing
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, extra_body={
        "repetition_penalty": 1.0, "min_p": 0.0, "skip_special_tokens": True, "top_k": -1,
        "spaces_between_special_tokens": True, "frobnicate": {"x": 1}})
    check("vLLM extra_body (completions) is accepted and changes nothing", r.choices[0].text == full,
          r.choices[0].text)
    want = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
    want = want.choices[0].message.content
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=12, temperature=0, reasoning_effort=None, modalities=["text"],
        prediction={"type": "content", "content": "Blue"}, parallel_tool_calls=True,
        extra_body={"repetition_penalty": 1.0, "min_p": 0.0, "skip_special_tokens": True,
                    "chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": True})
    check("vLLM extra_body (chat) is accepted and changes nothing", r.choices[0].message.content == want,
          "%r vs %r" % (r.choices[0].message.content, want))
    dev = [{"role": "developer", "content": msgs[0]["content"]}] + msgs[1:]
    r = client.chat.completions.create(model=MODEL, messages=dev, max_tokens=12, temperature=0)
    check("developer = system", r.choices[0].message.content == want, r.choices[0].message.content)
    # a history with a tool call (assistant content null) and the tool's answer
    hist = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    r = client.chat.completions.create(model=MODEL, messages=hist, max_tokens=4, temperature=0)
    check("tool messages and content null are accepted", r.choices[0].finish_reason in ("stop", "length"))
    a = client.completions.create(model=MODEL, prompt="x", max_tokens=1).id
    b = client.completions.create(model=MODEL, prompt="x", max_tokens=1).id
    check("response ids are random", a != b and re.fullmatch(r"cmpl-[0-9a-f]{24}", a) and
          re.fullmatch(r"chatcmpl-[0-9a-f]{24}", r.id), "%s %s %s" % (a, b, r.id))

    # /tokenize and /detokenize (vLLM's shapes)
    st, t = post("/tokenize", {"model": MODEL, "prompt": prompt})
    st2, d = post("/detokenize", {"model": MODEL, "tokens": t.get("tokens", [])[1:]})
    check("tokenize / detokenize round trip", st == 200 and st2 == 200 and t["count"] == len(t["tokens"]) and
          d["prompt"] == prompt, "%s %s" % (t, d))
    st, t = post("/tokenize", {"model": MODEL, "messages": msgs})
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1)
    check("tokenize messages counts the chat prompt", st == 200 and t["count"] == r.usage.prompt_tokens,
          "%s vs %s" % (t, r.usage))
    st, t = post("/tokenize", {"model": "nope", "prompt": "x"})
    check("tokenize of an unknown model: 404", st == 404 and t["error"]["code"] == "model_not_found", str(t))

    # logprobs against `salafw score` on the same tokens (greedy: the
    # distribution at temperature 1, nothing cut)
    pids = post("/tokenize", {"prompt": prompt})[1]["tokens"]
    r = client.completions.create(model=MODEL, prompt=pids, max_tokens=4, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    tmp = tempfile.mkdtemp()
    try:
        open(os.path.join(tmp, "ids.txt"), "w").write(" ".join(map(str, pids)))
        score = [RUN[0], "score"] + RUN[2:] + ["--ids", os.path.join(tmp, "ids.txt"), "--decode", "3",
                                               "-o", os.path.join(tmp, "s.safetensors")]
        subprocess.run(score, capture_output=True, timeout=60, check=True)
        sc = read_safetensors(os.path.join(tmp, "s.safetensors"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [sc["prefill.logits"][-1]] + sc["decode.logits"][:3]
    toks = sc["decode.tokens"][:4]
    worst, tops = 0.0, True
    for k in range(4):
        ls = log_softmax(rows[k])
        worst = max(worst, abs(lp.token_logprobs[k] - ls[toks[k]]))
        best = sorted(ls, reverse=True)[:5]
        got = sorted(lp.top_logprobs[k].values(), reverse=True)
        tops &= len(got) <= 5 and all(abs(g - w) < 1e-4 for g, w in zip(got, best))
        tops &= post("/detokenize", {"tokens": [toks[k]]})[1]["prompt"].strip() == lp.tokens[k].strip()
    check("logprobs == log_softmax of salafw score's logits (worst %.1e)" % worst, worst < 1e-4 and tops,
          "%s vs %s" % (lp.token_logprobs, toks))
    # chat logprobs, streamed and not
    kw = dict(model=MODEL, messages=msgs, max_tokens=6, temperature=0.8, seed=5, logprobs=True, top_logprobs=3)
    a = client.chat.completions.create(**kw).choices[0].logprobs.content
    sl = []
    for ch in client.chat.completions.create(stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            sl += ch.choices[0].logprobs.content
    check("chat logprobs: streamed == not streamed", [(x.token, x.logprob) for x in a] ==
          [(x.token, x.logprob) for x in sl] and len(a) == 6 and all(len(x.top_logprobs) == 3 for x in a),
          "%s vs %s" % (a, sl))
    check("chat logprobs: the chosen is among the top or below them, top sorted",
          all(x.logprob <= x.top_logprobs[0].logprob + 1e-6 and
              [t.logprob for t in x.top_logprobs] == sorted([t.logprob for t in x.top_logprobs], reverse=True)
              for x in a))
    # min_p 1: only the best survives, so every logprob is 0 (greedy by another road)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=1, logprobs=0,
                                  extra_body={"min_p": 1.0})
    check("min_p 1 draws the argmax (logprob 0, text == greedy)", all(x == 0 for x in r.choices[0].logprobs.token_logprobs)
          and full.startswith(r.choices[0].text), "%r %s" % (r.choices[0].text, r.choices[0].logprobs.token_logprobs))
    # logit_bias: +100 on one token takes every draw
    tid = post("/tokenize", {"prompt": "hello", "add_special_tokens": False})[1]["tokens"][-1]
    one = post("/detokenize", {"tokens": [tid, tid]})[1]["prompt"]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=1, seed=3,
                                  logit_bias={str(tid): 100})
    check("logit_bias +100 takes every draw", r.choices[0].text.strip() == one.strip(), "%r vs %r" % (r.choices[0].text, one))
    # presence + frequency penalties: a token once made loses 4, more than
    # the spread of this model's logits: no token twice in greedy output
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, logprobs=0,
                                  presence_penalty=2, frequency_penalty=2)
    toks = [t for t in r.choices[0].logprobs.tokens if "\ufffd" not in t]  # byte pieces all show as U+FFFD
    check("penalties: no token repeats in greedy output", len(set(toks)) == len(toks) > 8, str(toks))
    # skip_special_tokens: a special token forced by logit_bias shows only when asked
    sid = post("/tokenize", {"prompt": "<|im_start|>", "add_special_tokens": False})[1]["tokens"]
    if len(sid) == 1:
        kw = dict(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, logit_bias={str(sid[0]): 100})
        a = client.completions.create(**kw).choices[0].text
        b = client.completions.create(extra_body={"skip_special_tokens": False}, **kw).choices[0].text
        check("special tokens skipped unless skip_special_tokens false", a == "" and b == "<|im_start|>" * 2,
              "%r %r" % (a, b))
    else:
        check("the tiny model has <|im_start|> as one token", False, str(sid))
    # n: choices of their own seeds (seed + index), streamed the same
    kw = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0.9, seed=21)
    one = client.completions.create(**kw).choices[0].text
    r = client.completions.create(n=3, **kw)
    got = sorted(r.choices, key=lambda c: c.index)
    check("n = 3: three choices, the first the n = 1 answer", len(got) == 3 and [c.index for c in got] == [0, 1, 2]
          and got[0].text == one and 8 <= r.usage.completion_tokens <= 24, str(r))
    st = {}
    for ch in client.completions.create(n=3, stream=True, **kw):
        for c in ch.choices:
            st[c.index] = st.get(c.index, "") + (c.text or "")
    check("n = 3 streamed == not streamed", [st.get(i) for i in range(3)] == [c.text for c in got], str(st))

    # tools: the named function's call is begun in the prompt, the model
    # writes the arguments; a bias on "{" and "}" lets the random model
    # close it for some seeds, and then the reply is a tool call
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    br = post("/tokenize", {"prompt": "{}}", "add_special_tokens": False})[1]["tokens"]
    bias = {str(br[0]): 100, str(br[-1]): 100}
    found = None
    for seed in range(1, 61):
        r = client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=3, seed=seed,
                                           temperature=1, logit_bias=bias,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        m = r.choices[0].message
        if m.tool_calls:
            found = seed
            break
        if not (m.content or "").startswith("<tool_call>"):
            break
    ok = found is not None and r.choices[0].finish_reason == "tool_calls" and m.content is None and \
        len(m.tool_calls) == 1 and m.tool_calls[0].function.name == "get_weather" and \
        json.loads(m.tool_calls[0].function.arguments) == {} and m.tool_calls[0].id.startswith("call_")
    check("tool_choice named: the reply parsed into tool_calls (seed %s)" % found, ok, str(r))
    if found:
        calls, fin, text = [], None, ""
        for ch in client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=3, seed=found,
                                                 temperature=1, logit_bias=bias, stream=True,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}}):
            for c in ch.choices:
                calls += c.delta.tool_calls or []
                text += c.delta.content or ""
                fin = c.finish_reason or fin
        check("tool_calls streamed as deltas", len(calls) == 1 and calls[0].function.name == "get_weather" and
              calls[0].index == 0 and fin == "tool_calls" and text == "", "%s %s %r" % (calls, fin, text))
    # auto: the random model writes no call, the text is the content
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=6, temperature=0)
    check("tool_choice auto without a call: content, no tool_calls", not r.choices[0].message.tool_calls and
          r.choices[0].finish_reason in ("stop", "length"), str(r))
    try:
        client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=2,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
        check("tool_choice naming no tool: 400", False, "no error")
    except openai.BadRequestError as e:
        check("tool_choice naming no tool: 400", e.status_code == 400, str(e))


def metrics_now():
    """The server's /metrics series without labels: name -> value."""
    u = urllib.parse.urlparse(BASE)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("GET", "/metrics")
    t = c.getresponse().read().decode()
    c.close()
    return {k: float(v) for k, v in re.findall(r"^(salafw_[a-z_]+) ([0-9.e+]+)$", t, re.M)}


def n_shared(prompt, full, msgs):
    """n > 1 at temperature 0: the choices share one prefill (the first
    choice's, forked), so each is the n = 1 greedy answer; the prompt is
    prefilled once (salafw_prompt_tokens_prefilled_total rises by its length)
    and the two other choices are forks."""
    pre, fk = "salafw_prompt_tokens_prefilled_total", "salafw_choice_forks_total"
    m0 = metrics_now()
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, n=3)
    m1 = metrics_now()
    got = sorted(r.choices, key=lambda c: c.index)
    check("n = 3 at temperature 0: choices 0, 1, 2, each the n = 1 greedy text",
          len(got) == 3 and [c.index for c in got] == [0, 1, 2] and all(c.text == full for c in got),
          "%r vs %r" % ([c.text for c in got], full))
    check("n = 3 prefilled its %d prompt tokens once, two choices forked" % r.usage.prompt_tokens,
          m1.get(pre, -1) - m0.get(pre, 0) == r.usage.prompt_tokens and m1.get(fk, -1) - m0.get(fk, 0) == 2 and
          r.usage.completion_tokens == 3 * 24, "prefilled %s -> %s, forks %s -> %s, %s" %
          (m0.get(pre), m1.get(pre), m0.get(fk), m1.get(fk), r.usage))
    st = {}
    for ch in client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, n=3, stream=True):
        for c in ch.choices:
            st[c.index] = st.get(c.index, "") + (c.text or "")
    check("n = 3 at temperature 0 streamed: each the greedy text", [st.get(i) for i in range(3)] == [full] * 3, str(st))
    one = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    m0 = metrics_now()
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0, n=3)
    m1 = metrics_now()
    got = sorted(r.choices, key=lambda c: c.index)
    want = one.choices[0].message.content
    check("chat n = 3 at temperature 0: choices 0, 1, 2, each the n = 1 greedy reply",
          len(got) == 3 and [c.index for c in got] == [0, 1, 2] and all(c.message.content == want for c in got),
          "%r vs %r" % ([c.message.content for c in got], want))
    check("chat n = 3 prefilled its prompt once",
          m1.get(pre, -1) - m0.get(pre, 0) == r.usage.prompt_tokens == one.usage.prompt_tokens,
          "prefilled %s -> %s, %s" % (m0.get(pre), m1.get(pre), r.usage))


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
    # models: the repo id listed, the directory's name accepted too
    ms = client.models.list()
    check("models lists the served model", [x.id for x in ms.data] == [MODEL], str(ms))
    check("models/{id}: the repo id and the alias", client.models.retrieve(MODEL).id == MODEL and
          client.models.retrieve(ALIAS).id == ALIAS)
    try:
        client.models.retrieve("no-such-model")
        check("models/{id} of an unknown model: 404", False, "no error")
    except openai.NotFoundError as e:
        check("models/{id} of an unknown model: 404", e.status_code == 404, str(e))
    r = client.completions.create(model=ALIAS, prompt=prompt, max_tokens=24, temperature=0)
    check("the alias serves the same model", r.choices[0].text == full and r.model == ALIAS, r.choices[0].text)

    extras(prompt, full, msgs)
    n_shared(prompt, full, msgs)

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

    metrics = metrics_now
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
    # n = 3 streamed (the lead's sequence and two forks) closed half-way: all three freed
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4000, "temperature": 0.7, "stream": True,
                       "ignore_eos": True, "n": 3})
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = c.getresponse()
    events = 0
    while events < 12:
        line = resp.fp.readline()
        if line.startswith(b"data: {"):
            events += 1
    c.sock.shutdown(2)
    c.close()
    t0 = time.time()
    while time.time() - t0 < 5:
        mt = metrics()
        if mt.get("salafw_requests_cancelled_total", 0) >= before + 5 and mt.get("salafw_running") == 0:
            break
        time.sleep(0.02)
    check("n = 3 streamed, closed half-way: the three sequences freed",
          mt.get("salafw_requests_cancelled_total", 0) == before + 5 and mt.get("salafw_running") == 0 and
          mt.get("salafw_queue_depth") == 0, str(mt))
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
        check("unknown model is a 404 NotFoundError", False, "no error")
    except openai.NotFoundError as e:
        check("unknown model is a 404 NotFoundError (model_not_found)", e.status_code == 404 and
              "no-such-model" in str(e) and e.code == "model_not_found", str(e))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a crash is one failure, with its reason
        print("FAIL serve_client crashed: %r" % (e,))
        sys.exit(1)
