#!/usr/bin/env bash
# test_get.sh - `salafw get` end to end against real loopback servers that
# this test starts and stops itself: nginx (tests/nginx/, both layouts, real
# Range, a redirect to a second port) and tests/httpd/faultd.py (dropped
# connections, stalls, 503 + Retry-After, 404/500, ignored Range, wrong
# Content-Range, corrupt bytes, overlong bodies, redirect loops). Every
# server and every get is bounded in time. Manifests are signed with the real
# minisign CLI. Assertions compare against sha256sum, the servers' own logs,
# and the bytes on disk, not just exit codes.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
T=$(scratch)
export SALAFW_STATE_DIR=$T/state
FAULTD="python3 tests/httpd/faultd.py"
REPO=test/tiny
REV=0123456789abcdef0123456789abcdef01234567
# Each get gets a fresh rollback-state dir: the fixtures sign many manifests
# with the same version, which the ratchet would (rightly) call equivocation.
G() { SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") timeout 60 "$SALAFW" get "$@"; }

# ---- fixture: a small model tree, a key, nginx ------------------------------
mkdir -p "$T/model/sub" "$T/man/manifests/test"
head -c 3000000 /dev/urandom > "$T/model/a.bin"
head -c 1048577 /dev/urandom > "$T/model/sub/b.bin"
: > "$T/model/empty.txt"
echo '{"hidden_size": 8}' > "$T/model/config.json"
echo 'spaces and % signs' > "$T/model/name with space%.txt"
(cd "$T/model" && find . -type f | sed 's|^\./||' | sort | while read -r f; do sha256sum "$f"; done) > "$T/SHA256SUMS"
minisign -G -W -p "$T/k.pub" -s "$T/k.key" -f >/dev/null 2>&1 || { echo "FAIL minisign -G"; exit 1; }
KEYID=$(python3 -c '
import base64,sys
b=base64.b64decode(open(sys.argv[1]).read().splitlines()[1])
print("%016X" % int.from_bytes(b[2:10],"little"))' "$T/k.pub")
TOTAL=$(( 3000000 + 1048577 + 0 + $(stat -c %s "$T/model/config.json") + $(stat -c %s "$T/model/name with space%.txt") ))

read -r P1 P2 < <(bash tests/nginx/start.sh "$T/nginx" "$T/model" "$T/man" "$REV" 180) ||
	{ echo "FAIL nginx did not start"; exit 1; }
PIDS+=("$(cat "$T/nginx/run.pid")")
NG=http://127.0.0.1:$P1

# mkman OUT [faultd manifest args...]: write OUT and sign it (OUT.minisig);
# the files listed are those under $MKDIR (default $T/model)
mkman() {
	local out=$1 repo=$REPO rev=$REV ver=1; shift
	$FAULTD manifest --dir "${MKDIR:-$T/model}" --repo "$repo" --rev "$rev" --key-id "$KEYID" "$@" > "$out" || return 1
	ver=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifest_version"])' "$out")
	rm -f "$out.minisig"
	minisign -S -s "$T/k.key" -m "$out" -x "$out.minisig" \
		-t "salafw-manifest repo_id=$repo revision=$rev manifest_version=$ver" >/dev/null 2>&1
}

# faultd NAME ARGS...: start a fault server; sets PORT_NAME, logs to $T/NAME.log
faultd() { faultd_serve "$T/model" 90 "$@"; }

summary() { json_summary "$@"; }
# ptag PATH: the path part of a partial's name (FNV-1a 64, computed here
# independently of the C code)
ptag() { python3 -c '
import sys
h=14695981039346656037
for b in sys.argv[1].encode(): h=((h^b)*1099511628211)%2**64
print("%016x"%h)' "$1"; }
A_SHA=$(sha256sum "$T/model/a.bin" | cut -c1-64)
# events FILE KIND: how many events of KIND
events() { grep -c "\"event\":\"$2\"" "$1" 2>/dev/null || true; }
# logsum LOG: bytes a faultd sent in total
logsum() { python3 -c 'import json,sys; print(sum(json.loads(l)["sent"] for l in open(sys.argv[1])))' "$1"; }
# After a --size-override: total_size made consistent again, signed anew
# (the publisher's mistake, signed: what get must survive)
retotal_resign() {
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["total_size"]=sum(f["size"] for f in d["files"]); open(sys.argv[1],"w").write(json.dumps(d,indent=1)+"\n")' "$1"
	rm -f "$1.minisig"
	minisign -S -s "$T/k.key" -m "$1" -x "$1.minisig" \
		-t "salafw-manifest repo_id=$REPO revision=$REV manifest_version=1" >/dev/null 2>&1
}
# XOR one byte (always a change, unlike writing a fixed one)
flip_byte() {
	python3 -c 'import sys; p, o = sys.argv[1], int(sys.argv[2]); f = open(p, "r+b"); f.seek(o); b = f.read(1)[0]; f.seek(o); f.write(bytes([b ^ 0xff]))' "$1" "$2"
}
tree_ok() { (cd "$1" && sha256sum --quiet -c "$T/SHA256SUMS") >/dev/null 2>&1; }
verify_ok() { "$SALAFW" verify -P "$T/k.pub" "$1" >/dev/null 2>&1; }
# ... with a fresh rollback state, for DESTs holding another manifest of version 1
verify_fresh() { SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") "$SALAFW" verify -P "$T/k.pub" "$1" >/dev/null 2>&1; }
nodest() { [ ! -e "$1" ]; }

mkman "$T/man/manifests/test/tiny.json" --source "http:$NG/plain/"
cp "$T/man/manifests/test/tiny.json" "$T/plain.json"; cp "$T/man/manifests/test/tiny.json.minisig" "$T/plain.json.minisig"

# ---- 1. service layout, nginx, plain base_url -------------------------------
D=$T/d1
SALAFW_STATE_DIR=$T/state1 timeout 60 "$SALAFW" get "$REPO@$REV" --endpoint "$NG" -P "$T/k.pub" -d "$D" --json > "$T/o1" 2> "$T/e1"
check_exit "service layout: get exits 0" 0 test "$(summary "$T/o1" exit)" = 0
check "service layout: tree matches sha256sum -c" tree_ok "$D"
check "service layout: salafw verify DEST passes (offline)" verify_ok "$D"
check "manifest kept byte for byte" cmp -s "$D/.salafw/manifest.json" "$T/plain.json"
check "signature kept byte for byte" cmp -s "$D/.salafw/manifest.json.minisig" "$T/plain.json.minisig"
check "state recorded" test -s "$D/.salafw/state.json"
check "rollback ratchet committed after success" test -n "$(ls "$T/state1/trusted/" 2>/dev/null)"
check "no partials left" nodest "$D/.salafw/partial"
check "received exactly the model's bytes" test "$(summary "$T/o1" received)" = "$TOTAL"
check "empty file created" test -f "$D/empty.txt" -a ! -s "$D/empty.txt"
# SALAFW_ENDPOINT works too
SALAFW_ENDPOINT=$NG G "$REPO" -P "$T/k.pub" -d "$T/d1b" -q > /dev/null 2>&1
check "SALAFW_ENDPOINT picks the service" tree_ok "$T/d1b"

# ---- 2. rerun: everything present and verified is skipped --------------------
G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$D" --json > "$T/o2" 2>/dev/null
check "rerun: exit 0" test "$(summary "$T/o2" exit)" = 0
check "rerun: nothing downloaded" test "$(summary "$T/o2" received)" = 0
check "rerun: all 5 skipped" test "$(summary "$T/o2" skipped)" = 5
# a corrupted local file is detected and replaced
flip_byte "$D/a.bin" 1000
G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$D" --json > "$T/o2b" 2>/dev/null
check "corrupted local file re-fetched" tree_ok "$D"
check "only that file re-fetched" test "$(summary "$T/o2b" received)" = 3000000

# ---- 3. HF layout through a redirect to another port, several segments -------
mkman "$T/hf.json"   # no sources in the manifest: the mirror supplies them
: > "$T/nginx/access.log"
G "$REPO@$REV" --manifest "$T/hf.json" -P "$T/k.pub" -d "$T/d3" --mirror "hf:$NG/hfredir" \
	-x 4 --segment-size 262144 --json > "$T/o3" 2> "$T/e3"
check "hf via redirect: exit 0" test "$(summary "$T/o3" exit)" = 0
check "hf via redirect: tree verifies" tree_ok "$T/d3"
check "hf: requests redirected (302 on port 1)" grep -q "^$P1 302 \"GET /hfredir/test/tiny/resolve/$REV/" "$T/nginx/access.log"
check "hf: bytes served by port 2" grep -q "^$P2 206 \"GET /test/tiny/resolve/$REV/a.bin" "$T/nginx/access.log"
n206=$(grep -c "^$P2 206 \"GET /test/tiny/resolve/$REV/a.bin" "$T/nginx/access.log")
check "a.bin fetched in >= 4 ranged segments ($n206)" test "$n206" -ge 4
check "percent-encoded names fetched" grep -q "name%20with%20space%25.txt" "$T/nginx/access.log"

# ---- 4. --mirror goes first, --mirror-last after the manifest's --------------
faultd f4 --fault 404
G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d4" --mirror-last "http:http://127.0.0.1:$PORT_f4/" -q >/dev/null 2>&1
check "--mirror-last: never asked when the manifest source works" test ! -s "$T/f4.log"
G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d4b" --mirror "http:http://127.0.0.1:$PORT_f4/" \
	--json > "$T/o4" 2>/dev/null
check "--mirror: asked first (404 logged)" grep -q '"status": 404' "$T/f4.log"
check "404 on one mirror: next source completes the tree" tree_ok "$T/d4b"
check "404: source_failed events" test "$(events "$T/o4" source_failed)" -ge 1
check "404 x3: the failing mirror is demoted" test "$(events "$T/o4" source_demoted)" = 1
n404=$(grep -c '"status": 404' "$T/f4.log")
check "demoted mirror asked at most demote_after(3) + in-flight times ($n404)" test "$n404" -le 5

# ---- 5. 500 on one mirror, retried then abandoned ------------------------------
faultd f5 --fault 500
mkman "$T/m5.json" --source "http:http://127.0.0.1:$PORT_f5/" --source "http:$NG/plain/"
G "$REPO" --manifest "$T/m5.json" -P "$T/k.pub" -d "$T/d5" --retries 1 --retry-wait 10 -j 1 --json > "$T/o5" 2>/dev/null
check "500: next source completes the tree" tree_ok "$T/d5"
check "500: retried before moving on" test "$(events "$T/o5" retry)" -ge 1

# ---- 6. dropped connection: resumed with Range, no byte fetched twice ---------
faultd f6 --fault drop:1000000 --times 1 --only a.bin
mkman "$T/m6.json" --source "http:http://127.0.0.1:$PORT_f6/"
G "$REPO" --manifest "$T/m6.json" -P "$T/k.pub" -d "$T/d6" -x 1 --retry-wait 10 --json > "$T/o6" 2>/dev/null
check "drop: tree verifies" tree_ok "$T/d6"
check "drop: resumed with Range: bytes=1000000-" grep -q '"range": "bytes=1000000-' "$T/f6.log"
check "drop: bytes received == model size (nothing twice)" test "$(summary "$T/o6" received)" = "$TOTAL"

# ---- 7. stall: low-speed timeout, then resume -----------------------------------
faultd f7 --fault stall:500000 --times 1 --only a.bin
mkman "$T/m7.json" --source "http:http://127.0.0.1:$PORT_f7/"
s=$(date +%s)
G "$REPO" --manifest "$T/m7.json" -P "$T/k.pub" -d "$T/d7" -x 1 --stall-timeout 1 --retry-wait 10 --json > "$T/o7" 2>/dev/null
el=$(( $(date +%s) - s ))
check "stall: tree verifies" tree_ok "$T/d7"
check "stall: detected within a few seconds (${el}s)" test "$el" -le 10
check "stall: resumed at 500000" grep -q '"range": "bytes=500000-' "$T/f7.log"
check "stall: received == model size" test "$(summary "$T/o7" received)" = "$TOTAL"

# ---- 8. 503 + Retry-After is honoured ---------------------------------------------
faultd f8 --fault 503:2 --times 1 --only a.bin
mkman "$T/m8.json" --source "http:http://127.0.0.1:$PORT_f8/"
G "$REPO" --manifest "$T/m8.json" -P "$T/k.pub" -d "$T/d8" -x 1 --retry-wait 10 --json > "$T/o8" 2>/dev/null
check "503: tree verifies" tree_ok "$T/d8"
delay=$(python3 -c '
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if d.get("event")=="retry": print(d["delay_ms"]); break' "$T/o8")
check "503: Retry-After 2 s honoured although --retry-wait is 10 ms (delay ${delay:-none} ms)" test "${delay:-0}" -ge 2000

# ---- 9. corrupt bytes: discarded, never kept; the next source repairs ------------
faultd f9 --fault corrupt:123456 --only a.bin
mkman "$T/m9.json" --source "http:http://127.0.0.1:$PORT_f9/" --source "http:$NG/plain/"
G "$REPO" --manifest "$T/m9.json" -P "$T/k.pub" -d "$T/d9" --json > "$T/o9" 2>/dev/null
check "corrupt: tree verifies via the next source" tree_ok "$T/d9"
check "corrupt: mismatch reported" test "$(events "$T/o9" hash_mismatch)" -ge 1
check "corrupt: bytes discarded" test "$(summary "$T/o9" discarded)" -ge 3000000
mkman "$T/m9b.json" --source "http:http://127.0.0.1:$PORT_f9/"
G "$REPO" --manifest "$T/m9b.json" -P "$T/k.pub" -d "$T/d9b" --json > "$T/o9b" 2>/dev/null
check "corrupt only source: exit 1 (verification failed)" test "$(summary "$T/o9b" exit)" = 1
check "corrupt only source: a.bin never appears" nodest "$T/d9b/a.bin"
check "corrupt only source: other files still verified" cmp -s "$T/d9b/sub/b.bin" "$T/model/sub/b.bin"
left=$(find "$T/d9b/.salafw/partial" -name '*.part' -size +0c 2>/dev/null | wc -l)
check "corrupt only source: no corrupt partial kept ($left)" test "$left" = 0

# ---- 10. Range ignored (200): the file restarts from 0, nothing appended -------
faultd f10a --fault drop:700000 --times 1 --only a.bin
mkman "$T/m10a.json" --source "http:http://127.0.0.1:$PORT_f10a/"
G "$REPO" --manifest "$T/m10a.json" -P "$T/k.pub" -d "$T/d10" -x 1 --retries 0 -q >/dev/null 2>&1
check_exit "partial left by a failed run" 0 test -s "$T/d10/.salafw/partial/$A_SHA-$(ptag a.bin).json"
faultd f10 --fault norange
mkman "$T/m10.json" --source "http:http://127.0.0.1:$PORT_f10/"
G "$REPO" --manifest "$T/m10.json" -P "$T/k.pub" -d "$T/d10" -x 1 --json > "$T/o10" 2>/dev/null
check "norange: tree verifies" tree_ok "$T/d10"
check "norange: restart reported" grep -q 'ignored Range' "$T/o10"

# ---- 11. wrong Content-Range: that source is abandoned ---------------------------
faultd f11 --fault badrange
mkman "$T/m11.json" --source "http:http://127.0.0.1:$PORT_f11/" --source "http:$NG/plain/"
G "$REPO" --manifest "$T/m11.json" -P "$T/k.pub" -d "$T/d11" -x 4 --segment-size 262144 --json > "$T/o11" 2>/dev/null
check "badrange: tree verifies" tree_ok "$T/d11"
check "badrange: source failed for the range mismatch" grep -q 'does not match the requested range' "$T/o11"

# ---- 12. body longer than the manifest size ---------------------------------------
faultd f12 --fault long:5000 --only a.bin
mkman "$T/m12.json" --source "http:http://127.0.0.1:$PORT_f12/"
G "$REPO" --manifest "$T/m12.json" -P "$T/k.pub" -d "$T/d12" -x 1 --json > "$T/o12" 2>/dev/null
check "long (Content-Length): refused, exit 4" test "$(summary "$T/o12" exit)" = 4
check "long: a.bin never appears" nodest "$T/d12/a.bin"
faultd f12b --fault longclose:5000 --only a.bin
mkman "$T/m12b.json" --source "http:http://127.0.0.1:$PORT_f12b/"
G "$REPO" --manifest "$T/m12b.json" -P "$T/k.pub" -d "$T/d12b" -x 1 --json > "$T/o12b" 2>/dev/null
check "longclose: the first SIZE bytes verify" tree_ok "$T/d12b"
check "longclose: file never longer than the manifest size" test "$(stat -c %s "$T/d12b/a.bin" 2>/dev/null)" = 3000000
check "longclose: overlong body reported" grep -q 'body longer than requested' "$T/o12b"

# ---- 13. redirect loop; plain redirect to another port ------------------------------
faultd f13 --fault redirloop
mkman "$T/m13.json" --source "http:http://127.0.0.1:$PORT_f13/" --source "http:$NG/redir/"
G "$REPO" --manifest "$T/m13.json" -P "$T/k.pub" -d "$T/d13" --json > "$T/o13" 2>/dev/null
check "redirect loop: abandoned, redirect mirror completes" tree_ok "$T/d13"
check "redirect loop: reported" grep -qi 'redirect' "$T/o13"

# ---- 14. X-Repo-Commit from an hf source must match the revision ---------------------
faultd f14 --commit ffffffffffffffffffffffffffffffffffffffff
mkman "$T/m14.json" --source "hf:http://127.0.0.1:$PORT_f14" --source "hf:$NG"
G "$REPO" --manifest "$T/m14.json" -P "$T/k.pub" -d "$T/d14" --json > "$T/o14" 2>/dev/null
check "X-Repo-Commit mismatch: next source completes" tree_ok "$T/d14"
check "X-Repo-Commit mismatch: reported" grep -q 'X-Repo-Commit differs' "$T/o14"

# ---- 15. SIGKILL midway, then resume without re-fetching the journalled prefix ------
faultd f15 --rate 1000000 --only a.bin
mkman "$T/m15.json" --source "http:http://127.0.0.1:$PORT_f15/"
SALAFW_STATE_DIR=$T/state15 "$SALAFW" get "$REPO" --manifest "$T/m15.json" -P "$T/k.pub" -d "$T/d15" -x 1 -j 1 --sync-interval 1 -q > /dev/null 2>&1 &
gp=$!
sleep 2.5
kill -9 "$gp" 2>/dev/null; wait "$gp" 2>/dev/null
J=$T/d15/.salafw/partial/$A_SHA-$(ptag a.bin).json
kept=$(python3 -c '
import json,sys
d=json.load(open(sys.argv[1])); r=d["done"]
print(r[0][1] if r and r[0][0]==0 else 0)' "$J" 2>/dev/null || echo 0)
check "SIGKILL: journal records a verified-to-be-written prefix ($kept bytes)" test "$kept" -gt 500000
check "SIGKILL: a.bin not in place yet" nodest "$T/d15/a.bin"
faultd f15b
mkman "$T/m15b.json" --source "http:http://127.0.0.1:$PORT_f15b/"
G "$REPO" --manifest "$T/m15b.json" -P "$T/k.pub" -d "$T/d15" -x 1 --json > "$T/o15" 2>/dev/null
check "after SIGKILL: tree verifies" tree_ok "$T/d15"
first=$(python3 -c '
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if d["path"]=="a.bin": print((d["range"] or "bytes=0-")[6:].split("-")[0]); break' "$T/f15b.log")
check "after SIGKILL: a.bin resumed at >= the journalled prefix ($first >= $kept)" test "${first:-0}" -ge "$kept"
a_sent=$(python3 -c '
import json,sys
print(sum(json.loads(l)["sent"] for l in open(sys.argv[1]) if json.loads(l)["path"]=="a.bin"))' "$T/f15b.log")
check "after SIGKILL: a.bin bytes re-sent ($a_sent) <= size - prefix ($((3000000 - kept)))" test "$a_sent" -le $((3000000 - kept))
check "after SIGKILL: resumed bytes reported" test "$(summary "$T/o15" resumed)" -ge "$kept"

# ---- 16. SIGINT: clean stop, resumable --------------------------------------------
faultd f16 --rate 1000000 --only a.bin
mkman "$T/m16.json" --source "http:http://127.0.0.1:$PORT_f16/"
SALAFW_STATE_DIR=$T/state16 "$SALAFW" get "$REPO" --manifest "$T/m16.json" -P "$T/k.pub" -d "$T/d16" -x 1 -j 1 --sync-interval 1 -q > /dev/null 2> "$T/e16" &
gp=$!
sleep 1.5
kill -INT "$gp"; wait "$gp"; rc=$?
check "SIGINT: exit 130 (interrupted, README)" test "$rc" = 130
check "SIGINT: says how to resume" grep -q 'resume' "$T/e16"
kept=$(python3 -c '
import json,sys
r=json.load(open(sys.argv[1]))["done"]; print(r[0][1] if r and r[0][0]==0 else 0)' "$T/d16/.salafw/partial/$A_SHA-$(ptag a.bin).json" 2>/dev/null || echo 0)
check "SIGINT: journal flushed on exit ($kept bytes)" test "$kept" -gt 500000
G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d16" -x 1 --json > "$T/o16" 2>/dev/null
check "after SIGINT: tree verifies" tree_ok "$T/d16"
rcv=$(summary "$T/o16" received)
check "after SIGINT: received ($rcv) <= total - kept ($((TOTAL - kept)))" test "$rcv" -le $((TOTAL - kept))

# ---- 17. tampered manifest / signature / binding: nothing written -----------------
cp "$T/plain.json" "$T/bad.json"; cp "$T/plain.json.minisig" "$T/bad.json.minisig"
sed -i 's/"manifest_version": 1/"manifest_version": 2/' "$T/bad.json"
check_err "tampered manifest: exit 3" 3 '.' G "$REPO" --manifest "$T/bad.json" -P "$T/k.pub" -d "$T/d17"
check "tampered manifest: DEST never created" nodest "$T/d17"
cp "$T/plain.json" "$T/bad2.json"; cp "$T/plain.json.minisig" "$T/bad2.json.minisig"
python3 - "$T/bad2.json.minisig" <<'EOF'
import sys
p=sys.argv[1]; l=open(p).read().split("\n")
l[3]=("A" if l[3][0]!="A" else "B")+l[3][1:]
open(p,"w").write("\n".join(l))
EOF
check_err "tampered signature: exit 3" 3 '.' G "$REPO" --manifest "$T/bad2.json" -P "$T/k.pub" -d "$T/d17"
check "tampered signature: DEST never created" nodest "$T/d17"
check_err "wrong repo binding: exit 3" 3 'repo' G other/model --manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d17"
check_err "wrong revision binding: exit 3" 3 'revision' G "$REPO@ffffffffffffffffffffffffffffffffffffffff" \
	--manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d17"
minisign -G -W -p "$T/o.pub" -s "$T/o.key" -f >/dev/null 2>&1
check_err "another key: exit 3" 3 '.' G "$REPO" --manifest "$T/plain.json" -P "$T/o.pub" -d "$T/d17"
check "bad trust: DEST never created" nodest "$T/d17"
check "bad trust: server never asked for files" test -z "$(grep -l 'a.bin' "$T/nginx/access.log" 2>/dev/null | head -0)"

# ---- 18. path traversal and symlinks never write outside DEST -----------------------
mkdir -p "$T/jail"
mkman "$T/trav.json" --source "http:$NG/plain/" --path-override "config.json=../escaped.json"
check_err "traversal '../': exit 3" 3 '.' G "$REPO" --manifest "$T/trav.json" -P "$T/k.pub" -d "$T/jail/dest"
mkman "$T/trav2.json" --source "http:$NG/plain/" --path-override "config.json=/tmp/abs.json"
check_err "absolute path: exit 3" 3 '.' G "$REPO" --manifest "$T/trav2.json" -P "$T/k.pub" -d "$T/jail/dest"
check "traversal: nothing written (no DEST, no escapee)" test -z "$(ls -A "$T/jail")" -a ! -e "$T/escaped.json"
mkdir -p "$T/d18" "$T/outside"
ln -s "$T/outside" "$T/d18/sub"
G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d18" -q >/dev/null 2>&1
check "symlinked folder in DEST: nothing written through it" test -z "$(ls -A "$T/outside")"
check "symlinked folder: still a symlink" test -L "$T/d18/sub"

# ---- 19. free-space check refuses before any request ------------------------------
faultd f19
mkman "$T/m19.json" --source "http:http://127.0.0.1:$PORT_f19/" --size-override "a.bin=1125899906842624"
retotal_resign "$T/m19.json"
check_err "1 PiB manifest: refused for space, exit 5" 5 'free space' G "$REPO" --manifest "$T/m19.json" -P "$T/k.pub" -d "$T/d19"
check "space refusal: no request made" test ! -s "$T/f19.log"

# ---- 20. a second get into a locked DEST is refused --------------------------------
mkdir -p "$T/d20/.salafw"
: > "$T/d20/.salafw/lock"
flock -o "$T/d20/.salafw/lock" sleep 5 &
lp=$!; PIDS+=("$lp")
for _ in $(seq 100); do flock -n "$T/d20/.salafw/lock" true 2>/dev/null || break; sleep 0.05; done # held now
check_err "locked DEST: exit 5 naming the lock" 5 'another' G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d20"
kill "$lp" 2>/dev/null; wait "$lp" 2>/dev/null

# ---- 21. equal content at two paths: each gets its own partial and lock -----------
mkdir -p "$T/model2/sub"
head -c 1500000 /dev/urandom > "$T/model2/dup1.bin"
cp "$T/model2/dup1.bin" "$T/model2/sub/dup2.bin"
: > "$T/model2/e1.txt"
: > "$T/model2/sub/e2.txt"
(cd "$T/model2" && find . -type f | sed 's|^\./||' | sort | while read -r f; do sha256sum "$f"; done) > "$T/SUMS2"
tree2_ok() { (cd "$1" && sha256sum --quiet -c "$T/SUMS2") >/dev/null 2>&1; }
DUP_SHA=$(sha256sum "$T/model2/dup1.bin" | cut -c1-64)
faultd f22 --root "$T/model2"
MKDIR=$T/model2 mkman "$T/m22.json" --source "http:http://127.0.0.1:$PORT_f22/"
G "$REPO" --manifest "$T/m22.json" -P "$T/k.pub" -d "$T/d22" --json > "$T/o22" 2>/dev/null
check "equal files: exit 0" test "$(summary "$T/o22" exit)" = 0
check "equal files: all 4 downloaded" test "$(summary "$T/o22" downloaded)" = 4
check "equal files: tree matches sha256sum -c" tree2_ok "$T/d22"
check "equal files: salafw verify DEST passes" verify_fresh "$T/d22"
check "two empty files created" test -f "$T/d22/e1.txt" -a ! -s "$T/d22/e1.txt" -a -f "$T/d22/sub/e2.txt" -a ! -s "$T/d22/sub/e2.txt"
# one twin lands, the other fails midway; the rerun skips the first and must
# resume (not delete) the second's partial
faultd f22b --root "$T/model2" --fault drop:700000 --times 1 --only sub/dup2.bin
MKDIR=$T/model2 mkman "$T/m22b.json" --source "http:http://127.0.0.1:$PORT_f22b/"
G "$REPO" --manifest "$T/m22b.json" -P "$T/k.pub" -d "$T/d22b" -x 1 --retries 0 -q >/dev/null 2>&1
check "twin: dup1.bin verified in the failed run" cmp -s "$T/d22b/dup1.bin" "$T/model2/dup1.bin"
check "twin: sub/dup2.bin partial named by sha256 + path hash" test -s "$T/d22b/.salafw/partial/$DUP_SHA-$(ptag sub/dup2.bin).json"
G "$REPO" --manifest "$T/m22b.json" -P "$T/k.pub" -d "$T/d22b" -x 1 --json > "$T/o22b" 2>/dev/null
check "twin: rerun exit 0" test "$(summary "$T/o22b" exit)" = 0
check "twin: dup1.bin skipped" test "$(summary "$T/o22b" skipped)" -ge 1
check "twin: sub/dup2.bin resumed at 700000" grep -q '"path": "sub/dup2.bin", "range": "bytes=700000-' "$T/f22b.log"
check "twin: resumed bytes reported" test "$(summary "$T/o22b" resumed)" -ge 700000
check "twin: tree verifies" tree2_ok "$T/d22b"

# ---- 22. a mismatch blames no source unless it alone served the file ------------
# run 1 keeps 1000000 bytes (one of them flipped) from a bad mirror, then fails
faultd f23 --corrupt 123456 --fault drop:1000000 --only a.bin
mkman "$T/m23.json" --source "http:http://127.0.0.1:$PORT_f23/"
G "$REPO" --manifest "$T/m23.json" -P "$T/k.pub" -d "$T/d23" -x 1 --retries 0 -q >/dev/null 2>&1
check "bad partial left by a failed run" test -s "$T/d23/.salafw/partial/$A_SHA-$(ptag a.bin).json"
G "$REPO" --manifest "$T/plain.json" -P "$T/k.pub" -d "$T/d23" -x 1 --json > "$T/o23" 2>/dev/null
check "earlier run's bad bytes, good source: exit 0" test "$(summary "$T/o23" exit)" = 0
check "earlier run's bad bytes: tree verifies" tree_ok "$T/d23"
check "earlier run's bad bytes: mismatch reported" test "$(events "$T/o23" hash_mismatch)" = 1
check "earlier run's bad bytes: the good source is not struck" test "$(events "$T/o23" source_failed)" = 0
# one run: the bad mirror serves a prefix and drops, the good one the rest
mkman "$T/m23b.json" --source "http:http://127.0.0.1:$PORT_f23/" --source "http:$NG/plain/"
G "$REPO" --manifest "$T/m23b.json" -P "$T/k.pub" -d "$T/d23b" -x 1 --retries 0 --json > "$T/o23b" 2>/dev/null
check "two sources mixed: exit 0" test "$(summary "$T/o23b" exit)" = 0
check "two sources mixed: tree verifies" tree_ok "$T/d23b"
check "two sources mixed: mismatch reported" test "$(events "$T/o23b" hash_mismatch)" = 1
check "two sources mixed: only the dropping mirror struck" test "$(events "$T/o23b" source_failed)" = 1

# ---- 23. Range ignored and connections dropped: bounded, then the next source ----
faultd f24 --norange --fault drop:500000 --only a.bin
mkman "$T/m24.json" --source "http:http://127.0.0.1:$PORT_f24/" --source "http:$NG/plain/"
G "$REPO" --manifest "$T/m24.json" -P "$T/k.pub" -d "$T/d24" -x 1 --retry-wait 10 --json > "$T/o24" 2>/dev/null
check "norange + drop: exit 0" test "$(summary "$T/o24" exit)" = 0
check "norange + drop: tree verifies" tree_ok "$T/d24"
n24=$(grep -c '"path": "a.bin"' "$T/f24.log")
check "norange + drop: a.bin asked of it at most 4 times ($n24)" test "$n24" -le 4
check "norange + drop: moved on, saying why" grep -q 'ignores Range and its transfer broke again' "$T/o24"

# ---- 24. a failed get keeps DEST's manifest copies; a good one replaces them -----
cp -a "$T/d1" "$T/d25"
flip_byte "$T/d25/a.bin" 1000
faultd f25 --fault 404
mkman "$T/m25.json" --source "http:http://127.0.0.1:$PORT_f25/"
G "$REPO" --manifest "$T/m25.json" -P "$T/k.pub" -d "$T/d25" --json > "$T/o25" 2>/dev/null
check "failed get (404 only): exit 4" test "$(summary "$T/o25" exit)" = 4
check "failed get: manifest copy still the one DEST was verified with" cmp -s "$T/d25/.salafw/manifest.json" "$T/plain.json"
check "failed get: signature copy unchanged" cmp -s "$T/d25/.salafw/manifest.json.minisig" "$T/plain.json.minisig"
mkman "$T/m25b.json" --source "http:$NG/plain/"
G "$REPO" --manifest "$T/m25b.json" -P "$T/k.pub" -d "$T/d25" -q >/dev/null 2>&1
check "good get: manifest copy replaced" cmp -s "$T/d25/.salafw/manifest.json" "$T/m25b.json"
check "good get: signature copy replaced" cmp -s "$T/d25/.salafw/manifest.json.minisig" "$T/m25b.json.minisig"
check "good get: salafw verify DEST passes" verify_fresh "$T/d25"

# ---- 25. a partial locked by another process: exit 5 naming it -------------------
faultd f26 --fault drop:700000 --times 1 --only a.bin
mkman "$T/m26.json" --source "http:http://127.0.0.1:$PORT_f26/"
G "$REPO" --manifest "$T/m26.json" -P "$T/k.pub" -d "$T/d26" -x 1 --retries 0 -q >/dev/null 2>&1
P26=$T/d26/.salafw/partial/$A_SHA-$(ptag a.bin).part
check "partial left to lock" test -s "$P26"
flock -o "$P26" sleep 5 &
lp=$!; PIDS+=("$lp")
for _ in $(seq 100); do flock -n "$P26" true 2>/dev/null || break; sleep 0.05; done # held now
check_err "locked partial: exit 5 naming it" 5 "being written by another process" \
	G "$REPO" --manifest "$T/m26.json" -P "$T/k.pub" -d "$T/d26" -x 1
kill "$lp" 2>/dev/null; wait "$lp" 2>/dev/null

# ---- 25b. a signed size that contradicts the signed sha256: fails, never loops -----
faultd f27
mkman "$T/m27.json" --source "http:http://127.0.0.1:$PORT_f27/" --size-override "a.bin=0"
retotal_resign "$T/m27.json"
check_err "size 0 with a non-empty file's sha256: exit 1, not a loop" 1 'sha256 mismatch' \
	G "$REPO" --manifest "$T/m27.json" -P "$T/k.pub" -d "$T/d27"

# ---- 25c. a missing model file: run names the get that re-fetches only it ----------
faultd f28
mkman "$T/m28.json" --source "http:http://127.0.0.1:$PORT_f28/"
G "$REPO" --manifest "$T/m28.json" -P "$T/k.pub" -d "$T/d28" -q 2>/dev/null
rm "$T/d28/a.bin"; : > "$T/f28.log"
check_err "a missing file: run refuses, naming the get with --include a.bin and its key" 1 \
	"fix: salafw get $REPO@$REV -d $T/d28 --include a.bin --pubkey $T/k.pub\$" env SALAFW_STATE_DIR="$T/st28" "$SALAFW" run "$T/d28" -P "$T/k.pub" -p x -n 1
SALAFW_STATE_DIR=$T/st28 "$SALAFW" run "$T/d28" -P "$T/k.pub" -p x -n 1 >/dev/null 2>"$T/e28"
fix=$(sed -n 's/.*refusing to run unverified weights; fix: salafw get //p' "$T/e28")
# the printed command as a shell would split it, pointed at this test's manifest
# shellcheck disable=SC2086
G $fix --manifest "$T/m28.json" -q 2>/dev/null
check "... that get puts a.bin back: the tree matches sha256sum -c" tree_ok "$T/d28"
check "... and asked the source for a.bin only" test "$(python3 -c 'import json,sys; print(" ".join(sorted(set(json.loads(l)["path"] for l in open(sys.argv[1])))))' "$T/f28.log")" = a.bin

# ---- 26. usage -----------------------------------------------------------------------
check_exit "no repo: usage" 2 "$SALAFW" get
check_exit "bad revision: usage" 2 "$SALAFW" get "$REPO@main"
check_exit "bad mirror kind: usage" 2 "$SALAFW" get "$REPO" --mirror "ftp:ftp://x/"

check_report test_get
