#!/usr/bin/env bash
# make interop: salafw's int8 checkpoints against compressed-tensors from PyPI
# (the package transformers and vLLM load them with). Not part of `make test`:
# the venv ($BUILD/interop-venv, INTEROP_VENV overrides) pulls torch, ~2.5 GB.
#  (a) salafw quant output (AWQ and RTN; groups 32, 64, 128, channel) loaded as
#      transformers does -- QuantizationConfig from config.json, the
#      pack-quantized decompressor per module -- equals salafw's own
#      dequantization (tests/interop/dequant.c) bit for bit, in bf16 and f32;
#  (b) a group-32 checkpoint with F32 scales written by compressed-tensors the
#      way llm-compressor saves one: salafw scores it with logits bit-identical
#      to those of the same model with compressed-tensors' dequantized float32
#      weights, and close to the bf16 model's (max |dlogit| <= 2% of max
#      |logit|, greedy argmax agreeing on >= 80% of positions).
. tests/lib.sh
VENV=${INTEROP_VENV:-$PWD/$BUILD/interop-venv}
PY=$VENV/bin/python
DEQ=$PWD/$BUILD/tests/interop/dequant
[ -x "$DEQ" ] || { echo "interop: build first (make interop)"; exit 2; }
if ! "$PY" -c 'import compressed_tensors, safetensors, torch' 2>/dev/null; then
	echo "interop: creating $VENV with compressed-tensors from PyPI (pulls torch)"
	python3 -m venv "$VENV" && "$VENV/bin/pip" install -q compressed-tensors ||
		{ echo "interop: cannot install compressed-tensors"; exit 5; }
fi
"$PY" -c 'import compressed_tensors, torch, sys; print("interop: python %s, compressed-tensors %s, torch %s" % (sys.version.split()[0], compressed_tensors.__version__, torch.__version__))'
S=$(scratch)
$SALAFW mkmodel --preset tiny --seed 11 -o "$S/bf16" >/dev/null || { fail "mkmodel"; check_report interop; exit 1; }

# (a)
for c in "awq 32" "awq 128" "rtn 64" "rtn channel" "rtn 32"; do
	set -- $c
	q=$S/q-$1-$2
	if ! $SALAFW quant "$S/bf16" -o "$q" --method "$1" --group "$2" --samples 4 --seq-len 64 --no-verify -q \
		2>/dev/null; then fail "quant $1 g$2"; continue; fi
	"$DEQ" "$q" "$q.deq.safetensors" >/dev/null || { fail "salafw dequant $1 g$2"; continue; }
	out=$("$PY" tests/interop/check_dequant.py "$q" "$q.deq.safetensors" "$S/bf16" $([ "$1" = rtn ] && echo rtn) 2>&1)
	rc=$?
	echo "interop (a) $1 g$2: $(echo "$out" | tail -n 1)"
	[ $rc = 0 ] && pass "(a) $1 g$2" || fail "(a) $1 g$2: $(echo "$out" | tail -n 3)"
done

# (b)
seq 5 200 | tr '\n' ' ' >"$S/ids.txt"
if "$PY" tests/interop/make_ct_checkpoint.py "$S/bf16" "$S/ct" "$S/ct-deq" >"$S/ct.log" 2>&1; then
	echo "interop (b): $(tail -n 1 "$S/ct.log")"
	for m in bf16 ct ct-deq; do
		$SALAFW score "$S/$m" --ids "$S/ids.txt" -o "$S/$m.logits.safetensors" --no-verify 2>"$S/$m.err" ||
			fail "(b) salafw score $m: $(tail -n 2 "$S/$m.err")"
	done
	out=$("$PY" - "$S" <<'PY'
import sys, torch
from safetensors.torch import load_file
S = sys.argv[1]
bf, ct, dq = (load_file('%s/%s.logits.safetensors' % (S, m)) for m in ('bf16', 'ct', 'ct-deq'))
x, y, z = bf['prefill.logits'].float(), ct['prefill.logits'].float(), dq['prefill.logits'].float()
same = torch.equal(y.view(torch.int32), z.view(torch.int32)) and torch.equal(ct['decode.tokens'], dq['decode.tokens'])
d, mx = (x - y).abs().max().item(), x.abs().max().item()
agree = (x.argmax(-1) == y.argmax(-1)).float().mean().item()
ok = same and d <= 0.02 * mx and agree >= 0.8
print('%s: %d positions: logits on the compressed-tensors checkpoint %s those on its dequantized f32 weights; '
      'vs bf16 max |dlogit| %.3g = %.2f%% of max |logit| %.3g (limit 2%%), argmax agreement %.1f%% (limit 80%%)'
      % ('ok' if ok else 'FAIL', x.shape[0], '==' if same else '!=', d, 100 * d / mx, mx, 100 * agree))
sys.exit(0 if ok else 1)
PY
)
	rc=$?
	echo "interop (b): $out"
	[ $rc = 0 ] && pass "(b) compressed-tensors g32 F32-scale checkpoint scored" || fail "(b): $out"
else
	fail "(b) compressed-tensors could not write the checkpoint: $(tail -n 5 "$S/ct.log")"
fi
check_report interop
