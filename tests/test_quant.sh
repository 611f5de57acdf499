#!/usr/bin/env bash
# test_quant.sh - salafw quant end to end: usage and the verified-weights
# rule, a quantized golden model run through `salafw run` / `score`, a
# third-party variant of the same layout (F32/F16 scales, I32 weight_shape,
# an ignored module kept in bf16: cyankiwi-style), and clear refusals of
# quantization configs the runner cannot run.
. tests/lib.sh
# Under SAN=1 the write shim (LD_PRELOAD) comes before the ASan runtime, and a
# SIGBUS must reach the engine's guard and then the default action, not ASan's handler.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:handle_sigbus=0"
S=$(scratch)
G=$GOLDEN
D=$G/tiny-dense

st_ints() {
	python3 - "$1" "$2" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
t = h[sys.argv[2]]; a, b = t['data_offsets']; f.seek(8 + n + a); d = f.read(b - a)
print(' '.join(str(x) for x in struct.unpack('<%di' % (len(d) // 4), d)))
PY
}

# usage and the gate
check_exit "quant needs -o" 2 $SALAFW quant "$D" --no-verify
check_exit "bad --group" 2 $SALAFW quant "$D" -o "$S/x" --group 16 --no-verify
check_exit "bad --method" 2 $SALAFW quant "$D" -o "$S/x" --method gptq --no-verify
check_exit "--fold-only needs awq" 2 $SALAFW quant "$D" -o "$S/x" --method rtn --fold-only --no-verify
check_err "quant refuses a directory without a signed manifest" 1 "no signed manifest" \
	$SALAFW quant "$D" -o "$S/x" --method rtn
check_err "quant --no-verify says so and reports" 0 "32 linears int8 \(w8-g32\)" \
	$SALAFW quant "$D" -o "$S/q" --method rtn --group 32 --no-verify
check_err "an existing output needs --force (exit 5)" 5 "already holds a model" \
	$SALAFW quant "$D" -o "$S/q" --method rtn --no-verify
check "the output is a complete model directory" test -f "$S/q/config.json" -a -f "$S/q/model.safetensors.index.json"
# config.json keeps its numbers' types (10000.0 and 0.0 stay floats) for python readers
r=$(python3 - "$D/config.json" "$S/q/config.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def walk(x, y, at):
    if type(x) is not type(y) or (not isinstance(x, (dict, list)) and x != y):
        return ['%s: %r -> %r' % (at, x, y)]
    if isinstance(x, dict):
        return sum((walk(x[k], y.get(k), at + '.' + k) for k in x), [])
    if isinstance(x, list):
        return sum((walk(u, v, at + '[]') for u, v in zip(x, y)), []) if len(x) == len(y) else [at + ': length']
    return []
floats = sum(isinstance(v, float) and v == int(v) for v in a.values())
bad = walk({k: v for k, v in a.items() if k != 'quantization_config'}, b, 'config')
print('ok %d' % floats if not bad and floats >= 2 else 'bad %d %s' % (floats, bad[:4]))
PY
)
case $r in ok*) pass "config.json keeps every field's value and JSON type (${r#ok } integral floats stay floats)";;
*) fail "config.json rewritten with other types: $r";; esac
# --force replaces the model as a whole: one shard over several leaves one shard file
check "--shard-size writes several shards" $SALAFW quant "$D" -o "$S/f" --method rtn --shard-size 1500000 --no-verify -q
n=$(ls "$S/f" | grep -c '^model.*\.safetensors$')
[ "$n" -gt 1 ] && pass "$n shards" || fail "--shard-size 1500000 wrote $n shard files"
check "--force over it with one shard" $SALAFW quant "$D" -o "$S/f" --method rtn --force --no-verify -q
n=$(ls "$S/f" | grep -c '^model.*\.safetensors$')
[ "$n" = 1 ] && pass "--force leaves only the new shard" || fail "--force left $n shard files"

# progress to a log (stderr not a terminal): a line per phase step, with elapsed time and ETA
$SALAFW quant "$D" -o "$S/p" --method awq --samples 6 --seq-len 32 --no-verify 2>"$S/p.err" >/dev/null
for pat in "loading the model" "calibrating \(cpu\): sequence 6/6, [0-9:]+ elapsed, ETA" \
	"searching AWQ scales: layer 1/4, [0-9:]+ elapsed, ETA [0-9:]+" "searching AWQ scales: layer 4/4" \
	"writing shard 1/1: 100% of [0-9.]+ MB, [0-9:]+ elapsed"; do
	grep -qE "^salafw quant: $pat" "$S/p.err" && pass "progress: $pat" || fail "progress line '$pat' missing: $(head -c 400 "$S/p.err")"
done
grep -qE 'writing shard [0-9/]+: +[0-4]% .*ETA [0-9]' "$S/p.err" && fail "an ETA from under 5% written: $(grep -m1 'writing' "$S/p.err")" ||
	pass "no ETA from the first 5% of the write"
[ "$(grep -c 'searching AWQ scales: layer' "$S/p.err")" = 4 ] && pass "one search line per layer" ||
	fail "search lines: $(grep -c 'searching AWQ' "$S/p.err")"
# the search's threads change nothing: one thread and three give the same bytes
$SALAFW quant "$D" -o "$S/t1" --method awq --samples 6 --seq-len 32 --threads 1 --no-verify -q 2>/dev/null &&
	$SALAFW quant "$D" -o "$S/t3" --method awq --samples 6 --seq-len 32 --threads 3 --no-verify -q 2>/dev/null &&
	cmp -s "$S/t1/model-00001-of-00001.safetensors" "$S/t3/model-00001-of-00001.safetensors" &&
	cmp -s "$S/t1/model-00001-of-00001.safetensors" "$S/p/model-00001-of-00001.safetensors" &&
	pass "awq: --threads 1, 3 and the default write the same bytes" || fail "awq output depends on the thread count"
# a calibration text shorter than --samples x --seq-len: gone through again (8 sequences of 512
# tokens are run), said, and the lineage records both counts (tiny-dense has no tokenizer: one
# token per byte, 1620 of them)
python3 -c "print('The quick brown fox jumps over the lazy dog. ' * 36, end='')" >"$S/short.txt"
check_err "a short --calib text is said, with the tokens it gave" 0 \
	"warning: the calibration text gave 1620 tokens, fewer than the 8 x 512 asked for \(--samples, --seq-len\), so it was used 2\.5 times over" \
	$SALAFW quant "$D" -o "$S/sc" --calib "$S/short.txt" --samples 8 --seq-len 512 --no-verify -q
r=$(python3 -c "import json; p=json.load(open('$S/sc/.salafw/manifest.json'))['lineage']['params']; print(p['samples'], p['calib_tokens'], p['calib_text_tokens'])")
[ "$r" = "8 4096 1620" ] && pass "lineage: samples 8, calib_tokens run 4096, calib_text_tokens 1620" ||
	fail "lineage params: $r"
# the default calibration is sized to the text (as many sequences as it fills, the last one
# shorter): a default run on a model with a tokenizer warns about nothing, and its lineage
# says each text token ran once (calib_tokens = the text's tokens + one BOS per sequence)
if $SALAFW mkmodel --preset tiny -o "$S/tiny" >/dev/null 2>&1; then
	$SALAFW quant "$S/tiny" -o "$S/tiny-q" --no-verify 2>"$S/tiny.err" >/dev/null
	w=$(grep -v -- '--no-verify' "$S/tiny.err" | grep -i 'warning')
	[ -z "$w" ] && grep -q 'awq: [0-9]* calibration tokens' "$S/tiny.err" &&
		pass "default AWQ on the tiny preset (its tokenizer): no warning" || fail "default AWQ run warns: $w"
	r=$(python3 -c "import json; p=json.load(open('$S/tiny-q/.salafw/manifest.json'))['lineage']['params']; s, t, x = int(p['samples']), int(p['calib_tokens']), int(p['calib_text_tokens']); print('ok %d %d %d' % (s, t, x) if t == x + s and s == -(-x // 511) else 'bad %d %d %d' % (s, t, x))")
	case $r in ok*) pass "default calibration: ${r#ok } (sequences, tokens run, text tokens): each text token once";;
	*) fail "default calibration lineage (sequences, tokens run, text tokens): $r";; esac
else
	fail "mkmodel --preset tiny"
fi
# RTN has no calibration or search: its progress is the write, with elapsed time, to a log as lines
$SALAFW quant "$D" -o "$S/r" --method rtn --no-verify 2>"$S/r.err" >/dev/null
grep -qE '^salafw quant: writing shard 1/1: 100% of [0-9.]+ MB, [0-9:]+ elapsed, ETA 0:00$' "$S/r.err" &&
	! grep -q $'\r' "$S/r.err" && pass "rtn progress: the write, as lines, with elapsed time" ||
	fail "rtn progress: $(head -c 300 "$S/r.err")"
# host memory: each input tensor's pages are released once written, so the
# peak resident set stays well below the mapped model (270 MB small preset;
# 289 MB before the release, 48 MB after)
if $SALAFW mkmodel --preset small -o "$S/small" >/dev/null 2>&1; then
	kb=$(/usr/bin/time -f %M $SALAFW quant "$S/small" -o "$S/small-q" --method rtn --no-verify -q 2>&1 >/dev/null | tail -n 1)
	mb=$(( $(du -sk "$S/small" | cut -f1) ))
	[ "$kb" -lt $((mb / 2)) ] && pass "rtn on the small preset peaks at $kb kB RSS, under half the model ($mb kB)" ||
		fail "rtn peak RSS $kb kB, model $mb kB: the map stays resident"
	rm -rf "$S/small" "$S/small-q"
else
	fail "mkmodel --preset small"
fi

# the quantized model runs: greedy chain as the bf16 reference (17/17 measured)
want=$(st_ints "$D/golden_f32.safetensors" decode.tokens)
got=$($SALAFW run "$S/q" --ids "$D/golden_f32.safetensors" --greedy -n 17 --print-ids --no-verify 2>/dev/null)
[ "$got" = "$want" ] && pass "int8 tiny-dense greedy chain == golden decode.tokens" ||
	fail "int8 greedy chain: got '$got' want '$want'"
check "score runs on the int8 model" $SALAFW score "$S/q" --ids "$D/golden_f32.safetensors" -o "$S/q.safetensors" \
	--no-verify
check_err "the CUDA device is refused or absent, never silently wrong" 5 "int8 weights|no CUDA|CUDA" \
	$SALAFW score "$S/q" --ids "$D/golden_f32.safetensors" -o "$S/c.safetensors" --device cuda --no-verify

# third-party layout variants, rewritten from our output with stdlib python:
#   v1: weight_scale as F32 and weight_shape as I32 (same values) -> identical logits
#   v2: weight_scale as F16, layer 1 down_proj left in bf16 and listed in `ignore`
python3 - "$S/q" "$D" "$S/v1" "$S/v2" <<'PY' || fail "writing third-party variants"
import json, os, shutil, struct, sys
q, src, v1, v2 = sys.argv[1:5]
def read(path):
    f = open(path, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
    out = {}
    for k, t in h.items():
        if k == '__metadata__': continue
        a, b = t['data_offsets']; f.seek(base + a); out[k] = (t['dtype'], t['shape'], f.read(b - a))
    return out
def write(path, tensors):
    order = sorted(tensors, key=lambda k: (-{'I64': 8, 'F32': 4, 'I32': 4, 'BF16': 2, 'F16': 2}[tensors[k][0]], k))
    hdr, off = {'__metadata__': {'format': 'pt'}}, 0
    for k in order:
        dt, sh, d = tensors[k]; hdr[k] = {'dtype': dt, 'shape': sh, 'data_offsets': [off, off + len(d)]}; off += len(d)
    j = json.dumps(hdr).encode(); j += b' ' * (-len(j) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(j))); f.write(j)
        for k in order: f.write(tensors[k][2])
def bf16_to_f32(h): return struct.unpack('<f', struct.pack('<I', h << 16))[0]
def f32_to_f16(x): return struct.pack('<e', x)
idx = json.load(open(os.path.join(q, 'model.safetensors.index.json')))
t = {}
for shard in sorted(set(idx['weight_map'].values())): t.update(read(os.path.join(q, shard)))
orig = read(os.path.join(src, 'model.safetensors'))
cfg = json.load(open(os.path.join(q, 'config.json')))
for out, mode in ((v1, 1), (v2, 2)):
    os.makedirs(out, exist_ok=True); tt = {}
    for k, (dt, sh, d) in t.items():
        if k.endswith('.weight_scale'):
            vals = [bf16_to_f32(x) for x in struct.unpack('<%dH' % (len(d) // 2), d)]
            if mode == 1: tt[k] = ('F32', sh, struct.pack('<%df' % len(vals), *vals))
            else: tt[k] = ('F16', sh, b''.join(f32_to_f16(v) for v in vals))
        elif k.endswith('.weight_shape'):
            tt[k] = ('I32', sh, struct.pack('<2i', *struct.unpack('<2q', d)))
        else: tt[k] = (dt, sh, d)
    if mode == 2:
        p = 'model.layers.1.mlp.down_proj'
        for s in ('.weight_packed', '.weight_scale', '.weight_shape'): del tt[p + s]
        tt[p + '.weight'] = orig[p + '.weight']
    write(os.path.join(out, 'model.safetensors'), tt)
    c = json.loads(json.dumps(cfg))
    if mode == 2: c['quantization_config']['ignore'].append('model.layers.1.mlp.down_proj')
    json.dump(c, open(os.path.join(out, 'config.json'), 'w'))
PY
check "score the F32-scale / I32-shape variant" $SALAFW score "$S/v1" --ids "$D/golden_f32.safetensors" \
	-o "$S/v1.safetensors" --no-verify
same=$(python3 - "$S/q.safetensors" "$S/v1.safetensors" <<'PY'
import json, struct, sys
def get(p, name):
    f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
    a, b = h[name]['data_offsets']; f.seek(8 + n + a); return f.read(b - a)
print(int(get(sys.argv[1], 'prefill.logits') == get(sys.argv[2], 'prefill.logits')))
PY
)
[ "$same" = 1 ] && pass "F32 scales and I32 shapes give bit-identical logits" || fail "F32/I32 variant logits differ"
got=$($SALAFW run "$S/v2" --ids "$D/golden_f32.safetensors" --greedy -n 17 --print-ids --no-verify 2>/dev/null)
[ "$got" = "$want" ] && pass "F16 scales + an ignored bf16 module: greedy chain == golden" ||
	fail "cyankiwi-style variant: got '$got' want '$want'"

# configurations the runner cannot run are refused by name
mkbad() { # NAME PYTHON-EXPR-ON-q
	mkdir -p "$S/$1"; ln -sf "$S/v1/model.safetensors" "$S/$1/model.safetensors"
	python3 -c "import json,sys; c=json.load(open('$S/v1/config.json')); q=c['quantization_config']; w=q['config_groups']['group_0']['weights']; $2; json.dump(c, open('$S/$1/config.json','w'))"
}
mkbad b4 "w['num_bits']=4"
mkbad basym "w['symmetric']=False"
mkbad bawq "c['quantization_config']={'quant_method':'awq','bits':8,'group_size':128}"
mkbad bw8a8 "q['config_groups']['group_0']['input_activations']={'num_bits':8}"
mkbad bfmt "q['format']='int-quantized'; q['config_groups']['group_0']['format']='int-quantized'"
mkbad bgrp "w['group_size']=64"
for b in "b4:4-bit weights are not supported" "basym:asymmetric int8" "bawq:quantization method 'awq' is not supported" \
	"bw8a8:activation quantization" "bfmt:format 'int-quantized' is not supported" "bgrp:which no group size"; do
	check_err "refuses ${b%%:*}: ${b#*:}" 5 "${b#*:}" \
		$SALAFW score "$S/${b%%:*}" --ids "$D/golden_f32.safetensors" -o "$S/b.safetensors" --no-verify
done

# ---- the user's key pair is one unit: a full disk while it is made (a write
# wrapper fails every write to user.pub with ENOSPC) leaves neither file,
# so the next run makes the pair; a lone user.key gets its user.pub back
# (derived from the secret key), which minisign accepts for the signature
WF_SO=$S/writefault.so
if ${CC:-cc} -shared -fPIC -o "$WF_SO" tests/shim/writefault.c -ldl 2>/dev/null; then
	# ---- an interrupted or out-of-space quant: the rerun takes its own
	# incomplete OUT over (OUT/.salafw/quant.partial says it is one) and
	# sweeps its temporary files; a foreign model in OUT is still refused
	notmp() { [ -z "$(find "$1" -name '*.tmp.*' ! -name 'notes.bin.tmp.1.2' 2>/dev/null)" ]; }
	complete() { [ -f "$1/config.json" ] && grep -q quantization_config "$1/config.json" && [ ! -e "$1/.salafw/quant.partial" ] && notmp "$1"; }
	check_err "disk full at OUT/config.json: exit 5" 5 "[Nn]o space left" \
		env LD_PRELOAD="$WF_SO" SFW_TEST_ENOSPC="/qf/config.json.tmp" $SALAFW quant "$D" -o "$S/qf" --method rtn --no-verify -q
	check_err "the rerun (no --force) replaces that incomplete output" 0 "incomplete output of an earlier quant" \
		$SALAFW quant "$D" -o "$S/qf" --method rtn --no-verify -q
	check "... and leaves a complete model, no marker, no *.tmp.*" complete "$S/qf"
	rc=$( (env LD_PRELOAD="$WF_SO" SFW_TEST_KILL="/qk/model-00001-of-00001.safetensors.tmp" \
		$SALAFW quant "$D" -o "$S/qk" --method rtn --no-verify -q >/dev/null 2>&1; echo $?) 2>/dev/null)
	[ $rc = 137 ] && [ -n "$(find "$S/qk" -name 'model-*.tmp.*')" ] && pass "SIGKILL while a shard is written leaves its .tmp" ||
		fail "SIGKILL mid-shard: exit $rc"
	: > "$S/qk/notes.bin.tmp.1.2" # another program's temporary file: not quant's to remove
	check "the rerun after SIGKILL succeeds" $SALAFW quant "$D" -o "$S/qk" --method rtn --no-verify -q
	check "... and sweeps the killed run's .tmp shard" complete "$S/qk"
	check "... but not a file it did not write" test -e "$S/qk/notes.bin.tmp.1.2"
	rc=$( (env LD_PRELOAD="$WF_SO" SFW_TEST_KILL="/qk2/config.json.tmp" \
		$SALAFW quant "$D" -o "$S/qk2" --method rtn --no-verify -q >/dev/null 2>&1; echo $?) 2>/dev/null)
	[ $rc = 137 ] && [ -f "$S/qk2/model.safetensors.index.json" ] && pass "SIGKILL at config.json leaves an index" ||
		fail "SIGKILL at config.json: exit $rc"
	check "the rerun after it succeeds (not 'already holds a model')" $SALAFW quant "$D" -o "$S/qk2" --method rtn --no-verify -q
	check "... complete" complete "$S/qk2"
	# an input shard truncated by another program while quant reads it: an
	# error naming it (exit 5, not SIGBUS), and no output made of zeros
	mkdir -p "$S/tin"
	cp "$D/config.json" "$D/model.safetensors" "$S/tin/" && chmod u+w "$S/tin"/*
	check_err "an input truncated while quant reads it: exit 5 naming it" 5 \
		"'$S/tin/model.safetensors' was truncated while mapped" \
		env LD_PRELOAD="$WF_SO" SFW_TEST_TRUNCATE_AT="/qt/model-00001-of-00001.safetensors.tmp" \
		SFW_TEST_TRUNCATE="$S/tin/model.safetensors" SFW_TEST_TRUNCATE_SIZE=100000 \
		$SALAFW quant "$S/tin" -o "$S/qt" --method rtn --no-verify -q
	check "... and no shard or config.json in OUT" bash -c "[ -z \"\$(ls '$S/qt')\" ]"
	cp "$D/model.safetensors" "$S/tin/"
	check "... the rerun with the file restored makes the model" $SALAFW quant "$S/tin" -o "$S/qt" --method rtn --no-verify -q
	check "... complete" complete "$S/qt"
	mkdir -p "$S/foreign"
	echo '{"weight_map": {}}' > "$S/foreign/model.safetensors.index.json"
	check_err "a foreign OUT with a model index is still refused" 5 "already holds a model" \
		$SALAFW quant "$D" -o "$S/foreign" --method rtn --no-verify -q
	check "... and left as it was" bash -c "[ \"\$(ls -A '$S/foreign')\" = model.safetensors.index.json ]"

	K=$S/cfg/salafw
	check_err "a full disk while the user key is made: exit 5" 5 "[Nn]o space left" \
		env XDG_CONFIG_HOME="$S/cfg" LD_PRELOAD="$WF_SO" SFW_TEST_ENOSPC=user.pub \
		$SALAFW quant "$D" -o "$S/uk1" --method rtn --no-verify --sign -q
	check "... leaves no user.key without user.pub" test ! -e "$K/user.key"
	check "... and no temporary file" bash -c "[ -z \"\$(ls -A '$K' 2>/dev/null)\" ]"
	check_err "the next run makes the pair" 0 "created your local signing key" \
		env XDG_CONFIG_HOME="$S/cfg" $SALAFW quant "$D" -o "$S/uk2" --method rtn --no-verify --sign
	check "... both files" test -s "$K/user.key" -a -s "$K/user.pub"
	cp "$K/user.pub" "$S/user.pub.orig"
	rm "$K/user.pub"
	check_err "a lone user.key: sign --user writes user.pub again (says so) and signs" 0 "writing it again from the secret key" \
		env XDG_CONFIG_HOME="$S/cfg" $SALAFW sign --user "$S/uk2"
	check "... the same public key as before" cmp -s "$K/user.pub" "$S/user.pub.orig"
	check "... which minisign accepts for the signature" \
		minisign -V -q -p "$K/user.pub" -m "$S/uk2/.salafw/manifest.json"
	check "... and salafw verify too" env XDG_CONFIG_HOME="$S/cfg" $SALAFW verify "$S/uk2"
else
	fail "cannot build the write wrapper (tests/shim/writefault.c)"
fi

check_report test_quant.sh
