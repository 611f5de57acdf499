"""(b) a group-32 int8 checkpoint with F32 scales written by compressed-tensors
itself, the way llm-compressor saves one (min-max observer: scale = absmax /
127.5 per group of 32, kept in float32; PackedQuantizationCompressor packs the
codes; QuantizationConfig gives config.json's quantization_config), from a
bf16 model directory (salafw mkmodel). salafw must load and score it.

  make_ct_checkpoint.py BF16_DIR OUT_DIR DEQ_DIR

DEQ_DIR gets the same model with each quantized linear replaced by
compressed-tensors' own decompression of it (float32 weights, no
quantization_config): salafw must score OUT_DIR as it scores DEQ_DIR."""
import glob, json, os, re, shutil, sys

import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                             QuantizationStatus)
from safetensors.torch import load_file, save_file

src, out, deq = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
os.makedirs(deq, exist_ok=True)
G = 32
scheme = QuantizationScheme(targets=['Linear'], weights=QuantizationArgs(
    num_bits=8, type='int', symmetric=True, strategy='group', group_size=G, observer='minmax'),
    format='pack-quantized')
# the decoder's nn.Linear modules, as llm-compressor's "Linear" target finds them
linear = re.compile(r'^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|self_attn\.o_gate|self_attn\.z_proj|'
                    r'mlp\.(gate|up|down)_proj)\.weight$')
tensors = {}
for f in sorted(glob.glob(os.path.join(src, '*.safetensors'))):
    tensors.update(load_file(f))
outt, deqt, n = {}, {}, 0
for name, w in sorted(tensors.items()):
    if not linear.match(name):
        outt[name] = deqt[name] = w
        continue
    N, K = w.shape
    assert K % G == 0, name
    amax = w.float().abs().reshape(N, K // G, G).amax(dim=2)
    scale = torch.clamp(amax / 127.5, min=torch.finfo(torch.float32).eps)  # float32, as saved
    sd = PackedQuantizationCompressor.compress({'weight': w, 'weight_scale': scale}, scheme)
    mod = name[:-len('.weight')]
    for k, v in sd.items():
        outt[mod + '.' + k] = v.contiguous()
    deqt[name] = PackedQuantizationCompressor.decompress(sd, scheme)['weight'].float().contiguous()
    n += 1
save_file(outt, os.path.join(out, 'model.safetensors'), metadata={'format': 'pt'})
save_file(deqt, os.path.join(deq, 'model.safetensors'), metadata={'format': 'pt'})
qc = QuantizationConfig(config_groups={'group_0': scheme}, format='pack-quantized',
                        quantization_status=QuantizationStatus.COMPRESSED, ignore=['lm_head'])
cfg = json.load(open(os.path.join(src, 'config.json')))
cfg['quantization_config'] = qc.model_dump(mode='json')
cfg['quantization_config']['quant_method'] = 'compressed-tensors'
json.dump(cfg, open(os.path.join(out, 'config.json'), 'w'), indent=2)
for f in os.listdir(src):
    if not f.endswith('.safetensors') and not f.endswith('.index.json') and os.path.isfile(os.path.join(src, f)):
        shutil.copy(os.path.join(src, f), deq)
        if f != 'config.json':
            shutil.copy(os.path.join(src, f), out)
dt = {str(v.dtype) for k, v in outt.items() if k.endswith('weight_scale')}
print('compressed-tensors wrote %d linears, group %d, scales %s -> %s' % (n, G, ','.join(sorted(dt)), out))
