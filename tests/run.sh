#!/usr/bin/env bash
# Runs every test (C binaries build/tests/test_*, shell tests tests/test_*.sh)
# and prints the closing line "N passed, N failed". A test that crashes or
# prints no summary counts as one failure. --gpu runs the tests/gpu_*.sh set.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD
passed=0 failed=0
mode=${1:-}
if [ "$mode" = --gpu ]; then
	list=$(ls tests/gpu_*.sh $BUILD/tests/gpu_* 2>/dev/null | grep -v '\.o$' | grep -v '\.d$')
else
	list=$(ls $BUILD/tests/test_* tests/test_*.sh 2>/dev/null | grep -v '\.o$' | grep -v '\.d$')
fi
for t in $list; do
	name=$(basename "$t")
	start=$(date +%s)
	# a hung test must not eat the CI budget: TEST_TIMEOUT seconds each
	if [ "${t%.sh}" != "$t" ]; then out=$(timeout -k 10 "${TEST_TIMEOUT:-1200}" bash "$t" 2>&1)
	else out=$(timeout -k 10 "${TEST_TIMEOUT:-1200}" "$t" 2>&1); fi
	rc=$?
	secs=$(( $(date +%s) - start ))
	summary=$(printf '%s\n' "$out" | grep -E '^[A-Za-z0-9_.-]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
	if [ -z "$summary" ]; then
		printf '%s\n' "$out" | tail -n 20
		echo "$name: crashed or printed no summary (exit $rc)"
		failed=$((failed + 1))
		continue
	fi
	p=$(echo "$summary" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\1/')
	f=$(echo "$summary" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\2/')
	if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
	printf '%s\n' "$out" | grep -E '^FAIL' | head -n 30
	echo "$summary (${secs}s)"
	passed=$((passed + p))
	failed=$((failed + f))
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
