#!/usr/bin/env python3
"""render.py TEMPLATE CASES.json OUT.json - renders each case of CASES.json
with python3-jinja2 the way HF transformers' apply_chat_template does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls,
the {% generation %} tag, its tojson and raise_exception; messages, tools
and documents passed, tools None when absent). OUT.json: a list of
{"ok": true, "text": ...} or {"ok": false, "error": ...}, one per case.
The independent peer of tests/test_chat.c --render."""
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    # as transformers' AssistantTracker when no mask is asked for: the body renders as is
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    tpl_path, cases_path, out_path = sys.argv[1:4]
    with open(tpl_path, encoding="utf-8", newline="") as f:
        src = f.read()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    try:
        tpl = env.from_string(src)
    except Exception as e:  # a template that does not compile fails every case
        out = [{"ok": False, "error": "compile: %s" % e} for _ in cases]
        tpl = None
    if tpl is not None:
        for c in cases:
            kw = dict(c.get("kwargs") or {})
            kw.setdefault("bos_token", c.get("bos_token", "<s>"))
            kw.setdefault("eos_token", c.get("eos_token", "<|im_end|>"))
            kw.setdefault("documents", None)
            for k in ("messages", "tools", "add_generation_prompt"):
                kw.pop(k, None)
            try:
                text = tpl.render(messages=c["messages"], tools=c.get("tools"),
                                  add_generation_prompt=bool(c.get("add_generation_prompt")), **kw)
                out.append({"ok": True, "text": text})
            except Exception as e:
                out.append({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
