#!/usr/bin/env bash
# test_get_cli.sh - get's hf and llama.cpp aliases and messages that name the
# fix, against tests/httpd/faultd.py (which logs each request's
# Authorization header): HF_TOKEN goes as a bearer token to the manifest's hf
# sources only (not to http sources, --mirror ones or across a redirect to
# another host:port) and is never printed; HF_ENDPOINT re-points the
# manifest's hf sources; --include/--exclude globs and --revision; a 404
# manifest names the endpoint; equivocation says how to recover, and the
# recovery works; `manifest` warns before re-signing a version number.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
T=$(scratch)
S=$SALAFW
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; _scratch_cleanup' EXIT
FAULTD="python3 tests/httpd/faultd.py"
REPO=test/hfcli
REV=0123456789abcdef0123456789abcdef01234567
TOKEN=hf_s3cr3tTokenValue42
mkdir -p "$T/src/sub"
head -c 200000 /dev/urandom > "$T/src/w.bin"
head -c 1000 /dev/urandom > "$T/src/sub/b.bin"
echo '{"a": 1}' > "$T/src/config.json"
"$S" keygen --pubkey-out "$T/k.pub" -s "$T/k.key" > "$T/kg.txt"
KID=$(sed -n 's/^key id //p' "$T/kg.txt")
faultd() { faultd_serve "$T/src" 120 "$@"; }
# mkman OUT [faultd manifest args]: a signed manifest for $REPO
mkman() { local o=$1; shift; $FAULTD manifest --dir "$T/src" --repo "${MREPO:-$REPO}" --rev $REV --key-id "$KID" "$@" > "$o" && "$S" sign -s "$T/k.key" "$o" >/dev/null; }
# G ARGS: get with a fresh rollback state
G() { SALAFW_STATE_DIR=$(mktemp -d "$T/st.XXXXXX") timeout 60 "$S" get "$@"; }
auths() { python3 -c 'import json,sys; print(" ".join(sorted(set(str(json.loads(l).get("auth")) for l in open(sys.argv[1])))))' "$1"; }
faultd hf; faultd mir; faultd hfm; faultd far
faultd redir --fault "redirect:http://127.0.0.1:$PORT_far"
H=http://127.0.0.1

# ---- HF_TOKEN ------------------------------------------------------------------
mkman "$T/m1.json" --source "hf:$H:$PORT_hf"
HF_TOKEN=$TOKEN G $REPO@$REV --manifest "$T/m1.json" -P "$T/k.pub" -d "$T/d1" --json > "$T/o1" 2> "$T/e1"
check "hf source: exit 0" test $? = 0
check "hf source: every request carries the bearer token" test "$(auths "$T/hf.log")" = "Bearer $TOKEN"
check "the token is never printed" bash -c "! grep -q '$TOKEN' '$T/o1' '$T/e1'"
HF_TOKEN=$TOKEN G $REPO@$REV --manifest "$T/m1.json" -P "$T/k.pub" -d "$T/d2" --mirror "hf:$H:$PORT_hfm" -q 2>/dev/null
check "a --mirror hf: source: exit 0" test $? = 0
check "... gets no token" test "$(auths "$T/hfm.log")" = "None"
mkman "$T/m3.json" --source "http:$H:$PORT_mir/"
HF_TOKEN=$TOKEN G $REPO --manifest "$T/m3.json" -P "$T/k.pub" -d "$T/d3" -q 2>/dev/null
check "an http source: exit 0; gets no token" test $? = 0 -a "$(auths "$T/mir.log")" = "None"
mkman "$T/m4.json" --source "hf:$H:$PORT_redir"
HF_TOKEN=$TOKEN G $REPO@$REV --manifest "$T/m4.json" -P "$T/k.pub" -d "$T/d4" -q 2>/dev/null
check "hf source redirecting to another port: exit 0" test $? = 0
check "... the token went to the hf source" test "$(auths "$T/redir.log")" = "Bearer $TOKEN"
check "... and not to where it redirected" test "$(auths "$T/far.log")" = "None"
check_err "a token with a control character: usage, not echoed" 2 "HF_TOKEN holds" \
	env HF_TOKEN="$(printf 'ab\ncd')" "$S" get $REPO --manifest "$T/m1.json" -P "$T/k.pub" -d "$T/d5"

# ---- HF_ENDPOINT: the manifest's hf sources go there ------------------------
: > "$T/hf.log"
mkman "$T/m6.json" --source "hf:https://huggingface.co"
HF_ENDPOINT="$H:$PORT_hf/" HF_TOKEN=$TOKEN G $REPO@$REV --manifest "$T/m6.json" -P "$T/k.pub" -d "$T/d6" -q 2>/dev/null
check "HF_ENDPOINT re-points hf:https://huggingface.co (no network used): exit 0" test $? = 0
check "... requests in the hf layout at HF_ENDPOINT" grep -q "\"path\": \"w.bin\"" "$T/hf.log"
check "... with the token" test "$(auths "$T/hf.log")" = "Bearer $TOKEN"
check_err "HF_ENDPOINT must be a URL" 2 "HF_ENDPOINT" env HF_ENDPOINT=ftp://x "$S" get $REPO --manifest "$T/m6.json" -d "$T/d7"

# ---- --include / --exclude / --revision / --local-dir ---------------------
G $REPO --manifest "$T/m3.json" -P "$T/k.pub" --local-dir "$T/d8" --include '*.json' --json > "$T/o8" 2>/dev/null
check "--include '*.json': exit 0" test $? = 0
check "... config.json fetched, nothing else" bash -c "test -f '$T/d8/config.json' -a ! -e '$T/d8/w.bin' -a ! -e '$T/d8/sub/b.bin'"
check "... summary counts the selected file" grep -q '"files":1,' "$T/o8"
check_err "... and verify says the rest is missing (not verified)" 1 "missing" "$S" verify "$T/d8" -P "$T/k.pub"
G $REPO --manifest "$T/m3.json" -P "$T/k.pub" -d "$T/d9" --exclude 'sub/*' -q 2>/dev/null
check "--exclude 'sub/*': the others only" bash -c "test -f '$T/d9/w.bin' -a -f '$T/d9/config.json' -a ! -e '$T/d9/sub/b.bin'"
G $REPO --manifest "$T/m3.json" -P "$T/k.pub" -d "$T/d10" --include 'sub*' -q 2>/dev/null
check "--include 'sub*': '*' matches '/' as in the hf CLI" bash -c "test -f '$T/d10/sub/b.bin' -a ! -e '$T/d10/w.bin'"
check "--revision binds like REPO@REV" G $REPO --revision $REV --manifest "$T/m3.json" -P "$T/k.pub" -d "$T/d11" -q
check_err "--revision of another commit: rejected (binding)" 3 "revision" \
	G $REPO --revision 1111111111111111111111111111111111111111 --manifest "$T/m3.json" -P "$T/k.pub" -d "$T/d12"

# a name with glob and shell characters: --include of the name itself selects
# it, and a refusal names the get that re-fetches it, quoted, ready to paste
mkdir -p "$T/src3"; head -c 5000 /dev/urandom > "$T/src3/x[1] y.bin"; echo '{}' > "$T/src3/config.json"
faultd_serve "$T/src3" 120 g3
$FAULTD manifest --dir "$T/src3" --repo test/glob --rev $REV --key-id "$KID" --source "http:$H:$PORT_g3/" > "$T/g3.json"
"$S" sign -s "$T/k.key" "$T/g3.json" >/dev/null
G test/glob --manifest "$T/g3.json" -P "$T/k.pub" -d "$T/d14" --include 'x[1] y.bin' -q 2>/dev/null
check "--include 'x[1] y.bin' (the name itself) selects that file" bash -c "cmp -s '$T/d14/x[1] y.bin' '$T/src3/x[1] y.bin' && test ! -e '$T/d14/config.json'"
G test/glob --manifest "$T/g3.json" -P "$T/k.pub" -d "$T/d14" -q 2>/dev/null
rm "$T/d14/x[1] y.bin"; : > "$T/g3.log"
SALAFW_STATE_DIR=$T/stg "$S" run "$T/d14" -P "$T/k.pub" -p x -n 1 >/dev/null 2>"$T/e14"
fix=$(sed -n 's/.*refusing to run unverified weights; fix: salafw //p' "$T/e14")
check "a missing 'x[1] y.bin': the hint quotes it" grep -qF -- "--include 'x[1] y.bin' --pubkey" "$T/e14"
eval "G ${fix#get } --manifest '$T/g3.json' -q" 2>/dev/null
check "... and the get it names, pasted, fetches that file back" cmp -s "$T/d14/x[1] y.bin" "$T/src3/x[1] y.bin"
check "... asking for it only" test "$(python3 -c 'import json,sys; print(" ".join(sorted(set(json.loads(l)["path"] for l in open(sys.argv[1])))))' "$T/g3.log")" = "x[1] y.bin"

# ---- a 404 manifest names the endpoint -----------------------------------------
check_err "404 manifest: exit 4, the repository is not on that endpoint" 4 \
	"repository 'test/absent' is not on '$H:$PORT_mir'" G test/absent --endpoint "$H:$PORT_mir" -P "$T/k.pub" -d "$T/d13"
check "... not reported as a network failure" bash -c "! G test/absent --endpoint '$H:$PORT_mir' -P '$T/k.pub' -d '$T/d13' 2>&1 | grep -qi 'network'"

# ---- equivocation: what happened, and the way out works -----------------------
export SALAFW_STATE_DIR=$T/eqstate
MREPO=test/eq mkman "$T/e1.json" --source "http:$H:$PORT_mir/"
"$S" get test/eq --manifest "$T/e1.json" -P "$T/k.pub" -d "$T/eqd1" 2> "$T/eq1.err" || fail "equivocation: first get: $(cat "$T/eq1.err")"
sleep 1.1 # another created time: other bytes, same manifest_version
MREPO=test/eq mkman "$T/e2.json" --source "http:$H:$PORT_mir/"
"$S" get test/eq --manifest "$T/e2.json" -P "$T/k.pub" -d "$T/eqd2" -q 2> "$T/eq.err"; rc=$?
[ $rc = 3 ] && grep -q "equivocation: test/eq manifest_version 1 was seen before with other bytes" "$T/eq.err" &&
	pass "equivocation: exit 3, says what happened" || fail "equivocation: exit $rc $(cat "$T/eq.err")"
st=$(sed -n "s/.*or remove '\([^']*\)' to accept it.*/\1/p" "$T/eq.err")
check "... names the record to remove, which exists" test -n "$st" -a -f "$st"
rm -f "$st"
check "... and after removing it the get goes through" "$S" get test/eq --manifest "$T/e2.json" -P "$T/k.pub" -d "$T/eqd2" -q
unset SALAFW_STATE_DIR
[ -n "${KEEP:-}" ] && echo "$T"

# ---- manifest warns before re-signing a version number --------------------------
"$S" manifest "$T/src" --repo $REPO --revision $REV -o "$T/r.json" 2> "$T/r1.err"
check "first manifest: no warning" test ! -s "$T/r1.err"
sleep 1.1
"$S" manifest "$T/src" --repo $REPO --revision $REV -o "$T/r.json" 2> "$T/r2.err"
check "same version again: warns, naming the fix" grep -q "already holds manifest_version 1 of $REPO.*pass --manifest-version 2" "$T/r2.err"
"$S" manifest "$T/src" --repo $REPO --revision $REV --manifest-version 2 -o "$T/r.json" 2> "$T/r3.err"
check "a higher version: no warning" test ! -s "$T/r3.err"
mkdir -p "$T/src/.salafw" && cp "$T/r.json" "$T/src/.salafw/manifest.json"; sleep 1.1
"$S" manifest "$T/src" --repo $REPO --revision $REV --manifest-version 2 > /dev/null 2> "$T/r4.err"
check "DIR's own manifest of that version: warns" grep -q "$T/src/.salafw/manifest.json' already holds manifest_version 2" "$T/r4.err"
# ---- the terminal display fits the terminal (a pty of 60 columns) ------------
LONG="a-very-long-shard-name-that-would-wrap-an-80-column-terminal-model-00001-of-00002.safetensors"
mkdir -p "$T/src2"; head -c 700000 /dev/urandom > "$T/src2/$LONG"; head -c 700000 /dev/urandom > "$T/src2/short.bin"
$FAULTD serve --root "$T/src2" --port-file "$T/slow.port" --rate 300000 --lifetime 60 & PIDS+=($!)
for _ in $(seq 100); do [ -s "$T/slow.port" ] && break; sleep 0.05; done
$FAULTD manifest --dir "$T/src2" --repo test/tty --rev $REV --key-id "$KID" --source "http:$H:$(cat "$T/slow.port")/" > "$T/tty.json"
"$S" sign -s "$T/k.key" "$T/tty.json" >/dev/null
SALAFW_STATE_DIR=$T/sttty script -qec "stty cols 60 rows 40; '$S' get test/tty --manifest '$T/tty.json' -P '$T/k.pub' -d '$T/tty' -x 1" "$T/tty.log" >/dev/null 2>&1
check "get on a pty: exit 0" cmp -s "$T/tty/$LONG" "$T/src2/$LONG"
python3 - "$T/tty.log" > "$T/tty.txt" <<'PY'
import re, sys, unicodedata
raw = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
rows = [l for l in re.split(r"\r\n|\n|\r", raw)]
cols = lambda s: sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)
live = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", l) for l in rows]
print("rows", sum(1 for l in live if "%" in l))
print("widest", max(cols(l) for l in live if "%" in l) if live else 0)
print("ellipsis", sum(1 for l in live if "\u2026" in l and "%" in l))
PY
check "the live block was drawn" test "$(sed -n 's/^rows //p' "$T/tty.txt")" -ge 2
check "every row fits 59 of 60 columns ($(sed -n 's/^widest //p' "$T/tty.txt"))" test "$(sed -n 's/^widest //p' "$T/tty.txt")" -le 59
check "the long name is cut with an ellipsis" test "$(sed -n 's/^ellipsis //p' "$T/tty.txt")" -ge 1
# replay the session in a terminal emulator (pyte, 60 columns): after each
# redraw at most one row per file plus the total is on screen (stale rows
# would pile up), and none is left when get is done
PY=; for p in /usr/bin/python3 python3; do "$p" -c 'import pyte' 2>/dev/null && { PY=$p; break; }; done
if [ -z "$PY" ]; then fail "python3-pyte missing (scripts/setup.sh installs it)"; else
"$PY" - "$T/tty.log" > "$T/pyte.txt" <<'PY'
import sys, pyte
data = open(sys.argv[1], "rb").read()
screen = pyte.Screen(60, 40)
stream = pyte.ByteStream(screen)
worst = 0
pieces = data.split(b"\x1b[J")
for i, piece in enumerate(pieces):
    stream.feed(piece)  # a redraw, up to the next clear
    rows = [l for l in screen.display if "%" in l or l.startswith("total ")]
    worst = max(worst, len(rows))
    if i + 1 < len(pieces):
        stream.feed(b"\x1b[J")
left = [l for l in screen.display if "%" in l or l.startswith("total ")]
print("worst", worst)
print("left", len(left))
PY
check "emulated 60-column terminal: at most 3 progress rows at any time ($(sed -n 's/^worst //p' "$T/pyte.txt"))" \
	test "$(sed -n 's/^worst //p' "$T/pyte.txt")" -le 3 -a "$(sed -n 's/^worst //p' "$T/pyte.txt")" -ge 1
check "... and none left at the end" test "$(sed -n 's/^left //p' "$T/pyte.txt")" = 0
fi
check_report test_get_cli
