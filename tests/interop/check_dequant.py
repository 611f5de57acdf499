"""(a) salafw's int8 output loaded the way transformers loads a
compressed-tensors checkpoint: config.json's quantization_config validated
by compressed_tensors.QuantizationConfig, each quantized module's state dict
decompressed by its pack-quantized compressor with the config's scheme; every
weight compared with salafw's own dequantization (tests/interop/dequant.c).

  check_dequant.py QUANT_DIR SALAFW_DEQUANT.safetensors BF16_DIR [rtn]

With rtn (no AWQ fold) every weight must also be within half a step of the
bf16 input (the scale law of num/w8_layout.h).

Exact equality expected: compressed-tensors dequantizes in the scale's dtype
(bf16), salafw in float32, so (1) compressed-tensors' bf16 weight ==
bf16_rne(salafw's float32) bit for bit, and (2) with the scale widened to
float32 first, compressed-tensors' float32 product == salafw's bit for bit.
Prints one summary line; exit 1 on any difference."""
import glob, json, os, sys

import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig
from safetensors.torch import load_file

qdir, deq_path, bf16_dir = sys.argv[1:4]
rtn = sys.argv[4:5] == ['rtn']
cfg = json.load(open(os.path.join(qdir, 'config.json')))['quantization_config']
qc = QuantizationConfig.model_validate(cfg)
assert qc.format == 'pack-quantized' and list(qc.config_groups) == ['group_0'], qc
scheme = qc.config_groups['group_0']
tensors = {}
for f in sorted(glob.glob(os.path.join(qdir, '*.safetensors'))):
    tensors.update(load_file(f))
ours = load_file(deq_path)
orig = {}
for f in sorted(glob.glob(os.path.join(bf16_dir, '*.safetensors'))):
    orig.update(load_file(f))
mods = sorted(k[:-len('.weight_packed')] for k in tensors if k.endswith('.weight_packed'))
bad, n_el, worst = [], 0, 0.0
for m in mods:
    sd = {k[len(m) + 1:]: v for k, v in tensors.items() if k.startswith(m + '.') and '.' not in k[len(m) + 1:]}
    if any(m == i or m.endswith('.' + i) for i in qc.ignore):
        bad.append(m + ': quantized but listed in ignore')
        continue
    w = PackedQuantizationCompressor.decompress(sd, scheme)['weight']
    sd32 = dict(sd, weight_scale=sd['weight_scale'].float())
    w32 = PackedQuantizationCompressor.decompress(sd32, scheme)['weight']
    s = ours[m + '.weight']
    if w.dtype != torch.bfloat16 or w.shape != s.shape:
        bad.append('%s: %s %s vs salafw %s' % (m, w.dtype, tuple(w.shape), tuple(s.shape)))
        continue
    if not torch.equal(w.view(torch.int16), s.to(torch.bfloat16).view(torch.int16)):
        bad.append(m + ': bf16 dequantization differs from bf16(salafw)')
    if not torch.equal(w32.view(torch.int32), s.view(torch.int32)):
        d = (w32 - s).abs().max().item()
        bad.append('%s: float32 dequantization differs (max %.3g)' % (m, d))
    if not rtn:
        n_el += s.numel()
        continue
    # and the quantization is a faithful one: within half a step of the original
    step = sd['weight_scale'].float().repeat_interleave(
        scheme.weights.group_size or s.shape[1], dim=1)[:, :s.shape[1]]
    err = ((s - orig[m + '.weight'].float()).abs() / step).max().item()
    worst = max(worst, err)
    if err > 0.5 * (1 + 1e-6):
        bad.append('%s: a weight %.3f steps from its bf16 input' % (m, err))
    n_el += s.numel()
# the other tensors stay as they were (the AWQ fold aside: norms and up_proj rows change)
kept = [k for k in tensors if not k.rsplit('.', 1)[-1].startswith('weight_')]
if set(kept) - set(orig):
    bad.append('tensors not in the bf16 model: %s' % sorted(set(kept) - set(orig))[:3])
if len(mods) == 0 or set(m + '.weight' for m in mods) != set(ours):
    bad.append('module sets differ: %d vs %d' % (len(mods), len(ours)))
print('%s: %d modules, %d weights: compressed-tensors %s == salafw (bf16 and float32 bit for bit)%s; '
      'group %s%s%s'
      % ('ok' if not bad else 'FAIL', len(mods), n_el, PackedQuantizationCompressor.__name__,
         '' if not bad else ' NOT', scheme.weights.group_size or 'channel',
         ', rtn: worst |w - deq| %.3f step of the bf16 input' % worst if rtn else ', awq (folded)',
         '' if not bad else ': ' + '; '.join(bad[:5])))
sys.exit(1 if bad else 0)
