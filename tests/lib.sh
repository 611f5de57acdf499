# tests/lib.sh - harness for shell tests: `check DESCR CMD...` runs CMD and
# records PASS/FAIL; `check_report NAME` prints "NAME: N passed, N failed".
# Tests run from the repository root with $SALAFW pointing at the binary.
: "${BUILD:=build}"
SALAFW=${SALAFW:-$PWD/$BUILD/salafw}
GOLDEN=${SALAFW_GOLDEN:-$PWD/../shared/golden}
_passed=0
_failed=0

pass() { _passed=$((_passed + 1)); [ -n "${CHECK_VERBOSE:-}" ] && echo "PASS $*"; return 0; }
fail() { _failed=$((_failed + 1)); echo "FAIL $*"; return 0; }

# check DESCR CMD... : passes when CMD exits 0.
check() {
	local d=$1; shift
	if "$@" >/dev/null 2>&1; then pass "$d"; else fail "$d"; fi
}

# check_exit DESCR CODE CMD... : passes when CMD exits with CODE.
check_exit() {
	local d=$1 want=$2; shift 2
	"$@" >/dev/null 2>&1
	local got=$?
	if [ "$got" = "$want" ]; then pass "$d"; else fail "$d (exit $got, want $want)"; fi
}

# check_err DESCR CODE PATTERN CMD... : exit CODE and one stderr line matching PATTERN.
check_err() {
	local d=$1 want=$2 pat=$3; shift 3
	local errf; errf=$(mktemp)
	"$@" >/dev/null 2>"$errf"
	local got=$?
	if [ "$got" = "$want" ] && grep -qE -- "$pat" "$errf"; then pass "$d"
	else fail "$d (exit $got want $want; stderr: $(head -c 300 "$errf" | tr '\n' ' '))"; fi
	rm -f "$errf"
}

check_report() {
	echo "$1: $_passed passed, $_failed failed"
	[ "$_failed" = 0 ]
}

# Scratch directories, removed when the test script exits. `S=$(scratch)`
# works: the directory is recorded in a list file that the main shell's EXIT
# trap reads (a trap set inside the $( ) subshell would fire at once).
_scratch_list=$(mktemp "${TMPDIR:-/tmp}/salafw-scratch.XXXXXX")
# PIDS holds background servers a script starts; they are ended first.
# KEEP=1 keeps the directories for a look (their names are printed).
PIDS=()
_scratch_cleanup() {
	local p d
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	# a server stuck in a handler gets 5 s, then SIGKILL: never a hang here
	for p in "${PIDS[@]}"; do
		for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
		kill -9 "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	while read -r d; do
		[ -n "$d" ] || continue
		if [ -n "${KEEP:-}" ]; then echo "kept $d" >&2; else rm -rf "$d"; fi
	done <"$_scratch_list"
	rm -f "$_scratch_list"
}
trap _scratch_cleanup EXIT
scratch() {
	local d; d=$(mktemp -d "${TMPDIR:-/tmp}/salafw-test.XXXXXX")
	echo "$d" >>"$_scratch_list"
	echo "$d"
}


# faultd_serve ROOT LIFETIME NAME [faultd args]: a tests/httpd/faultd.py
# server over ROOT for LIFETIME s, logging to $T/NAME.log, its port in
# $PORT_NAME once it listens; its pid joins PIDS.
faultd_serve() {
	local root=$1 life=$2 name=$3
	shift 3
	rm -f "$T/$name.port" "$T/$name.log"
	python3 tests/httpd/faultd.py serve --root "$root" --port-file "$T/$name.port" --log "$T/$name.log" \
		--lifetime "$life" "$@" &
	PIDS+=($!)
	for _ in $(seq 100); do [ -s "$T/$name.port" ] && break; sleep 0.05; done
	eval "PORT_$name=$(cat "$T/$name.port")"
}
# json_summary FILE KEY: a field of the summary line of a --json report
json_summary() {
	python3 -c '
import json,sys
for l in open(sys.argv[1]):
    l=l.strip()
    if l.startswith("{"):
        d=json.loads(l)
        if d.get("event")=="summary": print(d[sys.argv[2]])' "$1" "$2"
}
