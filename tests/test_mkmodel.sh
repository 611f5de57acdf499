#!/usr/bin/env bash
# salafw mkmodel from the command line: same seed -> identical bytes (sha256sum
# of every file), another seed -> other weights, --dry-run of the full preset
# gives docs/model-spec.md §3's counts and writes nothing, bad -o and existing models
# give clear errors and the documented exit codes.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
T=$(scratch)

check "tiny, seed 1" "$SALAFW" mkmodel --preset tiny --seed 1 -o "$T/a"
check "tiny, seed 1 again" "$SALAFW" mkmodel --preset tiny --seed 1 -o "$T/b"
check "tiny, seed 2" "$SALAFW" mkmodel --preset tiny --seed 2 -o "$T/c"

sums() { (cd "$1" && sha256sum -- * | sort -k2); }
if [ -n "$(ls "$T/a")" ] && [ "$(sums "$T/a")" = "$(sums "$T/b")" ]; then pass "same seed: identical sha256 of every file"
else fail "same seed: files differ"; fi
n=$(ls "$T/a" | wc -l)
[ "$n" = 8 ] && pass "tiny writes 8 files" || fail "tiny writes $n files: $(ls "$T/a" | tr '\n' ' ')"
for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors; do
	if ! cmp -s "$T/a/$f" "$T/c/$f"; then pass "seed 2 changes $f"; else fail "seed 2 gives the same $f"; fi
done
if cmp -s "$T/a/config.json" "$T/c/config.json"; then pass "seed does not change config.json"
else fail "config.json depends on the seed"; fi
ls "$T/a" | grep -q '\.tmp\.' && fail "temporary files left" || pass "no temporary files left"

# Each shard's header is a JSON object whose length puts the data 8-byte
# aligned (read with od, independent of salafw); the index names 72 tensors.
for f in "$T"/a/model-*.safetensors; do
	n=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
	if [ -n "$n" ] && [ $(( (8 + n) % 8 )) = 0 ] && [ "$(head -c 9 "$f" | tail -c 1)" = "{" ]; then
		pass "$(basename "$f"): data starts 8-aligned"
	else fail "$(basename "$f"): header length $n"; fi
done
idx=$(grep -c '"model\.\|"lm_head' "$T/a/model.safetensors.index.json")
[ "$idx" = 72 ] && pass "index lists 72 tensors" || fail "index lists $idx tensors"
grep -q '"eos_token_id": \[' "$T/a/config.json" && grep -q '1016' "$T/a/config.json" \
	&& pass "config eos includes V-8 = 1016" || fail "config eos"

out=$("$SALAFW" mkmodel --dry-run --preset full -o "$T/full" 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q '^395 tensors, 9477203968 parameters, 18954407936 bytes in 4 shards$'; then
	pass "full dry run: 395 tensors, 9477203968 parameters"
else fail "full dry run (exit $rc): $(echo "$out" | tail -n 1)"; fi
[ "$(echo "$out" | grep -c ' bf16 \[')" = 395 ] && pass "dry run lists 395 tensors" || fail "dry run listing"
echo "$out" | grep -q '^model.layers.31.self_attn.o_gate.weight bf16 \[4096, 4096\]' \
	&& pass "layer 31 is sparse (o_gate)" || fail "layer 31 o_gate missing"
echo "$out" | grep -q '^model.layers.30.self_attn.z_proj' && fail "layer 30 has z_proj" || pass "layer 30 has no z_proj"
[ ! -e "$T/full" ] && pass "dry run writes nothing" || fail "dry run created $T/full"
out=$("$SALAFW" mkmodel --dry-run --preset wide4 -o "$T/wide4" 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q '^49 tensors, 1679667712 parameters, 3359335424 bytes in 2 shards$' &&
	echo "$out" | grep -q '^model.layers.3.self_attn.o_gate.weight bf16 \[4096, 4096\]' &&
	echo "$out" | grep -q '^model.layers.2.self_attn.z_proj.weight bf16 \[4096, 4096\]'; then
	pass "wide4 dry run: 49 tensors, 1679667712 parameters, layers S L L S"
else fail "wide4 dry run (exit $rc): $(echo "$out" | tail -n 1)"; fi

# Bad output paths and existing models.
touch "$T/file"
check_err "-o is a file" 5 "'$T/file' exists and is not a directory" "$SALAFW" mkmodel --preset tiny -o "$T/file"
check_err "-o below a file" 5 "not a directory" "$SALAFW" mkmodel --preset tiny -o "$T/file/sub"
if [ "$(id -u)" != 0 ]; then
	mkdir "$T/ro" && chmod 555 "$T/ro"
	check_err "-o unwritable" 5 "cannot (create|write)" "$SALAFW" mkmodel --preset tiny -o "$T/ro/m"
	chmod 755 "$T/ro"
else
	check_err "-o unwritable" 5 "cannot create directory '/proc/salafw-" "$SALAFW" mkmodel --preset tiny \
		-o "/proc/salafw-test-$$/m"
fi
check_err "existing model refused (exit 5, as every existing output)" 5 "already holds a model.*--force" "$SALAFW" mkmodel --preset tiny -o "$T/a"
check "existing model with --force" "$SALAFW" mkmodel --preset tiny --seed 1 --force -o "$T/a"
[ "$(sums "$T/a")" = "$(sums "$T/b")" ] && pass "forced rewrite gives the same bytes" || fail "forced rewrite differs"

# --w8: the decoder linears written directly as int8 (num/w8_layout.h); the
# model loads and generates on the CPU engine; the same bytes twice.
check "mkmodel --w8" "$SALAFW" mkmodel --preset tiny --w8 --group 32 --no-tokenizer -o "$T/w8"
check "mkmodel --w8 again" "$SALAFW" mkmodel --preset tiny --w8 --group 32 --no-tokenizer -o "$T/w8b"
[ "$(sums "$T/w8")" = "$(sums "$T/w8b")" ] && pass "--w8 is deterministic" || fail "--w8 output differs between runs"
out=$("$SALAFW" mkmodel --preset full --w8 --dry-run)
echo "$out" | grep -q '^model.layers.0.mlp.down_proj.weight_packed i32 \[4096, 4096\]' \
	&& pass "full --w8: down_proj packed [4096, 16384/4]" || fail "full --w8: down_proj packed missing"
echo "$out" | grep -q '^model.layers.0.mlp.down_proj.weight_scale bf16 \[4096, 128\]' \
	&& pass "full --w8: g128 scales [4096, 128]" || fail "full --w8: scale shape"
echo "$out" | grep -q '^lm_head.weight bf16 \[73448, 4096\]' && pass "full --w8: lm_head stays bf16" || fail "lm_head"
grep -q '"group_size": 32' "$T/w8/config.json" && grep -q '"quant_method": "compressed-tensors"' "$T/w8/config.json" \
	&& pass "--w8 config.json has quantization_config" || fail "--w8 quantization_config"
check "--w8 model scores on the CPU" "$SALAFW" bench "$T/w8" --prompt 16 --gen 2 --device cpu --no-verify
check_err "--w8 bad group" 2 "--group must be 32, 64, 128 or channel" "$SALAFW" mkmodel --preset tiny --w8 --group 48 -o "$T/x"

# Usage errors.
check_err "no preset" 2 "--preset is required" "$SALAFW" mkmodel -o "$T/x"
check_err "unknown preset" 2 "unknown preset 'huge'" "$SALAFW" mkmodel --preset huge -o "$T/x"
check_err "no -o" 2 "-o DIR is required" "$SALAFW" mkmodel --preset tiny
check_err "bad seed" 2 "not a non-negative integer" "$SALAFW" mkmodel --preset tiny --seed x -o "$T/x"
check_exit "--help" 0 "$SALAFW" mkmodel --help
[ ! -e "$T/x" ] && pass "usage errors write nothing" || fail "usage error created $T/x"

check_report test_mkmodel_sh
