/* w8_layout.h - the int8 weight layout of salafw quant, defined once for C and
 * CUDA (header only: constants, static_asserts and inline decoders).
 *
 * Container: safetensors (formats/safetensors.h), sharded as
 * model-0000i-of-0000n.safetensors + model.safetensors.index.json. The
 * layout is compressed-tensors' "pack-quantized" INT8 symmetric weight-only
 * format (docs/awq.md §2a), which vLLM, SGLang and transformers load.
 *
 * Per quantized linear `<p>` (W [N, K] = [out, in], nn.Linear order):
 *   <p>.weight_packed  I32  [N, P], P = ceil(K / 4)
 *       Row-major. Byte 4*(r*P) + k of the tensor's data (little-endian words)
 *       is the code of W[r, k]: b = q + 128, q in [-128, 127] (so b in
 *       [0, 255]); i.e. element k of row r sits in word r*P + k/4 at bits
 *       8*(k%4) .. 8*(k%4)+7. Rows are padded with zero bytes up to 4*P
 *       bytes (the pad bytes are 0x00, never read for k >= K).
 *   <p>.weight_scale   BF16 [N, G], G = ceil(K / g) for group size g
 *       (g = 32, 64 or 128), G = 1 for strategy "channel" (one scale per
 *       output row). Written in the model dtype (bf16); the reader also
 *       accepts F16 and F32 (third-party checkpoints) and takes the dtype
 *       from the tensor header, never from config.json.
 *   <p>.weight_shape   I64  [2] = [N, K] (readers accept I32 too).
 * Dequantization (the runtime contract): w[r, k] = (float)(b - 128) *
 * (float)scale[r, k / g], computed in float32. Symmetric only: no zero point
 * tensor is written (readers refuse one).
 *
 * Quantizer (quant/w8_ref.c, the law; tests/ref/awq_ref.py re-implements it
 * bit for bit):
 *   amax  = max |w| over the group (float32; w = the bf16 weight as float,
 *           or the float32 AWQ-scaled weight)
 *   scale = bf16_rne(max(amax / 127.5f, FLT_EPSILON))        (stored)
 *           then, if amax / (float)scale > 127.5f, scale += one bf16 ulp
 *           (the next bf16 up), so that no weight is clamped by more than
 *           half a step (amax = 1: 2^-7 would put +amax at 128 -> 127)
 *   q     = clamp(rint(w / (float)scale), -128, 127)  rint = round half to even
 * This is compressed-tensors' symmetric rule (scale = absmax / (255 / 2),
 * clamped below at float32 eps, torch.round = half to even, clamp to the
 * int8 range: +amax lands on 127.5 -> 128 -> clamped to 127). Deviations,
 * deliberate: we divide in float32 by the scale *as stored* (bf16-rounded),
 * so codes are optimal for the scale the runtime multiplies by (torch run
 * in bf16 divides in bf16), and the ulp bump above. Non-finite weights are
 * refused.
 *
 * Which tensors are quantized: the 2-D `.weight` of the decoder linears
 * model.layers.{i}.self_attn.{q,k,v,o}_proj, self_attn.o_gate (sparse
 * layers), self_attn.z_proj (lightning layers) and mlp.{gate,up,down}_proj.
 * Everything else keeps its name and dtype: model.embed_tokens.weight (not a
 * Linear), lm_head.weight (in `ignore`), every norm weight.
 *
 * AWQ: the per-input-channel scale s is folded, never stored: balance
 * linears' columns are multiplied by s before quantization and the
 * producer (an RMSNorm weight, or up_proj's rows) is divided by s and kept
 * in the model dtype. A quantized directory is therefore an ordinary
 * compressed-tensors checkpoint.
 *
 * config.json gains (keys sorted, as compressed-tensors writes them):
 *   "quantization_config": {
 *     "config_groups": {"group_0": {
 *        "format": "pack-quantized", "input_activations": null,
 *        "output_activations": null, "targets": ["Linear"],
 *        "weights": {"actorder": null, "block_structure": null,
 *          "dynamic": false, "group_size": 128 | null (channel),
 *          "num_bits": 8, "observer": "minmax", "observer_kwargs": {},
 *          "strategy": "group" | "channel", "symmetric": true,
 *          "type": "int"}}},
 *     "format": "pack-quantized", "global_compression_ratio": null,
 *     "ignore": ["lm_head"], "kv_cache_scheme": null,
 *     "quant_method": "compressed-tensors",
 *     "quantization_status": "compressed", "sparsity_config": {},
 *     "transform_config": {}, "version": SFW_QL_CT_VERSION }
 * Each shard's __metadata__: "format": "pt", "salafw.format": "awq-w8",
 * "salafw.version": SFW_QL_VERSION, "quant.group_size": "32" | "64" |
 * "128" | "channel", "quant.method": "rtn" | "awq". */
#ifndef SFW_QUANT_LAYOUT_H
#define SFW_QUANT_LAYOUT_H

#include <stdint.h>
#include <string.h>

#ifndef __cplusplus
#include <assert.h> /* static_assert */
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the packed int8 layout is read in place: little-endian hosts only"
#endif

#define SFW_QL_FORMAT "awq-w8"   /* __metadata__ salafw.format */
#define SFW_QL_VERSION "1"       /* __metadata__ salafw.version */
#define SFW_QL_CT_VERSION "0.12.2" /* compressed-tensors version we claim */
#define SFW_QL_BITS 8
#define SFW_QL_BIAS 128          /* stored byte = q + 128 */
#define SFW_QL_QMIN (-128)
#define SFW_QL_QMAX 127
#define SFW_QL_SCALE_DIV 127.5f  /* (QMAX - QMIN) / 2 */
#define SFW_QL_SCALE_MIN 1.1920928955078125e-07f /* FLT_EPSILON, as torch.finfo(float32).eps */
#define SFW_QL_PACK 4            /* codes per I32 word */
#define SFW_QL_GROUP_DEFAULT 128
#define SFW_QL_GROUP_CHANNEL 0   /* params value for strategy "channel" */

static_assert(sizeof(int32_t) == SFW_QL_PACK * sizeof(uint8_t), "four codes per packed word");
static_assert(SFW_QL_QMAX - SFW_QL_QMIN == 255, "8-bit code range");
static_assert(SFW_QL_QMIN + SFW_QL_BIAS == 0 && SFW_QL_QMAX + SFW_QL_BIAS == 255, "biased codes fill a byte");

/* I32 words per packed row, and bytes per packed row. */
static inline int64_t sfw_ql_words(int64_t K)
{
	return (K + SFW_QL_PACK - 1) / SFW_QL_PACK;
}
static inline int64_t sfw_ql_row_bytes(int64_t K)
{
	return sfw_ql_words(K) * SFW_QL_PACK;
}
/* Columns of weight_scale; group 0 = channel. */
static inline int64_t sfw_ql_ngroups(int64_t K, int group)
{
	return group > 0 ? (K + group - 1) / group : 1;
}
/* The group size a reader uses for column indexing (channel: K). */
static inline int64_t sfw_ql_group_span(int64_t K, int group)
{
	return group > 0 ? group : K;
}
/* Code byte -> signed q. */
static inline int sfw_ql_q(uint8_t b)
{
	return (int)b - SFW_QL_BIAS;
}
static inline float sfw_ql_dequant(uint8_t b, float scale)
{
	return (float)sfw_ql_q(b) * scale;
}

/* The quantized linears of one decoder layer, by suffix after
 * "model.layers.{i}.". */
static const char *const sfw_ql_linear_suffixes[] = {
	"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.o_gate",
	"self_attn.z_proj", "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};
#define SFW_QL_N_LINEAR_SUFFIXES (sizeof(sfw_ql_linear_suffixes) / sizeof(sfw_ql_linear_suffixes[0]))

/* 1 if tensor `name` is the .weight of a linear that salafw quant quantizes
 * ("model.layers.<digits>.<suffix>.weight"); *prefix_len receives the length
 * of "<...>.<suffix>" (the module name). */
static inline int sfw_ql_is_quantized(const char *name, size_t *prefix_len)
{
	static const char pre[] = "model.layers.";
	size_t n = strlen(name);
	if (strncmp(name, pre, sizeof(pre) - 1) != 0 || n < 7 || strcmp(name + n - 7, ".weight") != 0)
		return 0;
	const char *p = name + sizeof(pre) - 1;
	if (*p < '0' || *p > '9')
		return 0;
	while (*p >= '0' && *p <= '9')
		p++;
	if (*p++ != '.')
		return 0;
	size_t rest = (size_t)(name + n - 7 - p);
	for (size_t i = 0; i < SFW_QL_N_LINEAR_SUFFIXES; i++)
		if (strlen(sfw_ql_linear_suffixes[i]) == rest && strncmp(p, sfw_ql_linear_suffixes[i], rest) == 0) {
			if (prefix_len)
				*prefix_len = n - 7;
			return 1;
		}
	return 0;
}

#endif
