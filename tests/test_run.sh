#!/usr/bin/env bash
# test_run.sh - salafw run / score / bench end to end: on the golden model
# directories (read-only, no manifest: --no-verify, or refused without it),
# on a locally signed copy (the verified-weights rule), and on a generated
# model with a tokenizer. Numbers are checked against the golden files.
. tests/lib.sh
S=$(mktemp -d "${TMPDIR:-/tmp}/salafw-run.XXXXXX")
trap 'rm -rf "$S"' EXIT
G=$GOLDEN

# Reads an int32 tensor of a safetensors file as space-separated text.
st_ints() {
	python3 - "$1" "$2" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
t = h[sys.argv[2]]; a, b = t['data_offsets']; f.seek(8 + n + a); d = f.read(b - a)
print(' '.join(str(x) for x in struct.unpack('<%di' % (len(d) // 4), d)))
PY
}

# score: golden names and values (compared by the golden test's file mode)
for c in tiny-dense tiny-cross; do
	check "score $c --taps --feed-from" $SALAFW score "$G/$c" --ids "$G/$c/golden_f32.safetensors" \
		--feed-from "$G/$c/golden_f32.safetensors" --taps -o "$S/$c.safetensors" --no-verify
	out=$($BUILD/tests/test_golden --file "$S/$c.safetensors" "$G/$c/golden_f32.safetensors")
	if echo "$out" | grep -q ': [1-9][0-9]* passed, 0 failed$'; then pass "score $c matches golden_f32"
	else fail "score $c matches golden_f32: $(echo "$out" | grep FAIL | head -3)"; fi
done
# score without --decode writes no decode tensors; text ids work too
st_ints "$G/tiny-dense/golden_f32.safetensors" input_ids > "$S/ids.txt"
check "score --ids text" $SALAFW score "$G/tiny-dense" --ids "$S/ids.txt" -o "$S/p.safetensors" --no-verify
check "score output has prefill.logits, no decode.logits" \
	bash -c "grep -aq prefill.logits '$S/p.safetensors' && ! grep -aq decode.logits '$S/p.safetensors'"
check_exit "score needs -o" 2 $SALAFW score "$G/tiny-dense" --ids "$S/ids.txt" --no-verify
check_err "score refuses a directory without a signed manifest" 1 "no signed manifest" \
	$SALAFW score "$G/tiny-dense" --ids "$S/ids.txt" -o "$S/x.safetensors"
check_err "run --no-verify says so" 0 "no-verify" \
	$SALAFW run "$G/tiny-dense" --ids "$S/ids.txt" -n 2 --greedy --no-verify
check_err "bad token id" 2 "outside the vocabulary" \
	bash -c "echo '1 5 99999' > '$S/bad.txt'; $SALAFW run '$G/tiny-dense' --ids '$S/bad.txt' -n 1 --no-verify"

# run --greedy reproduces the reference's greedy chain (17 tokens, both cases)
for c in tiny-dense tiny-sparse; do
	want=$(st_ints "$G/$c/golden_f32.safetensors" decode.tokens)
	got=$($SALAFW run "$G/$c" --ids "$G/$c/golden_f32.safetensors" --greedy -n 17 --print-ids --no-verify 2>/dev/null)
	if [ "$got" = "$want" ]; then pass "run --greedy $c equals golden decode.tokens"
	else fail "run --greedy $c: got '$got' want '$want'"; fi
done
check_err "run prints prefill and decode tok/s" 0 "prefill 200 tokens .* tok/s.*decode 3 tokens .* tok/s" \
	$SALAFW run "$G/tiny-dense" --ids "$G/tiny-dense/golden_f32.safetensors" --greedy -n 4 --no-verify
# --dense-as-sparse on tiny-dense (200 tokens = 4 blocks <= k = 6): every block is
# selected, so the greedy chain must not change.
got=$($SALAFW run "$G/tiny-dense" --ids "$G/tiny-dense/golden_f32.safetensors" --greedy -n 17 --print-ids \
	--dense-as-sparse --no-verify 2>/dev/null)
[ "$got" = "$(st_ints "$G/tiny-dense/golden_f32.safetensors" decode.tokens)" ] &&
	pass "dense-as-sparse with all blocks selected == dense" || fail "dense-as-sparse changed the greedy chain"

# bench
out=$($SALAFW bench "$G/tiny-sparse" --prompt 600 --gen 8 --no-verify 2>/dev/null)
echo "$out" | grep -qE '^prefill: [0-9.]+ tok/s' && echo "$out" | grep -qE '^decode: [0-9.]+ tok/s' &&
	pass "bench prints prefill and decode tok/s" || fail "bench output: $out"

# a signed copy: verified state holds -> runs; a touched file -> refused;
# --verify-full re-hashes (same bytes) and runs again.
export SALAFW_STATE_DIR=$S/state
mkdir -p "$S/m/.salafw"
cp "$G/tiny-dense/config.json" "$G/tiny-dense/model.safetensors" "$S/m/"
chmod u+w "$S/m"/*
check "keygen" $SALAFW keygen -p "$S/k.pub" -s "$S/k.key"
check "manifest" $SALAFW manifest "$S/m" --repo test/tiny --revision 0123456789abcdef0123456789abcdef01234567 \
	-p "$S/k.pub" -o "$S/m/.salafw/manifest.json"
check "sign" $SALAFW sign -s "$S/k.key" "$S/m/.salafw/manifest.json"
check "verify records the state" $SALAFW verify "$S/m" -p "$S/k.pub"
check "run on a verified copy" $SALAFW run "$S/m" --pubkey "$S/k.pub" --ids "$S/ids.txt" -n 2 --greedy
check_err "run with the pinned key only refuses a foreign signature" 3 "refusing" \
	$SALAFW run "$S/m" --ids "$S/ids.txt" -n 2 --greedy
sleep 0.01; touch "$S/m/model.safetensors"
check_err "run refuses a changed file" 1 "refusing to run unverified" \
	$SALAFW run "$S/m" --pubkey "$S/k.pub" --ids "$S/ids.txt" -n 2 --greedy
check "run --verify-full re-hashes and runs" $SALAFW run "$S/m" --pubkey "$S/k.pub" --ids "$S/ids.txt" -n 2 \
	--greedy --verify-full
check "score on the verified copy" $SALAFW score "$S/m" --pubkey "$S/k.pub" --ids "$S/ids.txt" -o "$S/v.safetensors"
printf 'x' >> "$S/m/model.safetensors"
check_exit "run --verify-full refuses changed bytes" 1 $SALAFW run "$S/m" --pubkey "$S/k.pub" --ids "$S/ids.txt" \
	-n 2 --greedy --verify-full

# text in, text out: a generated model with a tokenizer
if $SALAFW mkmodel --preset tiny -o "$S/t" >/dev/null 2>&1; then
	pass "mkmodel tiny"
	a=$($SALAFW run "$S/t" -p "Hello world" -n 12 --seed 7 --no-verify 2>/dev/null)
	b=$($SALAFW run "$S/t" -p "Hello world" -n 12 --seed 7 --no-verify 2>/dev/null)
	[ -n "$a" ] && [ "$a" = "$b" ] && pass "run -p is deterministic for a seed" || fail "run -p: '$a' vs '$b'"
	check "run --chat" $SALAFW run "$S/t" --chat -p "Hi" -n 8 --greedy --no-verify
	check "run --chat from stdin" bash -c "echo 'Hi there' | $SALAFW run '$S/t' --chat -n 4 --no-verify"
else
	fail "mkmodel tiny"
fi
check_exit "run needs a prompt" 2 $SALAFW run "$G/tiny-dense" --no-verify
check_exit "run -p and --ids conflict" 2 $SALAFW run "$G/tiny-dense" -p x --ids "$S/ids.txt" --no-verify
check_report test_run.sh
