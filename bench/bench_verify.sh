#!/usr/bin/env bash
# bench_verify - `salafw verify` on 4 files x 1 GiB (SIZE_MB=N shrinks them)
# against sequential `sha256sum` and against `openssl dgst -sha256` on one
# core, in the same run, from a warm page cache. The manifest is written from
# sha256sum's digests, so a pass also cross-checks salafw against coreutils.
# Targets (issue #2): per-core throughput >= 0.95 x OpenSSL's single core;
# wall time <= 0.55 x sequential sha256sum on 2 cores.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
S=$PWD/$BUILD/salafw
SIZE_MB=${SIZE_MB:-1024}
NFILES=4
W=$(mktemp -d "${TMPDIR:-/tmp}/salafw-bench-verify.XXXXXX")
trap 'rm -rf "$W"' EXIT
export SALAFW_STATE_DIR=$W/state
CORES=$(nproc)
THREADS=${SALAFW_THREADS:-$CORES}
[ "$THREADS" -gt "$NFILES" ] && THREADS=$NFILES

mkdir -p "$W/model"
for i in $(seq 1 $NFILES); do
	# Fast pseudo-random bytes: AES-CTR keystream of zeros.
	openssl enc -aes-128-ctr -pass "pass:salafw$i" -nosalt -pbkdf2 </dev/zero 2>/dev/null |
		head -c $((SIZE_MB * 1048576)) >"$W/model/shard-$i.bin"
done
FILES=$(cd "$W/model" && ls shard-*.bin)
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f\n", b - a }'; }

# Warm the page cache so every contender reads from memory.
cat "$W"/model/shard-*.bin >/dev/null

t0=$(now)
(cd "$W/model" && sha256sum $FILES) >"$W/sums"
t1=$(now)
T_SHA256SUM=$(elapsed "$t0" "$t1")

# Best of REPS: the machine may be shared, and the best run is the one least
# disturbed by others.
REPS=${REPS:-3}
best() { # cmd... ; prints the smallest wall time of REPS runs
	local b= t0 t1 t
	for _ in $(seq 1 "$REPS"); do
		t0=$(now); "$@" >/dev/null; t1=$(now)
		t=$(elapsed "$t0" "$t1")
		if [ -z "$b" ] || awk -v t="$t" -v b="$b" 'BEGIN { exit !(t < b) }'; then b=$t; fi
	done
	echo "$b"
}
T_OPENSSL1=$(best openssl dgst -sha256 "$W/model/shard-1.bin") # one file, one core

# A signed manifest from sha256sum's digests.
"$S" keygen --pubkey-out "$W/k.pub" -s "$W/k.key" >/dev/null
KID=$(sed -n 's/.*key \([0-9A-F]*\)$/\1/p' "$W/k.pub")
TOTAL=$((SIZE_MB * 1048576 * NFILES))
{
	printf '{"schema_version": 1, "generator": "bench/1", "publisher": {"key_id": "%s"}, ' "$KID"
	printf '"repo_id": "bench/verify", "revision": "%040d", "manifest_version": 1, ' 0
	printf '"created": "2026-01-01T00:00:00Z", "expires": "2099-01-01T00:00:00Z", "total_size": %s, "files": [' $TOTAL
	sep=
	while read -r h p; do
		printf '%s{"path": "%s", "size": %s, "sha256": "%s"}' "$sep" "$p" $((SIZE_MB * 1048576)) "$h"
		sep=", "
	done <"$W/sums"
	printf ']}\n'
} >"$W/m.json"
"$S" sign -s "$W/k.key" "$W/m.json" >/dev/null

T_SALAFW=$(best "$S" verify "$W/model" --manifest "$W/m.json" --pubkey "$W/k.pub" --no-state --threads "$THREADS")

MB=$((SIZE_MB * NFILES))
awk -v s="$T_SALAFW" -v q="$T_SHA256SUM" -v o="$T_OPENSSL1" -v mb="$MB" -v one="$SIZE_MB" -v th="$THREADS" -v n="$NFILES" -v reps="$REPS" 'BEGIN {
	sal = mb / s; ossl = one / o; percore = sal / th;
	printf "bench_verify: salafw verify %dx%d MiB: %.2f s, %.0f MiB/s on %d threads (best of %d; digests from sha256sum)\n", n, one, s, sal, th, reps;
	printf "bench_verify: vs sha256sum sequential (%.2f s): wall ratio %.3f (target <= 0.55 on 2 cores)\n", q, s / q;
	printf "bench_verify: vs openssl dgst -sha256 per core (%.0f MiB/s): salafw per core %.0f MiB/s, ratio %.3f (target >= 0.95)\n", ossl, percore, percore / ossl;
}'
