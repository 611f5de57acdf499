#!/usr/bin/env bash
# test_chat_template.sh - formats/jinja.c against python3-jinja2 (the peer):
# the built-in chat template, MiniCPM3's tool template, the ChatML template
# mkmodel writes and a set of generic Jinja templates are rendered over the
# message lists of tests/chat/cases.py by both engines (tests/chat/compare.py)
# and must agree byte for byte; templates that must fail fail in both. Also:
# formats/chat_builtin.c holds formats/chat_builtin.jinja exactly, and a
# model directory's template is what `salafw run` renders.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh

T=$(scratch)
BIN=$BUILD/tests/test_chat
check "python3-jinja2 is installed (scripts/setup.sh)" python3 -c 'import jinja2'

# the C string is the .jinja file
python3 - formats/chat_builtin.jinja formats/chat_builtin.c >"$T/builtin.txt" 2>&1 <<'PY'
import re, sys
want = open(sys.argv[1], encoding="utf-8", newline="").read()
src = open(sys.argv[2], encoding="utf-8").read()
body = src[src.index("kBuiltin[] =") + len("kBuiltin[] ="):src.index(";\n\nconst char")]
got = "".join(bytes(m, "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
              for m in re.findall(r'^\t"(.*)"$', body, re.M))
sys.exit(0 if got == want else 1)
PY
check "formats/chat_builtin.c holds formats/chat_builtin.jinja byte for byte" test $? = 0

# every template: C and Python agree
python3 tests/chat/compare.py "$BIN" "$T" formats/chat_builtin.jinja tests/data/chat/minicpm3_tool.jinja >"$T/compare.txt" 2>&1
rc=$?
while read -r verdict rest; do
	case $verdict in
	PASS) pass "jinja: $rest" ;;
	FAIL) fail "jinja: $rest" ;;
	esac
done <"$T/compare.txt"
grep -A3 '^FAIL' "$T/compare.txt" | head -40
check "compare.py ran every template (exit $rc)" test "$rc" = 0 -a "$(grep -c '^PASS' "$T/compare.txt")" -ge 25

check_report test_chat_template
