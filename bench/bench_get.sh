#!/usr/bin/env bash
# bench_get.sh - `salafw get` throughput on loopback against aria2c and curl,
# in the same run, on the same nginx (tests/nginx/), as ratios.
#   4 files x SIZE_MB MiB (default 1024) of random bytes, signed manifest.
#   salafw get -j 4 -x 4 (every byte SHA-256 verified, fsync + rename)
#   aria2c -x4 -j4 (no verification)       curl, one file after another
# and first, many small files: NSMALL (5000) files of 13 bytes, in files/s,
# salafw against aria2c -j4 (and SALAFW_BEFORE, an older build, if given);
# SMALL_ONLY=1 runs that part alone.
# Each tool downloads into a fresh directory that is deleted right after.
# Env: SIZE_MB, NFILES (4), REPS (1: best of REPS), KEEP_TMP=1 to keep files,
# OUT_DIR (where the tools write; default the temp dir). salafw fsyncs every
# file (and its journal each second) as it must; aria2c and curl do not, so on
# a slow disk all three are bound by write-back: OUT_DIR=/dev/shm shows the
# network + hashing path alone (it needs NFILES x SIZE_MB of RAM).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SALAFW=${SALAFW:-$PWD/$BUILD/salafw}
SIZE_MB=${SIZE_MB:-1024}
NFILES=${NFILES:-4}
REPS=${REPS:-3}
REV=0123456789abcdef0123456789abcdef01234567
T=$(mktemp -d "${TMPDIR:-/tmp}/salafw-bench-get.XXXXXX")
O=$(mktemp -d "${OUT_DIR:-$T}/salafw-bench-out.XXXXXX")
NGPID=
cleanup() {
	[ -n "$NGPID" ] && kill "$NGPID" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$O"
	[ -z "${KEEP_TMP:-}" ] && rm -rf "$T"
}
trap cleanup EXIT
for tool in aria2c curl minisign nginx python3; do
	command -v "$tool" >/dev/null 2>&1 || [ "$tool" = nginx -a -x /usr/sbin/nginx ] ||
		{ echo "bench_get: $tool missing"; exit 1; }
done
[ -x "$SALAFW" ] || { echo "bench_get: $SALAFW not built"; exit 1; }

# SMALL_ONLY=1: only the many-small-files figure (below), not the big files.
SMALL_ONLY=${SMALL_ONLY:-}
need=$(( SIZE_MB * NFILES * 2 + 256 ))
[ -n "$SMALL_ONLY" ] && need=256
avail=$(( $(df -Pk "$T" | awk 'NR==2{print $4}') / 1024 ))
[ "$avail" -ge "$need" ] || { echo "bench_get: needs $need MiB free in $T, has $avail"; exit 1; }

mkdir -p "$T/model" "$T/man/manifests/bench"
[ -n "$SMALL_ONLY" ] && NFILES=0
for i in $(seq "$NFILES"); do
	head -c $((SIZE_MB << 20)) /dev/urandom > "$T/model/shard-$i.bin"
done
minisign -G -W -p "$T/k.pub" -s "$T/k.key" -f >/dev/null 2>&1
KEYID=$(python3 -c '
import base64,sys
b=base64.b64decode(open(sys.argv[1]).read().splitlines()[1])
print("%016X" % int.from_bytes(b[2:10],"little"))' "$T/k.pub")
read -r P1 P2 < <(bash tests/nginx/start.sh "$T/nginx" "$T/model" "$T/man" "$REV" 3600) ||
	{ echo "bench_get: nginx did not start"; exit 1; }
NGPID=$(cat "$T/nginx/run.pid")
URL=http://127.0.0.1:$P1/plain
M=$T/man/manifests/bench/model.json
python3 tests/httpd/faultd.py manifest --dir "$T/model" --repo bench/model --rev "$REV" --key-id "$KEYID" \
	--source "http:$URL/" > "$M"
minisign -S -s "$T/k.key" -m "$M" -x "$M.minisig" \
	-t "salafw-manifest repo_id=bench/model revision=$REV manifest_version=1" >/dev/null 2>&1
for i in $(seq "$NFILES"); do echo "$URL/shard-$i.bin"; done > "$T/urls"

now() { date +%s.%N; }
best() { # best CMD...: fastest wall time of REPS runs, in seconds; fails if any run fails
	local b= s e d
	for _ in $(seq "$REPS"); do
		rm -rf "$O/out"; mkdir -p "$O/out"
		sync
		s=$(now)
		"$@" >"$T/log" 2>&1 || { echo "bench_get: failed: $*" >&2; tail -n 5 "$T/log" >&2; return 1; }
		e=$(now)
		d=$(echo "$e - $s" | bc -l)
		if [ -z "$b" ] || [ "$(echo "$d < $b" | bc -l)" = 1 ]; then b=$d; fi
		rm -rf "$O/out"
	done
	echo "$b"
}
# GET_ARGS: salafw's parallelism (default: 4 files at once, two ranged streams
# each; the first stream is hashed as it arrives, the rest in one pass from the
# page cache when the file is complete).
GET_ARGS=${GET_ARGS:--j 4 -x 2}
run_salafw() {
	SALAFW_STATE_DIR=$T/state-$RANDOM "$SALAFW" get bench/model --manifest "$M" -P "$T/k.pub" \
		-d "$O/out" $GET_ARGS -q
}
run_aria2() { aria2c -x4 -j4 -q --allow-overwrite=true -d "$O/out" -i "$T/urls"; }
run_curl() {
	local u
	while read -r u; do curl -sf -o "$O/out/$(basename "$u")" "$u" || return 1; done < "$T/urls"
}

# ---- many small files: NSMALL (5000) files of 13 bytes, files/s --------------
# salafw get with its defaults (every file sha256-checked, fsync'ed, renamed,
# its directory synced before the state record), against aria2c -j4 on the
# same list; SALAFW_BEFORE=path/to/an/older/salafw adds its figure, same run.
NSMALL=${NSMALL:-5000}
small() {
	# made after the big files' manifest, in a folder of the same nginx root
	local S=$T/small
	mkdir -p "$S" "$T/model/small"
	for i in $(seq "$NSMALL"); do printf 'small file %d\n' $((i % 10)) > "$T/model/small/f$i.txt"; done
	python3 tests/httpd/faultd.py manifest --dir "$T/model/small" --repo bench/small --rev "$REV" --key-id "$KEYID" \
		--source "http:$URL/small/" > "$S/small.json"
	minisign -S -s "$T/k.key" -m "$S/small.json" -x "$S/small.json.minisig" \
		-t "salafw-manifest repo_id=bench/small revision=$REV manifest_version=1" >/dev/null 2>&1
	for i in $(seq "$NSMALL"); do echo "$URL/small/f$i.txt"; done > "$S/urls"
	small_get() { SALAFW_STATE_DIR=$T/state-$RANDOM "$1" get bench/small --manifest "$S/small.json" \
		-P "$T/k.pub" -d "$O/out" -q; }
	small_aria2() { aria2c -j4 -q --allow-overwrite=true -d "$O/out" -i "$S/urls"; }
	local t_s t_a t_b=
	t_s=$(best small_get "$SALAFW") || return 1
	# the older build and aria2c take a minute or more here (5000 files at
	# ~60/s): one run each
	[ -n "${SALAFW_BEFORE:-}" ] && { t_b=$(REPS=1 best small_get "$SALAFW_BEFORE") || return 1; }
	t_a=$(REPS=1 best small_aria2) || return 1
	printf 'bench_get: %d files of 13 bytes on loopback nginx (salafw best of %d), written to %s\n' "$NSMALL" "$REPS" "${OUT_DIR:-disk}"
	printf '  salafw get (defaults: sha256, fsync)     %7.2f s  %6.0f files/s\n' "$t_s" "$(echo "$NSMALL / $t_s" | bc -l)"
	[ -n "$t_b" ] && printf '  before (%s) %7.2f s  %6.0f files/s\n' "$SALAFW_BEFORE" "$t_b" "$(echo "$NSMALL / $t_b" | bc -l)"
	printf '  aria2c -j4 (not verified, no fsync)      %7.2f s  %6.0f files/s\n' "$t_a" "$(echo "$NSMALL / $t_a" | bc -l)"
	rm -rf "$T/model/small"
}
small || exit 1
[ -n "$SMALL_ONLY" ] && exit 0

ts=$(best run_salafw) || exit 1
ta=$(best run_aria2) || exit 1
tc=$(best run_curl) || exit 1
total=$(( SIZE_MB * NFILES ))
rate() { echo "scale=0; $total * 1048576 / $1 / 1000000" | bc -l; }
printf 'bench_get: %d x %d MiB on loopback nginx (best of %d), written to %s\n' "$NFILES" "$SIZE_MB" "$REPS" "${OUT_DIR:-disk}"
printf '  salafw get %-10s (sha256 verified) %7.2f s  %5s MB/s\n' "$GET_ARGS" "$ts" "$(rate "$ts")"
printf '  aria2c -x4 -j4 (not verified)        %7.2f s  %5s MB/s\n' "$ta" "$(rate "$ta")"
printf '  curl, one file after another         %7.2f s  %5s MB/s\n' "$tc" "$(rate "$tc")"
printf '  speed ratio salafw/aria2c %.2f   salafw/curl %.2f   (>1: salafw faster)\n' \
	"$(echo "$ta / $ts" | bc -l)" "$(echo "$tc / $ts" | bc -l)"
