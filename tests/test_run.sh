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
check "keygen" $SALAFW keygen --pubkey-out "$S/k.pub" -s "$S/k.key"
check "manifest" $SALAFW manifest "$S/m" --repo test/tiny --revision 0123456789abcdef0123456789abcdef01234567 \
	-P "$S/k.pub" -o "$S/m/.salafw/manifest.json"
check "sign" $SALAFW sign -s "$S/k.key" "$S/m/.salafw/manifest.json"
check "verify records the state" $SALAFW verify "$S/m" -P "$S/k.pub"
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
	# a chat message with a NUL byte is refused, not cut short; over 64 MiB is "too long"
	check_err "run --chat refuses a NUL on stdin" 5 "^salafw run: --chat: standard input holds a NUL byte" \
		bash -c "printf 'Hi\\0there' | $SALAFW run '$S/t' --chat -n 4 --no-verify"
	check_err "run --chat: over 64 MiB on stdin is too long" 5 "^salafw run: --chat: .* too long \(limit 64 MiB\)" \
		bash -c "head -c $((64 * 1048576 + 1)) /dev/zero | tr '\\0' a | $SALAFW run '$S/t' --chat -n 4 --no-verify"
	# output that cannot be written is exit 5, in text and in --print-ids mode
	check_err "run > /dev/full exits 5" 5 "cannot write to standard output" \
		bash -c "$SALAFW run '$S/t' -p Hello -n 4 --greedy --no-verify > /dev/full"
	check_err "run --print-ids > /dev/full exits 5" 5 "cannot write to standard output" \
		bash -c "$SALAFW run '$S/t' -p Hello -n 4 --greedy --print-ids --no-verify > /dev/full"
else
	fail "mkmodel tiny"
fi
check_exit "run needs a prompt" 2 $SALAFW run "$G/tiny-dense" --no-verify
check_exit "run -p and --ids conflict" 2 $SALAFW run "$G/tiny-dense" -p x --ids "$S/ids.txt" --no-verify

# Option values: each bad one is a usage error (exit 2) with one line naming
# the option as typed and the problem.
D="$G/tiny-dense"
R="$SALAFW run $D --ids $S/ids.txt --no-verify"
check_err "run -n too large" 2 "^salafw run: -n must be at most 16777216 \(see --help\)" $R -n 16777217
check_err "run --top-k too large" 2 "^salafw run: --top-k must be at most 2147483647" $R --top-k 2147483648
check_err "run --max-context too large" 2 "^salafw run: --max-context must be at most 1073741824" \
	$R --max-context 1073741825
check_err "run --prefill-chunk 0" 2 "^salafw run: --prefill-chunk must be 1 to 1048576 \(see --help\)" $R --prefill-chunk 0
check_err "run --threads too large" 2 "^salafw run: --threads must be at most 256" $R --threads 257
check_err "run --kv-cache fp16" 2 "^salafw run: --kv-cache must be bf16 or fp8" $R --kv-cache fp16
check_err "SALAFW_KV_CACHE=x" 2 "^salafw run: SALAFW_KV_CACHE must be bf16 or fp8" env SALAFW_KV_CACHE=x $R
check_err "serve --kv-cache x" 2 "^salafw serve: --kv-cache must be bf16 or fp8" $SALAFW serve "$D" --no-verify --kv-cache x
check_err "score --decode too large" 2 "^salafw score: --decode must be at most 1048576 \(see --help\)" \
	$SALAFW score "$D" --ids "$S/ids.txt" -o "$S/x.safetensors" --no-verify --decode 1048577
check_err "score --chunk 0" 2 "^salafw score: --chunk must be 1 to 1048576 \(see --help\)" \
	$SALAFW score "$D" --ids "$S/ids.txt" -o "$S/x.safetensors" --no-verify --chunk 0
check_err "bench --prompt 0" 2 "^salafw bench: --prompt must be 1 to 16777216 \(see --help\)" \
	$SALAFW bench "$D" --no-verify --prompt 0
check_err "bench --gen too large" 2 "^salafw bench: --gen must be at most 16777216" $SALAFW bench "$D" --no-verify --gen 16777217
check_err "bench --prefill-chunk 0" 2 "^salafw bench: --prefill-chunk must be 1 to" \
	$SALAFW bench "$D" --no-verify --prefill-chunk 0
check_err "bench --max-context too large" 2 "^salafw bench: --max-context must be at most 1073741824" \
	$SALAFW bench "$D" --no-verify --max-context 1073741825
# the option is named once with its dashes ("--temp", not "----temp")
check_err "run --temp x names --temp" 2 "^salafw run: --temp: 'x' is not a number$" $R --temp x
check_err "run -n x names -n" 2 "^salafw run: -n: 'x' is not a non-negative integer$" $R -n x
check_err "run --seed ' -1' is not wrapped to 2^64-1" 2 "^salafw run: --seed: ' -1' is not a non-negative integer$" \
	$R --seed ' -1'
check_err "score --decode x names --decode" 2 "^salafw score: --decode: 'x' is not a non-negative integer$" \
	$SALAFW score "$D" --ids "$S/ids.txt" -o "$S/x.safetensors" --no-verify --decode x
check_err "bench --gen x names --gen" 2 "^salafw bench: --gen: 'x' is not a non-negative integer$" \
	$SALAFW bench "$D" --no-verify --gen x
check_err "verify --threads x names --threads" 2 "^salafw verify: --threads: 'x' is not a non-negative integer$" \
	$SALAFW verify "$D" --threads x
# sampler values are refused before any model is opened (the directory does not exist)
N="$SALAFW run $S/no-such-model -p x --no-verify"
check_err "run --temp -1 before loading" 2 "^salafw run: --temp -1 is negative" $N --temp -1
check_err "run --temp nan" 2 "^salafw run: --temp: 'nan' is not a finite number$" $N --temp nan
check_err "run --temp inf" 2 "^salafw run: --temp: 'inf' is not a finite number$" $N --temp inf
check_err "run --temp 1e-40 (1/T overflows)" 2 "use --temp 0 for greedy" $N --temp 1e-40
check_err "run --temp 1e-400 is not read as 0" 2 "^salafw run: --temp: '1e-400' is too close to zero$" $N --temp 1e-400
check_err "run --top-p 0" 2 "^salafw run: --top-p 0 must be in \(0, 1\]" $N --top-p 0
check_err "run --top-p 1.5" 2 "^salafw run: --top-p 1.5 must be in \(0, 1\]" $N --top-p 1.5
check_err "run --top-k -1" 2 "^salafw run: --top-k: '-1' is not a non-negative integer$" $N --top-k -1
check "run --temp 1e-6 samples" $R --temp 1e-6 -n 2

# input files: exit 5 naming the option and file, never 1 ("verification failed")
check_err "run --ids missing file exits 5" 5 "^salafw run: --ids: cannot open '$S/nope.txt'" $R --ids "$S/nope.txt"
check_err "score --ids missing file exits 5" 5 "^salafw score: --ids: cannot open '$S/nope.txt'" \
	$SALAFW score "$D" --ids "$S/nope.txt" -o "$S/x.safetensors" --no-verify
printf '1 2\0 3' > "$S/nul.txt"
check_err "run --ids with a NUL byte" 5 "^salafw run: --ids: '$S/nul.txt' holds a NUL byte" $R --ids "$S/nul.txt"
check_err "run -p without tokenizer.model is a usage error" 2 "has no tokenizer.model \(use --ids\)" \
	$SALAFW run "$D" -p hello --no-verify
check_err "score --feed-from missing file exits 5" 5 "^salafw: --feed-from: cannot open '$S/nope.st'" \
	$SALAFW score "$D" --ids "$S/ids.txt" --feed-from "$S/nope.st" -o "$S/x.safetensors" --no-verify
# --feed-from longer than the 2^20 decode cap: refused unless --decode N says how many
python3 - "$S/bigfeed.safetensors" <<'PY'
import json, struct, sys
n = (1 << 20) + 1
h = json.dumps({"decode.input_ids": {"dtype": "I32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
h += b' ' * (-len(h) % 8)
with open(sys.argv[1], 'wb') as f:
	f.write(struct.pack('<Q', len(h)) + h + bytes(4 * n))
PY
check_err "score --feed-from over 2^20 ids" 2 "holds 1048577 decode ids, more than 1048576 steps \(pass --decode N\)" \
	$SALAFW score "$D" --ids "$S/ids.txt" --feed-from "$S/bigfeed.safetensors" -o "$S/x.safetensors" --no-verify
check "score --feed-from over 2^20 ids with --decode 2" $SALAFW score "$D" --ids "$S/ids.txt" \
	--feed-from "$S/bigfeed.safetensors" --decode 2 -o "$S/x.safetensors" --no-verify
# output that cannot be written
check_err "run --ids > /dev/full exits 5" 5 "cannot write to standard output" \
	bash -c "$R -n 2 --greedy > /dev/full"
check_err "bench > /dev/full exits 5" 5 "cannot write to standard output" \
	bash -c "$SALAFW bench '$D' --no-verify --prompt 8 --gen 2 > /dev/full"

# output lost is never success
check_err "--version into a full disk: exit 5" 5 "cannot write to standard output" sh -c '"$0" --version >/dev/full' "$SALAFW"
check_err "--help into a full disk: exit 5" 5 "cannot write to standard output" sh -c '"$0" --help >/dev/full' "$SALAFW"
check_report test_run.sh
