#!/usr/bin/env bash
# test_get_sched.sh - `salafw get` choosing its sources by measured speed
# (issue 12, "Downloads that use the best source"), against fault servers
# (tests/httpd/faultd.py) started and stopped here: a slow first mirror
# (--rate) beside a fast one, a first mirror that sends 2 MB then stalls on
# every connection (stall:N), the only source ignoring Range and dropping
# (--norange --fault drop:N --times K), and the --limit-rate cap. Every server
# and every get is bounded in time. Assertions compare against sha256sum and
# the servers' own logs (bytes each one sent, requests each one answered);
# the rate cap is a lower bound on the wall time around the command (a limit
# being kept, not a speed claim).
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
T=$(scratch)
FAULTD="python3 tests/httpd/faultd.py"
REPO=test/sched
REV=0123456789abcdef0123456789abcdef01234567
G() { SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") timeout 90 "$SALAFW" get "$@"; }

# ---- fixture: one 20 MB file (200 s at 100 KB/s), a small one, a key ------
BIG=20000000
mkdir -p "$T/model"
head -c $BIG /dev/urandom > "$T/model/big.bin"
echo '{"hidden_size": 8}' > "$T/model/config.json"
(cd "$T/model" && sha256sum big.bin config.json) > "$T/SUMS"
minisign -G -W -p "$T/k.pub" -s "$T/k.key" -f >/dev/null 2>&1 || { echo "FAIL minisign -G"; exit 1; }
KEYID=$(python3 -c '
import base64,sys
b=base64.b64decode(open(sys.argv[1]).read().splitlines()[1])
print("%016X" % int.from_bytes(b[2:10],"little"))' "$T/k.pub")
mkman() {
	local out=$1; shift
	$FAULTD manifest --dir "$T/model" --repo "$REPO" --rev "$REV" --key-id "$KEYID" "$@" > "$out" || return 1
	minisign -S -s "$T/k.key" -m "$out" -x "$out.minisig" \
		-t "salafw-manifest repo_id=$REPO revision=$REV manifest_version=1" >/dev/null 2>&1
}
faultd() { faultd_serve "$T/model" 120 "$@"; }
tree_ok() { (cd "$1" && sha256sum --quiet -c "$T/SUMS") >/dev/null 2>&1; }
summary() { json_summary "$@"; }
# sent LOG PATH: body bytes a faultd sent for PATH; asked LOG PATH: requests for it
sent() { python3 -c '
import json,sys
print(sum(d["sent"] for d in map(json.loads, open(sys.argv[1])) if d["path"]==sys.argv[2]))' "$1" "$2"; }
asked() { python3 -c '
import json,sys
print(sum(1 for d in map(json.loads, open(sys.argv[1])) if d["path"]==sys.argv[2]))' "$1" "$2"; }
now() { date +%s.%N; }
elapsed() { python3 -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$1" "$2"; }
le() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$1" "$2"; }

# ---- 1. a 100 KB/s first mirror beside a fast second one ---------------------
# Alone the slow one needs 200 s for big.bin; its remaining range must go to the
# fast one once both are measured.
faultd slow --rate 100000
faultd fast
mkman "$T/m1.json" --source "http:http://127.0.0.1:$PORT_slow/" --source "http:http://127.0.0.1:$PORT_fast/"
s=$(now)
G "$REPO" --manifest "$T/m1.json" -P "$T/k.pub" -d "$T/d1" --json > "$T/o1" 2> "$T/e1"
el=$(elapsed "$s" "$(now)")
check "slow first mirror: exit 0" test "$(summary "$T/o1" exit)" = 0
check "slow first mirror: tree matches sha256sum -c" tree_ok "$T/d1"
check "slow first mirror: done in ${el} s, far below its 200 s alone (bound 30 s)" le "$el" 30
ss=$(sent "$T/slow.log" big.bin) fs=$(sent "$T/fast.log" big.bin)
check "slow first mirror: the fast one served most of big.bin ($fs of $BIG bytes; slow $ss)" \
	test "$fs" -ge $((BIG * 9 / 10))
check "slow first mirror: it was asked first (order kept as the preference)" test "$(asked "$T/slow.log" big.bin)" -ge 1
check "slow first mirror: demoted, saying why" grep -q '"event":"source_demoted".*faster source' "$T/o1"
check "slow first mirror: config.json (small) still from the first source" test "$(asked "$T/slow.log" config.json)" = 1

# ---- 2. comparable speeds: the order of sources decides ---------------------
faultd eq1
faultd eq2
mkman "$T/m2.json" --source "http:http://127.0.0.1:$PORT_eq1/" --source "http:http://127.0.0.1:$PORT_eq2/"
G "$REPO" --manifest "$T/m2.json" -P "$T/k.pub" -d "$T/d2" --json > "$T/o2" 2>/dev/null
check "equal mirrors: tree verifies" tree_ok "$T/d2"
check "equal mirrors: the first served all of big.bin" test "$(sent "$T/eq1.log" big.bin)" = "$BIG"
check "equal mirrors: the second never asked" test "$(asked "$T/eq2.log" big.bin)" = 0
check "equal mirrors: nobody demoted" test "$(grep -c source_demoted "$T/o2")" = 0

# ---- 3. a first mirror that sends 2 MB, then stalls, on every connection ----
faultd drip --fault stall:2000000
faultd fast3
mkman "$T/m3.json" --source "http:http://127.0.0.1:$PORT_drip/" --source "http:http://127.0.0.1:$PORT_fast3/"
s=$(now)
G "$REPO" --manifest "$T/m3.json" -P "$T/k.pub" -d "$T/d3" --stall-timeout 2 --retry-wait 10 --json > "$T/o3" 2>/dev/null
el=$(elapsed "$s" "$(now)")
check "drip first mirror: exit 0" test "$(summary "$T/o3" exit)" = 0
check "drip first mirror: tree verifies" tree_ok "$T/d3"
n=$(asked "$T/drip.log" big.bin)
check "drip first mirror: asked for big.bin at most 3 times ($n)" test "$n" -le 3
check "drip first mirror: done in ${el} s (bound 20 s)" le "$el" 20
check "drip first mirror: the fast one served the rest ($(sent "$T/fast3.log" big.bin) bytes)" \
	test "$(sent "$T/fast3.log" big.bin)" -ge $((BIG - 3 * 2000000))

# ---- 4. drip first, the second ignores Range (so no range can be moved to it
# while the first runs): the first is struck after a bounded number of stalls
faultd nr4 --norange
mkman "$T/m4.json" --source "http:http://127.0.0.1:$PORT_drip/" --source "http:http://127.0.0.1:$PORT_nr4/"
: > "$T/drip.log"
G "$REPO" --manifest "$T/m4.json" -P "$T/k.pub" -d "$T/d4" --stall-timeout 1 --retry-wait 10 --json > "$T/o4" 2>/dev/null
check "drip + norange second: exit 0" test "$(summary "$T/o4" exit)" = 0
check "drip + norange second: tree verifies" tree_ok "$T/d4"
n=$(asked "$T/drip.log" big.bin)
# 3 stalls; one more request when the probe of the second source (a ranged
# request, answered with the whole file) gave its range back to the first
check "drip + norange second: drip struck after 3 stalls ($n requests <= 4; resuming it to the end takes 10)" test "$n" -le 4
check "drip + norange second: struck, saying why" grep -q 'stalled 3 times after sending some data' "$T/o4"

# ---- 5. the only source ignores Range and drops: from byte 0, within the budget
faultd nrd --norange --fault drop:3000000 --times 4 --only big.bin
mkman "$T/m5.json" --source "http:http://127.0.0.1:$PORT_nrd/"
G "$REPO" --manifest "$T/m5.json" -P "$T/k.pub" -d "$T/d5" -x 1 --retry-wait 10 --json > "$T/o5" 2>/dev/null
check "only source, norange + drops: exit 0" test "$(summary "$T/o5" exit)" = 0
check "only source, norange + drops: tree verifies" tree_ok "$T/d5"
check "only source, norange + drops: restarts from byte 0 said so" grep -q 'starting the file over from byte 0' "$T/o5"
n=$(asked "$T/nrd.log" big.bin)
check "only source, norange + drops: at most 5 requests for big.bin ($n)" test "$n" -le 5
# ... and past the budget it gives up (bounded), exit 4
faultd nrd2 --norange --fault drop:1000000 --only big.bin
mkman "$T/m5b.json" --source "http:http://127.0.0.1:$PORT_nrd2/"
G "$REPO" --manifest "$T/m5b.json" -P "$T/k.pub" -d "$T/d5b" -x 1 --retries 2 --retry-wait 10 --json > "$T/o5b" 2>/dev/null
check "norange + drops past --retries 2: exit 4" test "$(summary "$T/o5b" exit)" = 4
n=$(asked "$T/nrd2.log" big.bin)
check "norange + drops past --retries 2: bounded ($n requests <= 5)" test "$n" -le 5
check "norange + drops past the budget: no big.bin" test ! -e "$T/d5b/big.bin"

# ---- 6. --limit-rate caps the sum over parallel transfers ---------------------
mkdir -p "$T/model6"
head -c 3000000 /dev/urandom > "$T/model6/a.bin"
head -c 1000000 /dev/urandom > "$T/model6/b.bin"
(cd "$T/model6" && sha256sum a.bin b.bin) > "$T/SUMS6"
faultd r6 --root "$T/model6"
$FAULTD manifest --dir "$T/model6" --repo "$REPO" --rev "$REV" --key-id "$KEYID" \
	--source "http:http://127.0.0.1:$PORT_r6/" > "$T/m6.json"
minisign -S -s "$T/k.key" -m "$T/m6.json" -x "$T/m6.json.minisig" \
	-t "salafw-manifest repo_id=$REPO revision=$REV manifest_version=1" >/dev/null 2>&1
s=$(now)
G "$REPO" --manifest "$T/m6.json" -P "$T/k.pub" -d "$T/d6" -j 2 -x 4 --segment-size 256K --limit-rate 1M -q \
	>/dev/null 2>&1
rc=$?
el=$(elapsed "$s" "$(now)")
check "limit-rate 1M: exit 0" test "$rc" = 0
check "limit-rate 1M: files verify" sh -c "cd '$T/d6' && sha256sum --quiet -c '$T/SUMS6'"
# 4000000 bytes at 1048576 B/s: 3.81 s; at least 0.8 of it
check "limit-rate 1M: 4 MB over 8 transfers took ${el} s >= 3.05 s" le 3.05 "$el"
n=$(python3 -c 'import json,sys; print(len({(d["path"],d["range"]) for d in map(json.loads, open(sys.argv[1]))}))' "$T/r6.log")
check "limit-rate 1M: really several transfers ($n distinct requests)" test "$n" -ge 6
check_exit "limit-rate garbage: usage error" 2 "$SALAFW" get "$REPO" --manifest "$T/m6.json" --limit-rate 1Q
check_exit "limit-rate overflow: usage error" 2 "$SALAFW" get "$REPO" --manifest "$T/m6.json" --limit-rate 99999999999999G

# ---- 7. many small files: each durable before the state record names it -----
# The batched finish (fsyncs in parallel, then renames, then one fsync per
# directory) must keep the order a crash needs, checked from strace's own
# record of the syscalls: every partial's fsync completed before its rename,
# every directory a file was renamed into synced after its last rename and
# before state.json was put in place.
mkdir -p "$T/model7/sub"
for i in $(seq 40); do printf 'small file %d\n' $((i % 10)) > "$T/model7/f$i.txt"; done
for i in $(seq 10); do printf 'small sub %d\n' "$i" > "$T/model7/sub/g$i.txt"; done
faultd r7 --root "$T/model7"
$FAULTD manifest --dir "$T/model7" --repo "$REPO" --rev "$REV" --key-id "$KEYID" \
	--source "http:http://127.0.0.1:$PORT_r7/" > "$T/m7.json"
minisign -S -s "$T/k.key" -m "$T/m7.json" -x "$T/m7.json.minisig" \
	-t "salafw-manifest repo_id=$REPO revision=$REV manifest_version=1" >/dev/null 2>&1
command -v strace >/dev/null || echo "FAIL strace missing (scripts/setup.sh installs it)"
SALAFW_STATE_DIR=$T/state7 timeout 60 strace -f -y -qq -e trace=fsync,fdatasync,rename,renameat,renameat2 \
	-o "$T/trace7" "$SALAFW" get "$REPO" --manifest "$T/m7.json" -P "$T/k.pub" -d "$T/d7" -q >/dev/null 2>&1
check "small files: all 50 in place and verified" sh -c "cd '$T/model7' && find . -type f | sort | \
	xargs sha256sum > '$T/SUMS7' && cd '$T/d7' && sha256sum --quiet -c '$T/SUMS7'"
order7() { python3 - "$T/trace7" "$T/m7.json" "$T/d7" <<'PY'
import json, os, re, sys
lines = open(sys.argv[1]).read().splitlines()
files = [f["path"] for f in json.load(open(sys.argv[2]))["files"]]
dest = os.path.realpath(sys.argv[3])
def tag(p):
    h = 14695981039346656037
    for b in p.encode(): h = ((h ^ b) * 1099511628211) % 2**64
    return "%016x" % h
done_at, pending = {}, {}   # fsync'ed path -> index of its completion
renames = []                # (index, source text, target basename, target dir)
for i, l in enumerate(lines):
    m = re.match(r"^(\d+)\s+(.*)$", l)  # strace pads short pids
    if not m: continue
    pid, rest = m.groups()
    fm = re.match(r"^f(?:data)?sync\(\d+<([^>]*)>\)?(.*)$", rest)
    if fm:
        if "unfinished" in fm.group(2): pending[pid] = fm.group(1)
        elif fm.group(2).strip().endswith("= 0") or rest.endswith("= 0"): done_at.setdefault(fm.group(1), []).append(i)
        continue
    if rest.startswith("<... f") and "resumed" in rest and rest.endswith("= 0") and pid in pending:
        done_at.setdefault(pending.pop(pid), []).append(i)
        continue
    if re.match(r"^rename(at2?)?\(", rest) and rest.endswith("= 0"):
        q = re.findall(r'"([^"]*)"', rest)
        dirs = re.findall(r"<([^>]*)>", rest)
        tgt = q[-1]
        tdir = os.path.dirname(tgt) if "/" in tgt or not dirs else dirs[-1]
        if "/" in tgt and not tgt.startswith("/"):
            tdir = os.path.realpath(os.path.dirname(tgt))
        renames.append((i, rest, os.path.basename(tgt), os.path.realpath(tdir)))
bad = []
state = [r for r in renames if r[2] == "state.json"]
if not state: bad.append("no rename of state.json")
state_i = state[-1][0] if state else 0
last_into = {}
for f in files:
    base, fdir = os.path.basename(f), os.path.realpath(os.path.join(dest, os.path.dirname(f)))
    rn = [r for r in renames if r[2] == base and r[3] == fdir and (tag(f) + ".part") in r[1]]
    if not rn: bad.append("no rename into place of " + f); continue
    ri = rn[-1][0]
    fs = [i for p, v in done_at.items() if p.endswith("-" + tag(f) + ".part") for i in v]
    if not fs or min(fs) > ri: bad.append("%s renamed before its fsync completed" % f)
    last_into[fdir] = max(last_into.get(fdir, 0), ri)
    if ri > state_i: bad.append("%s renamed after the state record" % f)
for d, ri in last_into.items():
    ds = [i for i in done_at.get(d, []) if ri < i < state_i]
    if not ds: bad.append("directory %s not synced between its last rename and the state record" % d)
print("\n".join(bad) if bad else "ok: %d files, %d directories" % (len(files), len(last_into)))
sys.exit(1 if bad else 0)
PY
}
o7=$(order7 2>&1)
check "small files: fsync -> rename -> directory fsync -> state record, for every file (${o7%%$'\n'*})" test "$o7" = "ok: 50 files, 2 directories"
[ "${o7#ok}" = "$o7" ] && printf '%s\n' "$o7" | head -5

check_report test_get_sched
