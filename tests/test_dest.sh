#!/usr/bin/env bash
# test_dest.sh - the destination folder under attack (issue 12, security):
# symlinks planted at DEST/.salafw, DEST/.salafw/partial and a model
# subfolder, a .salafw of another user, a subfolder swapped for a symlink in
# a tight loop while `get` renames files into it, SIGKILL at random instants
# of a v1 -> v2 manifest install, and signed strings carrying ESC/CR/LF.
# Files come from tests/httpd/faultd.py on loopback, manifests are signed
# with the real minisign CLI; the assertions look at the folders outside
# DEST, the bytes on disk (sha256sum) and the raw bytes printed.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
T=$(scratch)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
}
trap 'cleanup; _scratch_cleanup' EXIT
export SALAFW_STATE_DIR=$T/state
FAULTD="python3 tests/httpd/faultd.py"
REPO=test/tiny
REV=0123456789abcdef0123456789abcdef01234567
G() { SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") timeout 60 "$SALAFW" get "$@"; }

# ---- fixture: a model with a subfolder of many small files, a key, faultd ---
mkdir -p "$T/model/sub"
head -c 200000 /dev/urandom >"$T/model/a.bin"
for i in $(seq -w 0 39); do head -c 3000 /dev/urandom >"$T/model/sub/f$i.bin"; done
(cd "$T/model" && find . -type f | sed 's|^\./||' | sort | while read -r f; do sha256sum "$f"; done) >"$T/SHA256SUMS"
minisign -G -W -p "$T/k.pub" -s "$T/k.key" -f >/dev/null 2>&1 || { echo "FAIL minisign -G"; exit 1; }
KEYID=$(python3 -c '
import base64,sys
b=base64.b64decode(open(sys.argv[1]).read().splitlines()[1])
print("%016X" % int.from_bytes(b[2:10],"little"))' "$T/k.pub")
$FAULTD serve --root "$T/model" --port-file "$T/f.port" --log "$T/f.log" --lifetime 300 &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$T/f.port" ] && break; sleep 0.05; done
URL=http://127.0.0.1:$(cat "$T/f.port")/

# sign FILE [COMMENT]: FILE.minisig with the binding trusted comment
sign() {
	local ver; ver=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifest_version"])' "$1")
	rm -f "$1.minisig"
	minisign -S -s "$T/k.key" -m "$1" -x "$1.minisig" \
		-t "${2:-salafw-manifest repo_id=$REPO revision=$REV manifest_version=$ver}" >/dev/null 2>&1
}
mkman() { # OUT VERSION [faultd manifest args]
	local out=$1 ver=$2; shift 2
	$FAULTD manifest --dir "$T/model" --repo "$REPO" --rev "$REV" --key-id "$KEYID" --version "$ver" "$@" >"$out" &&
		sign "$out"
}
mkman "$T/m1.json" 1 --source "http:$URL"
mkman "$T/m2.json" 2 --source "http:$URL"
tree_ok() { (cd "$1" && sha256sum --quiet -c "$T/SHA256SUMS") >/dev/null 2>&1; }
empty() { [ -z "$(ls -A "$1")" ]; }
GET1() { G --manifest "$T/m1.json" --pubkey "$T/k.pub" -d "$@"; }

# ---- 1. symlinked DEST/.salafw: refused, nothing written through it ---------
D=$T/d1 O=$T/out1
mkdir -p "$D" "$O" && echo planted >"$O/manifest.json" && ln -s "$O" "$D/.salafw"
sha_before=$(sha256sum "$O/manifest.json")
check_err "symlinked .salafw: get refused (exit 3, unsafe path)" 3 "unsafe path: '.*/\.salafw' is a symlink" GET1 "$D"
check "... the planted file there unchanged" test "$(sha256sum "$O/manifest.json")" = "$sha_before"
check "... nothing else written there (no lock, no partial/)" test "$(ls -A "$O")" = manifest.json
check "... no model file written either" test ! -e "$D/a.bin"
check_err "symlinked .salafw: verify refused too" 3 "unsafe path" "$SALAFW" verify --pubkey "$T/k.pub" "$D"

# ---- 2. symlinked DEST/.salafw/partial ---------------------------------------
D=$T/d2 O=$T/out2
mkdir -p "$D/.salafw" "$O" && ln -s "$O" "$D/.salafw/partial"
check_err "symlinked .salafw/partial: get refused" 3 "unsafe path: '.*/\.salafw/partial' is a symlink" GET1 "$D"
check "... no partial or journal written through it" empty "$O"

# ---- 3. symlinked model subfolder ---------------------------------------------
D=$T/d3 O=$T/out3
mkdir -p "$D" "$O" && echo planted >"$O/f00.bin" && ln -s "$O" "$D/sub"
sha_before=$(sha256sum "$O/f00.bin")
check_err "symlinked subfolder: get refused" 3 "unsafe path: '.*/sub' is a symlink" GET1 "$D"
check "... the planted file there unchanged" test "$(sha256sum "$O/f00.bin")" = "$sha_before"
check "... nothing else lands there" test "$(ls -A "$O")" = f00.bin

# ---- 4. .salafw of another user (root only: chown to nobody) -------------------
if [ "$(id -u)" = 0 ]; then
	D=$T/d4
	mkdir -p "$D/.salafw" && chown 65534:65534 "$D/.salafw"
	check_err ".salafw of another user: get refused" 3 "unsafe path: '.*/\.salafw' belongs to another user" GET1 "$D"
	check "... nothing written into it" empty "$D/.salafw"
else
	echo "note: not root: the other-user case needs chown (it runs in tests/test_dest.c too)"
fi

# ---- 5. the rename race: DEST/sub swapped with a symlink in a tight loop -------
# The swapper exchanges DEST/sub (the real folder) and DEST/evil (a link to
# out5) with renameat2(RENAME_EXCHANGE) as fast as it can, for at most 20 s,
# while get runs again and again (each one renames the files it fetched
# into sub/). Whatever get sees, no file may ever appear in out5.
D=$T/d5 O=$T/out5
mkdir -p "$D/sub" "$O" && ln -s "$O" "$D/evil"
cat >"$T/swap.py" <<'EOF'
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
d, stop = sys.argv[1].encode(), sys.argv[2]
a, b = d + b"/sub", d + b"/evil"
n, t_end = 0, time.time() + 20
while not os.path.exists(stop) and time.time() < t_end and n < 5000000:
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        sys.exit("renameat2: errno %d" % ctypes.get_errno())
    n += 1
if os.path.islink(a):  # leave the real folder at sub/
    libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
print(n)
EOF
python3 "$T/swap.py" "$D" "$T/stop5" >"$T/swaps" 2>&1 &
SWAP=$!
PIDS+=($SWAP)
sleep 0.2
refused=0 ok=0 escaped=0
for i in $(seq 12); do
	G --manifest "$T/m1.json" --pubkey "$T/k.pub" -d "$D" --jobs 8 >/dev/null 2>"$T/e5.$i"
	rc=$?
	[ "$rc" = 3 ] && refused=$((refused + 1))
	[ "$rc" = 0 ] && ok=$((ok + 1))
	[ -n "$(ls -A "$O")" ] && escaped=1
	rm -rf "$D/.salafw/partial" # fetch everything again: more renames
	for f in "$D"/sub/f*.bin "$D"/evil/f*.bin; do [ -f "$f" ] && rm -f "$f"; done 2>/dev/null
done
touch "$T/stop5"
wait "$SWAP"
swaps=$(cat "$T/swaps")
check "rename race: the swapper ran ($swaps exchanges)" test "${swaps:-0}" -gt 1000 2>/dev/null
check "rename race: get met the swapped link and refused it ($refused of 12 runs)" test "$refused" -gt 0
check "rename race: no file ever appeared outside DEST" test "$escaped" = 0
check "... out5 is empty" empty "$O"
check "... the real folder is back at sub/" test -d "$D/sub" -a ! -L "$D/sub"
check "after the race: a plain get completes" GET1 "$D"
check "... and the tree matches sha256sum -c" tree_ok "$D"
check "... still nothing outside DEST" empty "$O"

# ---- 6. SIGKILL at random instants of a v1 -> v2 manifest install -----------------
# Every file is present, so each get is a verify pass plus the pair install;
# the kill lands anywhere in it. Afterwards the folder must verify offline
# with exactly one of the two signed pairs.
D=$T/d6
check "kill loop: DEST prepared with v1" GET1 "$D"
SHA1=$(sha256sum <"$T/m1.json" | cut -c1-64)
SHA2=$(sha256sum <"$T/m2.json" | cut -c1-64)
t0=$(date +%s%N)
G --manifest "$T/m2.json" --pubkey "$T/k.pub" -d "$D" >/dev/null 2>&1
ms=$(( ($(date +%s%N) - t0) / 1000000 + 5 ))
G --manifest "$T/m1.json" --pubkey "$T/k.pub" -d "$D" >/dev/null 2>&1
n_old=0 n_new=0 bad=0
for i in $(seq 100); do
	# alternate the target so every run installs a pair (fresh ratchet each)
	if [ $((i % 2)) = 1 ]; then want=m2; else want=m1; fi
	SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") "$SALAFW" get --manifest "$T/$want.json" --pubkey "$T/k.pub" -d "$D" >/dev/null 2>&1 &
	pid=$!
	d=$((RANDOM % ms))
	sleep "$(printf '%d.%03d' $((d / 1000)) $((d % 1000)))"
	kill -9 "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	out=$(SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") "$SALAFW" verify --pubkey "$T/k.pub" --json --no-state "$D" 2>/dev/null)
	rc=$?
	sha=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("manifest_sha256",""))' 2>/dev/null)
	if [ "$rc" != 0 ]; then bad=$((bad + 1)); echo "kill $i after ${d} ms: verify exit $rc"
	elif [ "$sha" = "$SHA1" ]; then n_old=$((n_old + 1))
	elif [ "$sha" = "$SHA2" ]; then n_new=$((n_new + 1))
	else bad=$((bad + 1)); echo "kill $i: verified against neither pair ($sha)"; fi
done
check "100 kills (0..$ms ms) during v1 <-> v2 installs: verify always passes with one signed pair ($bad bad)" test "$bad" = 0
check "... both outcomes seen (v1 $n_old, v2 $n_new)" test "$n_old" -gt 0 -a "$n_new" -gt 0
check "... a get afterwards completes" GET1 "$D"
left=$(ls -A "$D/.salafw" | grep -v -x -e manifest.json -e manifest.json.minisig -e state.json -e lock | tr "\n" " ")
check "... no step folder or temporary left in .salafw ($left)" test -z "$left"

# ---- 6b. a full disk at each step of the install (root: a tiny tmpfs) --------------
# DEST on its own small tmpfs, holding the model and the v1 pair; a filler
# file leaves N pages free, N = 0..10, so the v2 get runs out of space at a
# different write each time. With the filler removed, DEST must verify with
# one of the two pairs.
MNT=$T/mnt
if [ "$(id -u)" = 0 ] && mkdir -p "$MNT" && mount -t tmpfs -o size=4m tmpfs "$MNT" 2>/dev/null; then
	trap 'umount "$MNT" 2>/dev/null; cleanup; _scratch_cleanup' EXIT
	n_old=0 n_new=0 bad=0 nospace=0
	for N in $(seq 0 10); do
		rm -rf "${MNT:?}"/*
		cp -r "$T/d6" "$MNT/d" && GET1 "$MNT/d" >/dev/null 2>&1
		avail=$(python3 -c 'import os,sys; v=os.statvfs(sys.argv[1]); print(v.f_bavail*v.f_frsize)' "$MNT")
		head -c $((avail - N * 4096)) /dev/zero >"$MNT/filler" 2>/dev/null
		G --manifest "$T/m2.json" --pubkey "$T/k.pub" -d "$MNT/d" --no-space-check >/dev/null 2>"$T/e6b"
		rc=$?
		grep -q "No space left\|not enough disk space" "$T/e6b" && nospace=$((nospace + 1))
		rm -f "$MNT/filler"
		out=$(SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") "$SALAFW" verify --pubkey "$T/k.pub" --json --no-state "$MNT/d" 2>/dev/null)
		vrc=$?
		sha=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("manifest_sha256",""))' 2>/dev/null)
		if [ "$vrc" != 0 ]; then bad=$((bad + 1)); echo "ENOSPC with $N pages free (get exit $rc): verify exit $vrc"
		elif [ "$sha" = "$SHA1" ]; then n_old=$((n_old + 1))
		elif [ "$sha" = "$SHA2" ]; then n_new=$((n_new + 1))
		else bad=$((bad + 1)); fi
	done
	umount "$MNT"
	check "full disk at 11 points of a v1 -> v2 get: verify passes with one signed pair ($bad bad)" test "$bad" = 0
	check "... the disk did run out ($nospace of 11 gets said so)" test "$nospace" -gt 0
	check "... both outcomes seen (v1 $n_old, v2 $n_new)" test "$n_old" -gt 0 -a "$n_new" -gt 0
else
	echo "note: no tmpfs mount (needs root): the full-disk install case runs in tests/test_dest.c only"
fi

# ---- 7. untrusted strings printed escaped ------------------------------------------
# A signed manifest whose source names carry ESC, CR and LF (the first source
# answers 404, so its name is printed in a failure line too), an extra file
# with such a name on disk, a DEST path with them. (A trusted comment with a
# control character is refused by the verifier, as minisign >= 0.12 does.)
python3 - "$T/m1.json" "$T/evil.json" "$URL" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
evil = "\x1b[31mred\x1b[0m\rverified evil.bin\nverified evil.bin"
d["sources"] = [{"kind": "http", "name": evil, "base_url": sys.argv[3] + "gone/"},
                {"kind": "http", "name": evil + "2", "base_url": sys.argv[3]}]
open(sys.argv[2], "w").write(json.dumps(d, indent=1) + "\n")
EOF
sign "$T/evil.json"
D=$T/d7
G --manifest "$T/evil.json" --pubkey "$T/k.pub" -d "$D" --jobs 1 >"$T/o7" 2>"$T/e7"
check "escape: get with control characters in source names still works" tree_ok "$D"
printf 'x' >"$D/"$'extra\x1b[2J\rverified evil.bin\n.bin'
"$SALAFW" verify --pubkey "$T/k.pub" "$D" >>"$T/o7" 2>>"$T/e7"
"$SALAFW" verify --pubkey "$T/k.pub" "$T/"$'no\x1b[31mdir\rverified evil.bin' >>"$T/o7" 2>>"$T/e7"
# raw control bytes (other than the newline ending each line) and forged lines
rawctl() { python3 -c '
import sys
b = open(sys.argv[1], "rb").read()
bad = [c for c in b if (c < 32 and c != 10) or c == 127]
forged = [l for l in b.split(b"\n") if l.startswith(b"verified evil.bin")]
sys.exit(1 if bad or forged else 0)' "$1"; }
check "escape: stderr of get/verify has no raw control byte and no forged line" rawctl "$T/e7"
check "escape: stdout too" rawctl "$T/o7"
check "escape: the source name is printed, escaped" grep -q 'source   \\x1b\[31mred\\x1b\[0m\\x0dverified evil.bin\\x0averified evil.bin failed' "$T/e7"
check "escape: the extra file is named, escaped" grep -q 'extra file not in the manifest: extra\\x1b\[2J\\x0dverified evil.bin\\x0a.bin' "$T/e7"
check "escape: the DEST path in an error, escaped" grep -q 'no\\x1b\[31mdir\\x0dverified evil.bin' "$T/e7"

# the model gate's refusals and hints (run, score, bench, quant, serve) print
# the directory escaped too: no manifest (the get hint), not there (the path
# hint), --no-verify (the warning), a missing file (the get --include hint)
E=$T/$'m\x1b[31m7\rverified evil.bin\n'
mkdir -p "$E/empty"
"$SALAFW" run "$E/empty" -p x -n 1 >/dev/null 2>"$T/e7g"
"$SALAFW" run "$E/nope" -p x -n 1 >/dev/null 2>>"$T/e7g"
"$SALAFW" run "$E/empty" --no-verify -p x -n 1 >/dev/null 2>>"$T/e7g"
cp -a "$D" "$E/d" && rm -f "$E/d/a.bin" "$E/d/"extra*
"$SALAFW" run "$E/d" --pubkey "$T/k.pub" -p x -n 1 >/dev/null 2>>"$T/e7g"
check "escape: the model gate's hints have no raw control byte and no forged line" rawctl "$T/e7g"
check "escape: ... the get hint names the directory escaped" grep -q 'fix: salafw get .* -d .*m\\x1b\[31m7\\x0dverified evil.bin\\x0a/empty ' "$T/e7g"
check "escape: ... and the missing file's get too" grep -q -- '-d .*m\\x1b\[31m7\\x0dverified evil.bin\\x0a/d --include a.bin --pubkey .*/k.pub$' "$T/e7g"
check "escape: ... the --no-verify warning too" grep -q "running '.*m\\\\x1b\[31m7.*/empty' without checking" "$T/e7g"

# ... and so do the other commands' own lines that name a path (quant, sign,
# manifest's re-sign warning, run --file, serve --api-key-file, mkmodel,
# keygen, sign)
"$SALAFW" mkmodel --preset tiny -o "$E/tiny" >"$T/e7h" 2>/dev/null
XDG_CONFIG_HOME=$T/cfg7 "$SALAFW" quant "$E/tiny" --no-verify -o "$E/q" --method rtn -t 1 >>"$T/e7h" 2>&1
XDG_CONFIG_HOME=$T/cfg7 "$SALAFW" sign --user "$E/q" >>"$T/e7h" 2>&1
printf 'a\0b' >"$E/nul.txt"; : >"$E/key"
"$SALAFW" run "$E/tiny" --no-verify -f "$E/nul.txt" >>"$T/e7h" 2>&1
"$SALAFW" serve "$E/tiny" --no-verify --api-key-file "$E/key" >>"$T/e7h" 2>&1
"$SALAFW" manifest "$E/tiny" --repo a/b --revision 0123456789abcdef0123456789abcdef01234567 -o "$E/r.json" 2>>"$T/e7h"
sleep 1.1 # another created time: other bytes
"$SALAFW" manifest "$E/tiny" --repo a/b --revision 0123456789abcdef0123456789abcdef01234567 -o "$E/r.json" 2>>"$T/e7h"
"$SALAFW" keygen --pubkey-out "$E/k.pub" -s "$E/k.key" >>"$T/e7h" 2>&1
"$SALAFW" sign -s "$E/k.key" "$E/r.json" >>"$T/e7h" 2>&1
check "escape: quant, sign, manifest, run -f, serve, mkmodel, keygen print paths with no raw control byte" rawctl "$T/e7h"
n=$(grep -cE "unsigned manifest|^signed '|holds a NUL byte|holds no key|already holds manifest_version|preset, seed|^(public|secret) key " "$T/e7h")
check "escape: ... each of those 9 lines was printed ($n)" test "$n" = 9

# ... and usage errors quote what was typed escaped (an option, a byte count,
# a revision, an integer: argv may carry what a script was given)
X=$'\x1b[2J\rverified evil.bin\n'
"$SALAFW" run "$E/tiny" "--frob$X" >/dev/null 2>"$T/e7u"
"$SALAFW" get a/b --limit-rate "1$X" >/dev/null 2>>"$T/e7u"
"$SALAFW" get "a/b@$X" >/dev/null 2>>"$T/e7u"
"$SALAFW" verify "$E/tiny" -t "1$X" >/dev/null 2>>"$T/e7u"
check "escape: usage errors have no raw control byte and no forged line" rawctl "$T/e7u"
check "escape: ... all 4 were printed" test "$(grep -c 'x1b\[2J\\x0dverified evil.bin\\x0a' "$T/e7u")" = 4

check_report test_dest
