#!/usr/bin/env python3
"""compare.py TEST_CHAT WORKDIR TEMPLATE... - renders the message lists of
tests/chat/cases.py (for chat templates given as files) and of
tests/chat/features.py with `TEST_CHAT --render` (formats/jinja.c) and with
tests/chat/render.py (python3-jinja2), and prints one line per template:
"PASS name: N cases identical" or "FAIL name: ...". Exit 1 on any FAIL."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import features  # noqa: E402


def run(binary, work, name, tpl_text, cases):
    tpl = os.path.join(work, name + ".jinja")
    with open(tpl, "w", encoding="utf-8", newline="") as f:
        f.write(tpl_text)
    cpath = os.path.join(work, name + ".cases.json")
    with open(cpath, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    outs = []
    for cmd, tag in (([binary, "--render"], "c"), ([sys.executable, os.path.join(HERE, "render.py")], "py")):
        o = os.path.join(work, "%s.%s.json" % (name, tag))
        r = subprocess.run(cmd + [tpl, cpath, o], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return None, "%s renderer exited %d: %s" % (tag, r.returncode, r.stderr.strip()[:300])
        with open(o, encoding="utf-8") as f:
            outs.append(json.load(f))
    return outs, None


def main():
    binary, work = sys.argv[1], sys.argv[2]
    files = sys.argv[3:]
    subprocess.run([sys.executable, os.path.join(HERE, "cases.py"), os.path.join(work, "chat_cases.json")], check=True)
    with open(os.path.join(work, "chat_cases.json"), encoding="utf-8") as f:
        chat_cases = json.load(f)
    jobs = []
    for p in files:
        with open(p, encoding="utf-8", newline="") as f:
            jobs.append((os.path.basename(p).rsplit(".", 1)[0], f.read(), chat_cases + features.MSGS, False))
    for name, t in features.FEATURES.items():
        jobs.append(("feature_" + name, t, features.MSGS, False))
    for name, t in features.ERRORS.items():
        jobs.append(("error_" + name, t, features.MSGS[:1], True))
    failed = 0
    total = 0
    for name, text, cases, must_fail in jobs:
        outs, err = run(binary, work, name, text, cases)
        if err:
            print("FAIL %s: %s" % (name, err))
            failed += 1
            continue
        c, p = outs
        bad = []
        refused = 0
        for i, (x, y) in enumerate(zip(c, p)):
            if not x["ok"] and not y["ok"]:
                refused += 1  # both refuse (e.g. messages[0] of an empty list); messages differ by design
            elif must_fail or x != y:
                bad.append((i, x, y))
        if not must_fail and refused * 4 > len(cases):
            bad.append((-1, "more than a quarter of the cases refused by both", None))
        total += len(cases)
        if bad or len(c) != len(cases):
            failed += 1
            i, x, y = bad[0] if bad else (-1, None, None)
            print("FAIL %s: %d of %d cases differ; first, case %d:\n  C : %r\n  py: %r"
                  % (name, len(bad), len(cases), i, json.dumps(x, ensure_ascii=False)[:900],
                     json.dumps(y, ensure_ascii=False)[:900]))
        else:
            print("PASS %s: %d cases, %d identical, %d refused by both" % (name, len(cases), len(cases) - refused, refused))
    print("compare: %d templates, %d cases, %d templates failed" % (len(jobs), total, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
