#!/usr/bin/env bash
# test_exit_codes.sh - one exit code and one wording per condition, in every
# command (README "Exit codes"): a missing input file (5, "cannot open
# 'PATH'"), a directory with no signed manifest (1, "has no signed
# manifest"), a file whose bytes differ (1, "sha256 mismatch"), an existing output (5, "already ... --force"), disk full (5,
# "No space left on device": a real full tmpfs where mounting is allowed,
# /dev/full always), an interrupt (130 for SIGINT, 143 for SIGTERM, "interrupted
# by SIG..."; no *.tmp.* file left, a partial download kept and resumed).
# get's non-terminal progress lines are checked on the slow transfer.
# Also a usage error (2, every command), a manifest signed by another key (3,
# every command that trusts one) and a 404 manifest or a refused connection (4).
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
# Under SAN=1 the write shim (LD_PRELOAD) comes before the ASan runtime, and a
# SIGBUS must reach the engine's guard and then the default action, not ASan's handler.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:handle_sigbus=0"
T=$(scratch)
export SALAFW_STATE_DIR=$T/state
S=$SALAFW
PIDS=()
MNT=
cleanup_all() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	[ -n "$MNT" ] && umount "$MNT" 2>/dev/null
	_scratch_cleanup
}
trap cleanup_all EXIT
REV=0123456789abcdef0123456789abcdef01234567
notmp() { [ -z "$(find "$@" -name '*.tmp.*' 2>/dev/null)" ]; }

# ---- fixtures: a signed tiny model, an unsigned one, a key ----------------
"$S" keygen --pubkey-out "$T/k.pub" -s "$T/k.key" > "$T/kg.txt" || fail "keygen"
KID=$(sed -n 's/^key id //p' "$T/kg.txt")
"$S" mkmodel --preset tiny -o "$T/m" >/dev/null 2>&1
"$S" mkmodel --preset tiny -o "$T/u" >/dev/null 2>&1
mkdir -p "$T/m/.salafw"
"$S" manifest "$T/m" --repo test/ec --revision $REV -P "$T/k.pub" -o "$T/m/.salafw/manifest.json" &&
	"$S" sign -s "$T/k.key" "$T/m/.salafw/manifest.json" >/dev/null && "$S" verify "$T/m" -P "$T/k.pub" >/dev/null ||
	fail "signed fixture"
echo "1 2 3" > "$T/ids.txt"
N=$T/nope

# ---- a directory that is not there: 5, "cannot open directory 'PATH'" ------
W="cannot open directory '$N/dir': No such file or directory"
check_err "verify DIR missing" 5 "$W" "$S" verify "$N/dir"
check_err "manifest DIR missing" 5 "$W" "$S" manifest "$N/dir" --repo test/ec --revision $REV
check_err "run DIR missing" 5 "$W" "$S" run "$N/dir" -p hi
check_err "score DIR missing" 5 "$W" "$S" score "$N/dir" --ids "$T/ids.txt" -o "$T/s0.st"
check_err "bench DIR missing" 5 "$W" "$S" bench "$N/dir"
check_err "quant DIR missing" 5 "$W" "$S" quant "$N/dir" -o "$T/q0"
check_err "serve DIR missing" 5 "$W" "$S" serve "$N/dir" --port 0

# ---- a missing input file: 5, "cannot open 'PATH'" ------------------------
W="cannot open '$N"
check_err "verify --manifest missing" 5 "$W" "$S" verify "$T/m" --manifest "$N.json"
check_err "verify -P missing" 5 "$W" "$S" verify "$T/m" -P "$N.pub"
check_err "get --manifest missing" 5 "$W" "$S" get test/ec --manifest "$N.json" -d "$T/g0"
check_err "get -P missing" 5 "$W" "$S" get test/ec --manifest "$T/m/.salafw/manifest.json" -P "$N.pub" -d "$T/g0"
check_err "sign -s missing" 5 "$W" "$S" sign -s "$N.key" "$T/m/.salafw/manifest.json"
check_err "sign FILE missing" 5 "$W" "$S" sign -s "$T/k.key" "$N.json"
check_err "manifest -P missing" 5 "$W" "$S" manifest "$T/m" --repo test/ec --revision $REV -P "$N.pub"
check_err "run --ids missing" 5 "$W" "$S" run "$T/m" -P "$T/k.pub" --ids "$N.ids"
check_err "run -P missing" 5 "$W" "$S" run "$T/m" -P "$N.pub" -p hi
check_err "score --ids missing" 5 "$W" "$S" score "$T/m" -P "$T/k.pub" --ids "$N.ids" -o "$T/s.st"
check_err "quant --calib missing" 5 "$W" "$S" quant "$T/m" -P "$T/k.pub" --calib "$N.txt" -o "$T/q0" -q
check_err "bench -P missing" 5 "$W" "$S" bench "$T/m" -P "$N.pub" --prompt 4 --gen 1

# ---- a directory with no signed manifest: 1, "has no signed manifest" ----
W="'$T/u' has no signed manifest"
check_err "verify" 1 "$W" "$S" verify "$T/u"
check_err "run" 1 "$W" "$S" run "$T/u" -p hi -n 1
check_err "score" 1 "$W" "$S" score "$T/u" --ids "$T/ids.txt" -o "$T/s.st"
check_err "bench" 1 "$W" "$S" bench "$T/u" --prompt 4 --gen 1
check_err "quant" 1 "$W" "$S" quant "$T/u" -o "$T/q1" --method rtn

# ---- a file whose bytes differ: 1, "sha256 mismatch", the same words in ----
# verify's error, its file line and --json, as in get's (tests/test_get.sh)
cp -r "$T/m" "$T/mw"
f=$(ls "$T/mw"/model-*.safetensors | head -n 1)
printf 'X' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
check_err "verify, a changed file: exit 1" 1 "$(basename "$f")': sha256 mismatch" "$S" verify "$T/mw" -P "$T/k.pub"
"$S" verify "$T/mw" -P "$T/k.pub" > "$T/mw.txt" 2>/dev/null
check "... its line says sha256 mismatch" grep -q "^sha256 mismatch  *$(basename "$f")$" "$T/mw.txt"
"$S" verify "$T/mw" -P "$T/k.pub" --json > "$T/mw.json" 2>/dev/null
check "... and so does --json" grep -q '"status":[[:space:]]*"sha256 mismatch"' "$T/mw.json"
check "... no other wording anywhere" bash -c "! grep -qi 'hash mismatch' '$T/mw.txt' '$T/mw.json'"
rm -rf "$T/mw"

# ---- an existing output: 5, "already ... (use --force ...)" --------------
W="already (exists|holds).*--force"
check_err "keygen over a key" 5 "$W" "$S" keygen --pubkey-out "$T/k.pub" -s "$T/k2.key"
check_err "mkmodel over a model" 5 "$W" "$S" mkmodel --preset tiny -o "$T/u"
check_err "quant over a model" 5 "$W" "$S" quant "$T/m" -P "$T/k.pub" -o "$T/u" --method rtn

# ---- disk full: 5, "No space left on device", no temporary file left ------
W="[Nn]o space left"
check_err "manifest to a full stdout" 5 "$W" sh -c "'$S' manifest '$T/m' --repo test/ec --revision $REV > /dev/full"
check_err "verify to a full stdout" 5 "$W" sh -c "'$S' verify '$T/m' -P '$T/k.pub' > /dev/full"
check_err "keygen to a full stdout" 5 "$W" sh -c "'$S' keygen --pubkey-out '$T/k3.pub' -s '$T/k3.key' > /dev/full"
check_err "run to a full stdout" 5 "$W" sh -c "'$S' run '$T/m' -P '$T/k.pub' -p hi -n 2 --greedy > /dev/full"
# a key pair is one unit: a write wrapper fails the public key's writes
# with ENOSPC; neither file stays (a lone secret key blocked every retry)
if ${CC:-cc} -shared -fPIC -o "$T/writefault.so" tests/shim/writefault.c -ldl 2>/dev/null; then
	check_err "keygen, the disk full at the public key" 5 "$W" \
		env LD_PRELOAD="$T/writefault.so" SFW_TEST_ENOSPC=kf.pub "$S" keygen --pubkey-out "$T/kf.pub" -s "$T/kf.key"
	check "... leaves neither key file, nor a temporary one" \
		bash -c "[ ! -e '$T/kf.key' ] && [ ! -e '$T/kf.pub' ] && [ -z \"\$(ls '$T' | grep '^kf')\" ]"
	check "... and keygen then makes the pair" "$S" keygen --pubkey-out "$T/kf.pub" -s "$T/kf.key"
else
	fail "cannot build the write wrapper (tests/shim/writefault.c)"
fi
mkdir -p "$T/full"
if mount -t tmpfs -o size=4m tmpfs "$T/full" 2>/dev/null; then
	MNT=$T/full
	check_err "mkmodel into a full disk" 5 "$W" "$S" mkmodel --preset tiny -o "$T/full/m"
	check "... leaves no *.tmp.* file" notmp "$T/full"
	check_err "quant into a full disk" 5 "$W" "$S" quant "$T/m" -P "$T/k.pub" -o "$T/full/q" --method rtn -q
	check "... leaves no *.tmp.* file" notmp "$T/full"
	rm -rf "$T/full"/*
	head -c 8000000 /dev/zero > "$T/full/fill" 2>/dev/null
	check_err "keygen on a full disk" 5 "$W" "$S" keygen --pubkey-out "$T/full/k.pub" -s "$T/full/k.key"
	check_err "manifest -o on a full disk" 5 "$W" "$S" manifest "$T/m" --repo test/ec --revision $REV -o "$T/full/m.json"
	check_err "score -o on a full disk" 5 "$W" "$S" score "$T/m" -P "$T/k.pub" --ids "$T/ids.txt" -o "$T/full/s.st"
	check "... none leaves a *.tmp.* file" notmp "$T/full"
	umount "$T/full" && MNT=
else
	echo "note: cannot mount a tmpfs here: the full-disk file cases ran on /dev/full only"
fi

# ---- interrupts: 130 / 143, temporary files removed --------------------------
# wait_for COND... : poll (at most 20 s) until COND holds
wait_for() { for _ in $(seq 400); do "$@" && return 0; sleep 0.05; done; return 1; }
has_tmp() { [ -n "$(find "$1" -name '*.tmp.*' 2>/dev/null)" ]; }

# mkmodel: SIGTERM while a shard's temporary file is being written
"$S" mkmodel --preset small -o "$T/mk" > /dev/null 2> "$T/mk.err" & pid=$!
wait_for has_tmp "$T/mk" || fail "mkmodel: no temporary file seen"
kill -TERM $pid; wait $pid; rc=$?
[ $rc = 143 ] && pass "mkmodel SIGTERM: exit 143" || fail "mkmodel SIGTERM: exit $rc"
check "mkmodel SIGTERM: says so" grep -q "interrupted by SIGTERM" "$T/mk.err"
check "mkmodel SIGTERM: no *.tmp.* left" notmp "$T/mk"

# quant: SIGINT while writing its output
"$S" mkmodel --preset small -o "$T/big" >/dev/null 2>&1
"$S" quant "$T/big" --no-verify -o "$T/qi" --method rtn > /dev/null 2> "$T/qi.err" & pid=$!
wait_for has_tmp "$T/qi" || fail "quant: no temporary file seen"
kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] && pass "quant SIGINT: exit 130" || fail "quant SIGINT: exit $rc ($(tail -c 300 "$T/qi.err"))"
check "quant SIGINT: says so" grep -q "interrupted by SIGINT" "$T/qi.err"
check "quant SIGINT: no *.tmp.* left" notmp "$T/qi"

# manifest: SIGINT while hashing; an OUT already there stays as it was
cp "$T/m/.salafw/manifest.json" "$T/old.json"; cp "$T/old.json" "$T/keep.json"
truncate -s 20G "$T/big/sparse.bin" # sparse: seconds of hashing, no disk
"$S" manifest "$T/big" --repo test/ec --revision $REV -t 1 -o "$T/keep.json" 2> "$T/mi.err" & pid=$!
sleep 1; kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] && pass "manifest SIGINT: exit 130" || fail "manifest SIGINT: exit $rc"
check "manifest SIGINT: says so" grep -q "interrupted" "$T/mi.err"
check "manifest SIGINT: OUT unchanged" cmp -s "$T/keep.json" "$T/old.json"
check "manifest SIGINT: no *.tmp.* left" notmp "$T"
rm -f "$T/big/sparse.bin"
# ... and a manifest never lists another writer's temporary file
: > "$T/m/config.json.tmp.4242.7"; : > "$T/m/notes.tmp.txt"; : > "$T/m/draft.tmp"
"$S" manifest "$T/m" --repo test/ec --revision $REV > "$T/mt.json" 2>/dev/null
check "manifest skips *.tmp.<pid>.<n>" bash -c "! grep -q 'config.json.tmp.4242.7' '$T/mt.json'"
check "... and any *.tmp.* name" bash -c "! grep -q 'notes.tmp.txt' '$T/mt.json'"
check "... but lists a name that only ends in .tmp" grep -q '"draft.tmp"' "$T/mt.json"
rm -f "$T/m/config.json.tmp.4242.7" "$T/m/notes.tmp.txt" "$T/m/draft.tmp"

# get: SIGINT during a slow transfer; the partial stays and resumes
FAULTD="python3 tests/httpd/faultd.py"
mkdir -p "$T/src"; head -c 3000000 /dev/urandom > "$T/src/w.bin"; echo '{}' > "$T/src/config.json"
faultd() { faultd_serve "$T/src" 120 "$@"; }
faultd slow --rate 250000
faultd fast
$FAULTD manifest --dir "$T/src" --repo test/ecget --rev $REV --key-id "$KID" --source "http:http://127.0.0.1:$PORT_slow/" > "$T/g.json"
"$S" sign -s "$T/k.key" "$T/g.json" >/dev/null
"$S" get test/ecget --manifest "$T/g.json" -P "$T/k.pub" -d "$T/gd" -x 1 --progress-interval 1 > /dev/null 2> "$T/g.err" & pid=$!
wait_for grep -q "^progress w.bin" "$T/g.err"; sleep 1.2
kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] && pass "get SIGINT: exit 130" || fail "get SIGINT: exit $rc ($(tail -c 300 "$T/g.err"))"
check "get SIGINT: says so, and that the partial is kept" grep -q "interrupted by SIGINT.*partial downloads kept" "$T/g.err"
check "get SIGINT: no *.tmp.* left" notmp "$T/gd"
check "get SIGINT: the partial is kept" bash -c "ls '$T/gd/.salafw/partial/'*.part"
n=$(grep -cE '^progress w\.bin [0-9]+ / 3000000 bytes \([0-9.]+%, [0-9.]+ [kKMG]?B of 3\.0 MB\) [0-9.]+ [kKMG]?B/s$' "$T/g.err")
[ "$n" -ge 2 ] && pass "not a terminal: $n progress lines (bytes, percent, rate) at 1 s" || fail "progress lines: $(head -c 400 "$T/g.err")"
"$S" get test/ecget --manifest "$T/g.json" -P "$T/k.pub" -d "$T/gd" --mirror "http:http://127.0.0.1:$PORT_fast/" --json > "$T/g2.json" 2>/dev/null
rc=$?
res=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if d.get("event")=="summary": print(d["resumed"])' "$T/g2.json")
[ $rc = 0 ] && [ "${res:-0}" -gt 0 ] && pass "get after SIGINT resumes ($res bytes kept)" || fail "resume: exit $rc resumed ${res:-?}"
check "... and the file is whole" cmp -s "$T/gd/w.bin" "$T/src/w.bin"
# SIGTERM: 143
"$S" get test/ecget --manifest "$T/g.json" -P "$T/k.pub" -d "$T/gd2" -x 1 -q > /dev/null 2> "$T/g3.err" & pid=$!
wait_for bash -c "ls '$T/gd2/.salafw/partial/'*.part" >/dev/null 2>&1; sleep 0.5
kill -TERM $pid; wait $pid; rc=$?
[ $rc = 143 ] && pass "get SIGTERM: exit 143" || fail "get SIGTERM: exit $rc"
check "get SIGTERM: no *.tmp.* left" notmp "$T/gd2"
# serve: SIGTERM / SIGINT is its graceful stop: exit 0 (README)
for sig in TERM INT; do
	"$S" serve "$T/m" -P "$T/k.pub" --port 0 -t 1 2> "$T/sv.err" & pid=$!
	wait_for grep -q "serving .* on http://" "$T/sv.err" || fail "serve did not start: $(head -c 300 "$T/sv.err")"
	kill -$sig $pid; wait $pid; rc=$?
	[ $rc = 0 ] && grep -q "SIG$sig: finishing the accepted requests" "$T/sv.err" && grep -q "stopped" "$T/sv.err" &&
		pass "serve SIG$sig: a graceful stop, exit 0" || fail "serve SIG$sig: exit $rc ($(tail -c 300 "$T/sv.err"))"
done
# get on a full disk: refused before starting, or "no space left" when told to try
mkdir -p "$T/full2"
if mount -t tmpfs -o size=1m tmpfs "$T/full2" 2>/dev/null; then
	MNT=$T/full2
	check_err "get: a download that cannot fit is refused (exit 5)" 5 "not enough free space" \
		"$S" get test/ecget --manifest "$T/g.json" -P "$T/k.pub" -d "$T/full2/a" --mirror "http:http://127.0.0.1:$PORT_fast/"
	check_err "get --no-space-check on a full disk: exit 5, no space left" 5 "$W" \
		"$S" get test/ecget --manifest "$T/g.json" -P "$T/k.pub" -d "$T/full2/b" --no-space-check \
		--mirror "http:http://127.0.0.1:$PORT_fast/"
	check "... no *.tmp.* left" notmp "$T/full2"
	umount "$T/full2" && MNT=
fi
# ---- a usage error: 2, in every command ----------------------------------------
for c in $("$S" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p'); do
	check_err "$c --frobnicate: exit 2" 2 "^salafw $c: unknown option '--frobnicate'" "$S" $c --frobnicate
	check_err "$c DIR --pubkey (no value, or not its option): exit 2" 2 "^salafw $c: " "$S" $c "$T/m" --pubkey
done
check_err "not a command: exit 2" 2 "'frob' is not a salafw command" "$S" frob
check_err "a malformed repository id: exit 2, before any network" 2 "is not a repository id" \
	"$S" get a/b/c --endpoint "http://127.0.0.1:$PORT_fast" -d "$T/g4"

# ---- a manifest or signature rejected: 3, in every command that trusts a key ---
"$S" keygen --pubkey-out "$T/o.pub" -s "$T/o.key" >/dev/null
W="was made by key $KID, but the trusted key is"
check_err "verify, another key: exit 3" 3 "$W" "$S" verify "$T/m" -P "$T/o.pub"
check_err "run, another key: exit 3" 3 "$W" "$S" run "$T/m" -P "$T/o.pub" -p hi -n 1
check_err "serve, another key: exit 3" 3 "$W" "$S" serve "$T/m" -P "$T/o.pub" --port 0
check_err "score, another key: exit 3" 3 "$W" "$S" score "$T/m" -P "$T/o.pub" --ids "$T/ids.txt" -o "$T/s3.st"
check_err "bench, another key: exit 3" 3 "$W" "$S" bench "$T/m" -P "$T/o.pub" --prompt 4 --gen 1
check_err "quant, another key: exit 3" 3 "$W" "$S" quant "$T/m" -P "$T/o.pub" -o "$T/q3" --method rtn -q
check_err "get, another key: exit 3" 3 "$W" "$S" get test/ec --manifest "$T/m/.salafw/manifest.json" -P "$T/o.pub" -d "$T/g3"

# ---- network: 4 (a 404 manifest, every source failed) -------------------------
check_err "get, repository not on the endpoint (404): exit 4" 4 "repository 'test/absent' is not on" \
	"$S" get test/absent --endpoint "http://127.0.0.1:$PORT_fast" -P "$T/k.pub" -d "$T/g4"
check_err "get, the endpoint refuses connections: exit 4" 4 "." \
	"$S" get test/absent --endpoint "http://127.0.0.1:9" --retries 0 -P "$T/k.pub" -d "$T/g4"
check_report test_exit_codes
