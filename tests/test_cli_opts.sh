#!/usr/bin/env bash
# test_cli_opts.sh - one command line: every command's option table (read
# through its --help, which is generated from the table) gives each short
# letter one long name across all commands; `salafw help CMD` and the man
# page come from the same tables; --pubkey takes a key file, a base64 key or
# an installed key's name in every command that trusts a key (run too); repo
# ids are checked locally, before any network.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
T=$(scratch)
export SALAFW_STATE_DIR=$T/state

CMDS=$("$SALAFW" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p')
check "the command list is read from --help" test "$(echo $CMDS | wc -w)" -ge 10
for c in $CMDS; do "$SALAFW" "$c" --help > "$T/help.$c" 2>&1 || fail "$c --help exits 0"; done

# letters.py HELP...: "LETTER LONG CMD" rows; exit 1 when a letter has two long names
cat > "$T/letters.py" <<'PY'
import re, sys
seen = {}
for path in sys.argv[1:]:
    cmd = path.rsplit(".", 1)[1]
    for line in open(path):
        m = re.match(r"^  -(\w), --([\w-]+)", line)
        if m:
            seen.setdefault(m.group(1), {}).setdefault(m.group(2), []).append(cmd)
bad = 0
for letter, longs in sorted(seen.items()):
    if len(longs) > 1:
        bad = 1
        print("-%s means %s" % (letter, "; ".join("--%s in %s" % (l, ",".join(c)) for l, c in longs.items())))
print("letters:", " ".join("-%s=--%s" % (k, "/".join(v)) for k, v in sorted(seen.items())))
sys.exit(bad)
PY
out=$(python3 "$T/letters.py" "$T"/help.*); rc=$?
[ $rc = 0 ] && pass "no short option has two meanings across commands" || fail "short options: $out"
# the checker itself catches a clash (a table where -p is two things)
printf '  -p, --prompt TEXT  x\n' > "$T/fake.run"; printf '  -p, --pubkey FILE  x\n' > "$T/fake.verify"
python3 "$T/letters.py" "$T/fake.run" "$T/fake.verify" > "$T/clash.txt"
[ $? = 1 ] && grep -q -- "-p means" "$T/clash.txt" && pass "the checker reports a clash" || fail "checker missed a clash"
# the mapping the README documents
for pair in "p prompt" "P pubkey" "o output" "s seckey" "t threads" "x connections" "d dest" "m manifest" "j jobs" "q quiet"; do
	set -- $pair
	grep -qE "^  -$1, --$2( |$)" "$T"/help.* && pass "-$1 is --$2" || fail "-$1 is not --$2"
done
for c in get verify manifest run serve score bench quant; do
	grep -qE '^  -P, --pubkey KEY\|FILE ' "$T/help.$c" && pass "$c: -P, --pubkey KEY|FILE" || fail "$c has no -P, --pubkey KEY|FILE"
done
grep -q -- '--pubkey-out' "$T/help.keygen" && ! grep -q -- '--pubkey ' "$T/help.keygen" &&
	pass "keygen's output key is --pubkey-out, not --pubkey" || fail "keygen --pubkey"
check_err "old keygen -p is gone (it clashed with run's prompt)" 2 "unknown option '-p'" "$SALAFW" keygen -p "$T/x.pub"
check_err "old get -c is gone (run's -c is the context)" 2 "unknown option '-c'" "$SALAFW" get a/b -c 2
check_err "old mkmodel -s (seed) is gone (-s is a secret key)" 2 "unknown option '-s'" "$SALAFW" mkmodel -s 1

# help CMD = CMD --help; the man page holds every command and every option
for c in $CMDS; do
	"$SALAFW" help "$c" > "$T/h2" 2>&1
	cmp -s "$T/h2" "$T/help.$c" && pass "salafw help $c = $c --help" || fail "salafw help $c differs"
done
check_err "help of an unknown command" 2 "not a salafw command" "$SALAFW" help frob
"$SALAFW" --man > "$T/salafw.1"
for c in $CMDS; do
	u=$(echo "SALAFW $c" | tr a-z A-Z)
	grep -q "^\.SH \"$u\"" "$T/salafw.1" || fail "man page lacks a section for $c"
	for o in $(sed -n 's/^  \(-., \)\?\(    \)\?--\([a-z0-9-]*\).*/\3/p' "$T/help.$c"); do
		grep -qF -- "\\fB\\-\\-$(echo "$o" | sed 's/-/\\-/g')\\fR" "$T/salafw.1" || fail "man page lacks $c --$o"
	done
done
pass "man page: a section per command with every option"

# ---- --pubkey: a file, base64, an installed name, in every command ---------
M=$T/m
"$SALAFW" mkmodel --preset tiny -o "$M" >/dev/null 2>&1 || fail "mkmodel"
"$SALAFW" keygen --pubkey-out "$T/k.pub" -s "$T/k.key" >/dev/null || fail "keygen"
B64=$(sed -n 2p "$T/k.pub")
KID=$(python3 -c 'import base64,sys; print(base64.b64decode(sys.argv[1])[2:10][::-1].hex().upper())' "$B64")
REV=0123456789abcdef0123456789abcdef01234567
mkdir -p "$M/.salafw"
check "manifest -P BASE64" "$SALAFW" manifest "$M" --repo test/opts --revision $REV -P "$B64" -o "$M/.salafw/manifest.json"
check "... names the key's id" grep -q "\"$KID\"" "$M/.salafw/manifest.json"
check "sign" "$SALAFW" sign -s "$T/k.key" "$M/.salafw/manifest.json"
check "verify -P FILE" "$SALAFW" verify "$M" -P "$T/k.pub"
check "verify --pubkey BASE64" "$SALAFW" verify "$M" --pubkey "$B64"
check "verify --pubkey-string BASE64 (older spelling)" "$SALAFW" verify "$M" --pubkey-string "$B64"
check "run --pubkey BASE64 (was 'cannot open')" "$SALAFW" run "$M" --pubkey "$B64" -p "hello" -n 2 --greedy
check "run -P FILE" "$SALAFW" run "$M" -P "$T/k.pub" -p "hello" -n 2 --greedy
check "score --pubkey BASE64" sh -c "echo '1 2 3' > '$T/ids.txt' && '$SALAFW' score '$M' --pubkey '$B64' --ids '$T/ids.txt' -o '$T/s.safetensors'"
check "quant --pubkey BASE64" "$SALAFW" quant "$M" --pubkey "$B64" -o "$T/q" --method rtn -q
check "bench --pubkey BASE64" "$SALAFW" bench "$M" --pubkey "$B64" --prompt 8 --gen 2
# serve --pubkey BASE64: past the gate, it prints its serving line (a wrong key: exit 3)
"$SALAFW" serve "$M" --pubkey "$B64" --port 0 -t 1 2> "$T/serve.log" & spid=$!
for _ in $(seq 200); do grep -q "serving .* on http://127.0.0.1:" "$T/serve.log" && break; kill -0 $spid 2>/dev/null || break; sleep 0.05; done
check "serve --pubkey BASE64 (starts serving)" grep -q "serving .* on http://127.0.0.1:" "$T/serve.log"
kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
"$SALAFW" keygen --pubkey-out "$T/o.pub" -s "$T/o.key" >/dev/null
check_err "serve --pubkey BASE64 of another key: refused (exit 3)" 3 "was made by key $KID" \
	"$SALAFW" serve "$M" --pubkey "$(sed -n 2p "$T/o.pub")" --port 0
check "get -P BASE64 (files present: all skipped)" "$SALAFW" get test/opts --manifest "$M/.salafw/manifest.json" -P "$B64" -d "$M" -q
mkdir -p "$T/keys" && cp "$T/k.pub" "$T/keys/mine.pub"
check "verify --pubkey NAME (an installed key)" env SALAFW_KEYS_DIR="$T/keys" "$SALAFW" verify "$M" --pubkey mine
check "run --pubkey NAME" env SALAFW_KEYS_DIR="$T/keys" "$SALAFW" run "$M" --pubkey mine -p "hi" -n 1 --greedy
check_err "a key that is neither: base64 named" 3 "base64" "$SALAFW" verify "$M" -P notakey
check_err "a missing key file: cannot open (exit 5)" 5 "cannot open '$T/nope.pub'" "$SALAFW" run "$M" -P "$T/nope.pub" -p x
check_err "another key: refused naming its id" 3 "$KID" "$SALAFW" verify "$M"

# ---- repo ids, checked before any network (the endpoint is a closed port) --
CLOSED=http://127.0.0.1:9
for bad in noslash a/b/c a/-b .a/b a/b. a--b/c a/.. "/b" "a/" "a/b c" "$(printf 'a/b\033[31m')"; do
	check_err "get '$bad': not a repository id, exit 2" 2 "is not a repository id" \
		"$SALAFW" get "$bad" --endpoint "$CLOSED" --retries 0 -d "$T/g"
done
check_err "a valid id reaches the network (exit 4)" 4 "." \
	"$SALAFW" get openbmb/MiniCPM-SALA --endpoint "$CLOSED" --retries 0 -d "$T/g"
check_err "manifest --repo checks it too" 2 "is not a repository id" "$SALAFW" manifest "$M" --repo bad --revision $REV
check_err "verify --repo checks it too" 2 "is not a repository id" "$SALAFW" verify "$M" --repo a/b/c
check_err "REPO@REV and --revision must agree" 2 "disagree" \
	"$SALAFW" get a/b@$REV --revision 1111111111111111111111111111111111111111 --endpoint "$CLOSED"
check_report test_cli_opts
