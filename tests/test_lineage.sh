#!/usr/bin/env bash
# test_lineage.sh - a derived model that runs verified in one step: quant of
# a verified model writes OUT/.salafw/manifest.json with its lineage (checked
# against sha256sum of the parent's manifest), signs it with the user's own
# key (checked with the real minisign CLI), and `run OUT` then works with no
# flags and says whose key and which parent. Every refusal names a command;
# the test runs the command it names and retries. The user key is refused
# for a manifest that claims a publisher's (pinned) repo or no lineage.
. tests/lib.sh
S=$(scratch)
export XDG_CONFIG_HOME=$S/config SALAFW_STATE_DIR=$S/state
M=$S/model Q=$S/model-w8

# the command a refusal names ("CMD: fix: salafw ..."), run as it is printed
fix_of() { sed -n 's/^salafw [a-z]*: refusing to run unverified weights; fix: salafw \([^(]*\).*/\1/p' "$1" | head -n 1 | sed 's/ *$//'; }
run_fix() { # DESCR STDERR-FILE : runs the named salafw command
	local c; c=$(fix_of "$2")
	if [ -z "$c" ]; then fail "$1: no fix command in: $(head -c 300 "$2" | tr '\n' ' ')"; return 1; fi
	# shellcheck disable=SC2086 # the printed command, word-split as a user's shell would
	if $SALAFW $c >/dev/null 2>"$S/fix.err"; then pass "$1: 'salafw $c' ran"
	else fail "$1: 'salafw $c' failed: $(head -c 300 "$S/fix.err")"; return 1; fi
}

# a publisher's model, verified with its key
$SALAFW mkmodel --preset tiny --seed 3 -o "$M" >/dev/null
$SALAFW keygen --pubkey-out "$S/pub.pub" -s "$S/pub.key" >/dev/null
REV=$(sha1sum "$M/config.json" | cut -c1-40)
$SALAFW manifest "$M" --repo salafw/tiny-sala --revision "$REV" -o "$S/m.json" >/dev/null
$SALAFW sign -s "$S/pub.key" "$S/m.json" >/dev/null
check "the publisher's model verifies" $SALAFW verify "$M" --manifest "$S/m.json" --pubkey "$S/pub.pub"
PUBID=$(sed -n 's/.*minisign public key \([0-9A-F]*\).*/\1/p' "$S/pub.pub")

# one step: quant signs the derived model with the user's key (made on first use)
check_err "quant of a verified model signs OUT with a new local key" 0 "created your local signing key" \
	$SALAFW quant "$M" -o "$Q" --method rtn --group 64 --pubkey "$S/pub.pub"
check "the user key is mode 0600 in a 0700 folder" \
	test "$(stat -c %a "$XDG_CONFIG_HOME/salafw/user.key")" = 600 -a "$(stat -c %a "$XDG_CONFIG_HOME/salafw")" = 700
UID_=$(sed -n 's/.*minisign public key \([0-9A-F]*\).*/\1/p' "$XDG_CONFIG_HOME/salafw/user.pub")
r=$(python3 - "$Q/.salafw/manifest.json" "$(sha256sum "$M/.salafw/manifest.json" | cut -c1-64)" "$REV" "$PUBID" \
	"$UID_" "$($SALAFW --version | head -n 1)" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); sha, rev, pubid, uid, ver = sys.argv[2:7]
l = m['lineage']; p = l['parent']
want = {'parent.repo_id': (p['repo_id'], 'salafw/tiny-sala'), 'parent.revision': (p['revision'], rev),
        'parent.manifest_sha256': (p['manifest_sha256'], sha), 'parent.key_id': (p['key_id'], pubid),
        'method': (l['method'], 'rtn'), 'group_size': (l['params']['group_size'], '64'),
        'publisher': (m['publisher']['key_id'], uid), 'repo_id': (m['repo_id'], 'local/model-w8')}
bad = ['%s=%r want %r' % (k, a, b) for k, (a, b) in want.items() if a != b]
if l['derived_by'].split('/')[-1] not in ver: bad.append('derived_by %r vs version %r' % (l['derived_by'], ver))
print('ok' if not bad else ' '.join(bad))
PY
)
[ "$r" = ok ] && pass "lineage: parent repo, revision, manifest sha256 (= sha256sum), key id; method, params, version" ||
	fail "lineage fields: $r"
check "minisign -V accepts OUT's manifest with the user's public key" \
	minisign -V -q -p "$XDG_CONFIG_HOME/salafw/user.pub" -m "$Q/.salafw/manifest.json"
cp "$Q/.salafw/manifest.json" "$S/t.json" && cp "$Q/.salafw/manifest.json.minisig" "$S/t.json.minisig"
sed -i 's/"method": "rtn"/"method": "awq"/' "$S/t.json"
check_exit "minisign -V refuses an edited lineage" 1 minisign -V -q -p "$XDG_CONFIG_HOME/salafw/user.pub" -m "$S/t.json"

check_err "run OUT works verified with no flags, naming the local key and the parent" 0 \
	"verified: signed by your local key $UID_, derived from salafw/tiny-sala@$REV" \
	$SALAFW run "$Q" -p "The weights" -n 4 --greedy
out=$($SALAFW verify "$Q" 2>&1)
case $out in *"(your local key)"*"lineage: derived from salafw/tiny-sala@$REV: rtn"*"verified "*) pass "verify OUT shows the lineage";;
*) fail "verify OUT: $(echo "$out" | head -c 400)";; esac
j=$($SALAFW verify "$Q" --json 2>/dev/null | python3 -c "import json,sys; o=json.load(sys.stdin); print(o['ok'], o['signature']['local_key'], o['lineage']['parent']['revision'])")
[ "$j" = "True True $REV" ] && pass "verify --json reports the lineage" || fail "verify --json: $j"
check_err "without --pubkey the publisher-signed parent is refused, naming --pubkey" 3 "fix: pass --pubkey" \
	$SALAFW run "$M" -p x -n 1

# refusals name the command that fixes them; run it, then retry
$SALAFW quant "$M" -o "$S/q2" --method rtn --pubkey "$S/pub.pub" --no-sign -q 2>/dev/null
check_err "an unsigned derived model is refused, naming sign --user" 1 "fix: salafw sign --user $S/q2" \
	$SALAFW run "$S/q2" -p x -n 1
$SALAFW run "$S/q2" -p x -n 1 >/dev/null 2>"$S/e"
run_fix "unsigned derived model" "$S/e" && check "... then run works" $SALAFW run "$S/q2" -p x -n 1

rm -rf "$S/q2/.salafw"
check_err "verify of a derived model without a manifest names sign --user" 1 \
	"has no signed manifest in .salafw/ \(a model you derived; fix: salafw sign --user $S/q2\)" $SALAFW verify "$S/q2"
check_err "a derived model without a manifest is refused, naming sign --user" 1 "fix: salafw sign --user" \
	$SALAFW run "$S/q2" -p x -n 1
$SALAFW run "$S/q2" -p x -n 1 >/dev/null 2>"$S/e"
run_fix "derived model without a manifest" "$S/e" && check "... then run works" $SALAFW run "$S/q2" -p x -n 1
check_err "... and says it was signed later, parent unknown" 0 "derived from a model that was not verified" \
	$SALAFW run "$S/q2" -p x -n 1

touch "$Q/config.json"
check_err "a file changed since it was verified is refused, naming verify" 1 "fix: salafw verify $Q" \
	$SALAFW run "$Q" -p x -n 1
$SALAFW run "$Q" -p x -n 1 >/dev/null 2>"$S/e"
run_fix "changed file" "$S/e" && check "... then run works" $SALAFW run "$Q" -p x -n 1

mkdir -p "$S/plain" && cp "$M"/*.json "$M"/*.safetensors "$S/plain/" 2>/dev/null
check_err "a model without a manifest is refused, naming get" 1 "fix: salafw get ORG/NAME@REVISION -d $S/plain" \
	$SALAFW run "$S/plain" -p x -n 1
mv "$M/tokenizer.model" "$S/tok.bak"
check_err "a missing model file is refused, naming the get that re-fetches only it" 1 \
	"fix: salafw get salafw/tiny-sala@$REV -d $M --include tokenizer.model" \
	$SALAFW run "$M" -p x -n 1 --pubkey "$S/pub.pub"
mv "$S/tok.bak" "$M/tokenizer.model"
check_err "a nonexistent model directory says so" 5 "cannot open directory '$S/nope': No such file or directory" \
	$SALAFW run "$S/nope" -p x -n 1
check_err "... quant too" 5 "cannot open directory '$S/nope': No such file or directory" $SALAFW quant "$S/nope" -o "$S/x"

# the user key is never a publisher's: a user-signed manifest claiming the
# pinned repo (or lacking a lineage) is refused by run and verify
forge() { # REPO [drop-lineage]
	python3 - "$Q/.salafw/manifest.json" "$1" "${2:-}" <<'PY'
import json, sys, re
p, repo, drop = sys.argv[1:4]
t = open(p).read()
t = t.replace('"repo_id": "local/model-w8"', '"repo_id": "%s"' % repo)
if drop: t = re.sub(r'\n  "lineage": .*,', '', t)
# a newer version: the rollback record of the genuine one must not be what refuses it
t = re.sub(r'"manifest_version": (\d+)', lambda m: '"manifest_version": %d' % (int(m.group(1)) + 1), t)
open(p, 'w').write(t)
PY
	$SALAFW sign -s "$XDG_CONFIG_HOME/salafw/user.key" "$Q/.salafw/manifest.json" >/dev/null
}
cp "$Q/.salafw/manifest.json" "$S/good.json"
forge openbmb/MiniCPM-SALA
check_err "run refuses the user key for the pinned publisher repo" 3 "claims the pinned publisher repo 'openbmb/MiniCPM-SALA'" \
	$SALAFW run "$Q" -p x -n 1
check_err "verify refuses it too" 3 "claims the pinned publisher repo" $SALAFW verify "$Q"
cp "$S/good.json" "$Q/.salafw/manifest.json"
forge someone/model
check_err "run refuses the user key for a repo outside local/" 3 "trusted only for derived models" \
	$SALAFW run "$Q" -p x -n 1
cp "$S/good.json" "$Q/.salafw/manifest.json"
forge local/model-w8 drop
check_err "run refuses a user-signed manifest without a lineage" 3 "trusted only for derived models" \
	$SALAFW run "$Q" -p x -n 1
cp "$S/good.json" "$Q/.salafw/manifest.json"
$SALAFW sign -s "$XDG_CONFIG_HOME/salafw/user.key" "$Q/.salafw/manifest.json" >/dev/null
check "the genuine derived manifest runs again" $SALAFW run "$Q" -p x -n 1

# the local key signs only what the user derived
cp "$M/.salafw/manifest.json.minisig" "$S/pubsig.bak"
check_err "sign --user refuses a publisher's manifest" 3 "not a model you derived|names publisher key" \
	$SALAFW sign --user "$M"
check "... and leaves its signature as it was" cmp "$M/.salafw/manifest.json.minisig" "$S/pubsig.bak"
check_err "sign --user refuses a directory that is no salafw quant output" 1 "not a model salafw quant wrote" \
	$SALAFW sign --user "$S/plain"

# a new user's own model (mkmodel: no repo, no manifest), following only the
# messages: quant's refusal names --no-verify; quant with it names the sign
# command; after that command, run works verified
$SALAFW mkmodel --preset tiny --seed 5 -o "$S/own" >/dev/null
check_err "a model of one's own is refused, naming --no-verify" 1 "no repo signed \(salafw mkmodel\): add --no-verify" \
	$SALAFW quant "$S/own" -o "$S/own-w8" --method rtn
$SALAFW quant "$S/own" -o "$S/own-w8" --method rtn --no-verify 2>"$S/e" >/dev/null
c=$(sed -n 's/.*to run it verified: salafw \(sign --user [^ ]*\)$/\1/p' "$S/e")
# shellcheck disable=SC2086 # the printed command, word-split as a user's shell would
[ -n "$c" ] && $SALAFW $c >/dev/null 2>&1 && pass "quant --no-verify names 'salafw $c', which ran" ||
	fail "quant --no-verify: no sign command that works in: $(head -c 300 "$S/e")"
check_err "... then run works verified, saying the parent was not verified" 0 \
	"verified: signed by your local key [0-9A-F]+, derived from a model that was not verified" \
	$SALAFW run "$S/own-w8" -p x -n 1

# --no-verify: the output is not signed unless asked, and says how
check_err "quant --no-verify leaves the manifest unsigned and names sign --user" 0 "salafw sign --user $S/q3" \
	$SALAFW quant "$M" -o "$S/q3" --method rtn --no-verify
check "... whose lineage has no parent" python3 -c "import json,sys; l=json.load(open('$S/q3/.salafw/manifest.json'))['lineage']; sys.exit('parent' in l)"
check_err "verify of the unsigned derived model: exit 1 as run, naming sign --user" 1 \
	"the manifest of the derived model '$S/q3' is not signed \(fix: salafw sign --user $S/q3\)" $SALAFW verify "$S/q3"
check "... which, run, makes verify pass" sh -c "'$SALAFW' sign --user '$S/q3' >/dev/null 2>&1 && '$SALAFW' verify '$S/q3' >/dev/null 2>&1"

check_report test_lineage.sh
