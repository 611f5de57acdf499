#!/usr/bin/env python3
"""cases.py OUT.json - the message lists tests/test_chat_template.sh renders
with both engines: system/user/assistant/tool roles, tool calls (arguments
as objects and as JSON strings), tools lists, multi-turn, reasoning, unicode,
empty and null content, add_generation_prompt on and off, enable_thinking."""
import json
import sys

W = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city, in °C",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "名前 / name"},
                                                      "days": {"type": "integer", "default": 1}},
                    "required": ["city"]}}}
S = {"type": "function", "function": {"name": "search", "description": "Search \"quoted\" \\ back\\slash\n newline\ttab",
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "number"},
                                                      "exact": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}}},
                    "required": ["q"]}}}
NOARGS = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def u(c): return {"role": "user", "content": c}
def a(c, **k): d = {"role": "assistant", "content": c}; d.update(k); return d
def s(c): return {"role": "system", "content": c}
def t(c, **k): d = {"role": "tool", "content": c}; d.update(k); return d
def call(name, args, cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid: c["id"] = cid
    return c


lists = [
    [u("Hello")],
    [s("You are a helpful assistant."), u("Hi!")],
    [s("sys"), u("one"), a("two"), u("three")],
    [u("a"), a("b"), u("c"), a("d"), u("e"), a("f")],
    [u("")],
    [s(""), u(""), a("")],
    [u("unicode: héllo wörld ✓ 你好 😀 𝔘 ‍ combining é tab\there")],
    [u("line1\nline2\r\nline3\n\n"), a("  spaced  \n")],
    [u("quotes ' \" and backslash \\ and {{ braces }} {% tags %} {# c #}")],
    [u("What is 2+2?"), a("<think>\nadd them\n</think>\n\n4")],
    [u("q"), a("<think>r1</think>answer 1"), u("q2"), a("<think>\nr2\n</think>\nanswer 2")],
    [u("q"), a("final", reasoning_content="because")],
    [u("q"), a("x", reasoning_content=None)],
    [u("Weather in Paris?"), a("", tool_calls=[call("get_weather", {"city": "Paris"}, "c1")]),
     t('{"temp": 21}', tool_call_id="c1"), a("It is 21 °C.")],
    [u("Weather?"), a(None, tool_calls=[call("get_weather", '{"city": "Oslo", "days": 2}')]),
     t("cold")],
    [u("two calls"), a("Let me check.", tool_calls=[call("get_weather", {"city": "A"}), call("search", {"q": "b", "limit": 2.5, "exact": True, "tags": ["x", "ü"]})]),
     t("r1"), t("r2"), a("done")],
    [u("nested"), a("", tool_calls=[{"function": {"name": "now", "arguments": {}}}]), t(""), u("again"),
     a("", tool_calls=[call("search", {"q": "z", "nested": {"a": [1, 2, {"b": None}], "f": 0.1, "big": 1e20, "neg": -3}})])],
    [u("<tool_response>x</tool_response>")],
    [u("q"), a("a"), u("<tool_response>\nr\n</tool_response>"), a("b")],
    [s("first"), u("u"), s("second system")],
    [u("x"), t("orphan tool")],
    [t("tool first")],
    [u("emoji in args"), a("", tool_calls=[call("search", {"q": "😀 \u0001 \u001f \u2028 \u007f"})])],
]
tools_sets = [None, [W], [W, S, NOARGS], []]
kw_sets = [None, {"enable_thinking": False}, {"enable_thinking": True}, {"custom": "x"}]

cases = []
for i, m in enumerate(lists):
    for agp in (True, False):
        cases.append({"messages": m, "add_generation_prompt": agp})
    cases.append({"messages": m, "tools": tools_sets[1 + i % 3], "add_generation_prompt": True,
                  "kwargs": kw_sets[i % 4]})
    cases.append({"messages": m, "tools": tools_sets[1], "add_generation_prompt": bool(i % 2),
                  "kwargs": {"enable_thinking": False}})
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(cases, f, ensure_ascii=False)
