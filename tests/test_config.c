/* modules: formats num core */
/* config.json parsing: the three golden configs and the real model's config
 * (docs/model-spec.md §1) give the documented values and derived constants; ALiBi
 * slopes match the closed forms; every class of broken config is rejected
 * with a one-line message naming the file and the field. */
#include "check.h"

#include "file.h"
#include "formats/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *golden;

/* The real config as docs/model-spec.md §1 lists it (transformers 4.57.1 re-save: "dtype"). */
static const char real_config[] =
    "{\"architectures\":[\"MiniCPMSALAForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"attn_use_output_gate\":true,\"attn_use_rope\":false,\"bos_token_id\":1,\"dim_model_base\":256,"
    "\"dtype\":\"bfloat16\",\"eos_token_id\":[2,73440],\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":4096,\"initializer_range\":0.1,\"intermediate_size\":16384,\"lightning_head_dim\":128,"
    "\"lightning_nh\":32,\"lightning_nkv\":32,\"lightning_scale\":\"1/sqrt(d)\",\"lightning_use_rope\":true,"
    "\"max_position_embeddings\":524288,\"mixer_types\":[\"minicpm4\",\"lightning-attn\",\"lightning-attn\","
    "\"lightning-attn\",\"lightning-attn\",\"lightning-attn\",\"lightning-attn\",\"lightning-attn\","
    "\"lightning-attn\",\"minicpm4\",\"lightning-attn\",\"lightning-attn\",\"lightning-attn\",\"lightning-"
    "attn\","
    "\"lightning-attn\",\"lightning-attn\",\"minicpm4\",\"minicpm4\",\"lightning-attn\",\"lightning-attn\","
    "\"lightning-attn\",\"lightning-attn\",\"minicpm4\",\"lightning-attn\",\"lightning-attn\",\"lightning-"
    "attn\","
    "\"lightning-attn\",\"lightning-attn\",\"lightning-attn\",\"minicpm4\",\"minicpm4\",\"minicpm4\"],"
    "\"model_type\":\"minicpm_sala\",\"mup_denominator\":32,\"num_attention_heads\":32,\"num_hidden_layers\":"
    "32,"
    "\"num_key_value_heads\":2,\"pad_token_id\":2,\"pretraining_tp\":1,\"qk_norm\":true,\"rms_norm_eps\":1e-"
    "06,"
    "\"rope_scaling\":null,\"rope_theta\":10000.0,\"scale_depth\":1.4,\"scale_emb\":12,\"shift_labels\":true,"
    "\"sparse_config\":{\"kernel_size\":32,\"kernel_stride\":16,\"block_size\":64,\"topk\":64,\"init_"
    "blocks\":1,"
    "\"window_size\":2048,\"dense_len\":8192,\"use_nope\":false},\"tie_word_embeddings\":false,"
    "\"transformers_version\":\"4.57.1\",\"use_cache\":true,\"use_output_gate\":true,\"use_output_norm\":"
    "true,"
    "\"vocab_size\":73448}";

static void mixers_are(const struct sfw_config *c, const char *want, const char *label)
{
	int ok = (int)strlen(want) == c->num_hidden_layers;
	for (int i = 0; ok && i < c->num_hidden_layers; i++)
		ok = c->mixer[i] == (want[i] == 'S' ? SFW_MIXER_SPARSE : SFW_MIXER_LIGHTNING);
	CHECK(ok, "%s mixers %s", label, want);
}

static void test_golden(const char *cas, int layers, const char *mix, int topk, int64_t dense_len,
			double residual)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/%s", golden, cas);
	struct sfw_config c;
	struct sfw_err err = {0};
	if (sfw_config_load(dir, &c, &err) != SFW_OK) {
		CHECK(0, "load %s: %s", cas, err.msg);
		return;
	}
	/* golden/README.md table. */
	CHECK(c.hidden_size == 256 && c.intermediate_size == 640 && c.vocab_size == 1024, "%s sizes", cas);
	CHECK(c.num_hidden_layers == layers && c.num_attention_heads == 8 && c.num_key_value_heads == 2 &&
		  c.head_dim == 32,
	      "%s heads", cas);
	CHECK(c.lightning_nh == 8 && c.lightning_nkv == 8 && c.lightning_head_dim == 32, "%s lightning heads",
	      cas);
	mixers_are(&c, mix, cas);
	CHECK(c.sparse_kernel_size == 32 && c.sparse_kernel_stride == 16 && c.sparse_block_size == 64 &&
		  c.sparse_topk == topk && c.sparse_init_blocks == 1 && c.sparse_window_size == 128 &&
		  c.sparse_dense_len == dense_len,
	      "%s sparse_config", cas);
	CHECK(c.sparse_local_blocks == 2 && c.sparse_k == topk + 2, "%s k = topk + window/block = %d", cas,
	      c.sparse_k);
	CHECK(fabs(c.residual_scale - residual) < 1e-15, "%s residual scale %.17g (README %.17g)", cas,
	      c.residual_scale, residual);
	CHECK(c.logit_divisor == 4.0, "%s logits use h / 4", cas);
	CHECK(c.rms_norm_eps == 1e-6 && c.rope_theta == 10000.0 && c.scale_emb == 12 &&
		  c.scale_depth == 1.4 && c.dim_model_base == 64 && c.max_position_embeddings == 4096,
	      "%s scalars", cas);
	CHECK(c.bos_token_id == 1 && c.n_eos == 1 && c.eos_token_ids[0] == 2, "%s bos/eos", cas);
	CHECK(!c.attn_use_rope && c.attn_use_output_gate && c.lightning_use_rope && c.qk_norm &&
		  c.use_output_norm && c.use_output_gate,
	      "%s flags", cas);
}

static void test_real(void)
{
	struct sfw_config c;
	struct sfw_err err = {0};
	if (sfw_config_parse(real_config, strlen(real_config), "real/config.json", &c, &err) != SFW_OK) {
		CHECK(0, "real config: %s", err.msg);
		return;
	}
	CHECK(c.hidden_size == 4096 && c.intermediate_size == 16384 && c.num_hidden_layers == 32 &&
		  c.num_attention_heads == 32 && c.num_key_value_heads == 2 && c.head_dim == 128 &&
		  c.vocab_size == 73448,
	      "real sizes");
	mixers_are(&c, "SLLLLLLLLSLLLLLLSSLLLLSLLLLLLSSS", "real");
	CHECK(c.n_eos == 2 && c.eos_token_ids[0] == 2 && c.eos_token_ids[1] == 73440, "real eos [2, 73440]");
	/* docs/model-spec.md: c = 1.4/sqrt(32) = 0.2474873734152916, h / 16, 96 blocks, 32 local blocks. */
	CHECK(fabs(c.residual_scale - 0.2474873734152916) < 1e-15, "real residual scale %.17g",
	      c.residual_scale);
	CHECK(c.logit_divisor == 16.0 && c.sparse_k == 96 && c.sparse_local_blocks == 32 &&
		  c.sparse_dense_len == 8192,
	      "real derived constants");
	CHECK(c.max_position_embeddings == 524288, "real max positions");
}

static void test_slopes(void)
{
	/* golden/README.md: 0.5 * 2^-h for 8 heads. */
	int ok = 1;
	for (int h = 0; h < 8; h++)
		ok &= sfw_config_lightning_slope(8, h) == ldexpf(0.5f, -h);
	CHECK(ok, "8-head slopes 0.5 * 2^-h");
	/* docs/model-spec.md §1.2: 2^(-(h+1)/4) for 32 heads, stored as float32. */
	ok = 1;
	for (int h = 0; h < 32; h++)
		ok &= fabsf(sfw_config_lightning_slope(32, h) - (float)exp2(-(h + 1) / 4.0)) <=
		      ldexpf(1, -23) * (float)exp2(-(h + 1) / 4.0);
	CHECK(ok, "32-head slopes 2^(-(h+1)/4) to 1 ulp");
	CHECK(sfw_config_lightning_slope(32, 3) == 0.5f && sfw_config_lightning_slope(32, 7) == 0.25f &&
		  sfw_config_lightning_slope(32, 31) == 0.00390625f,
	      "slopes 3, 7, 31 are exact powers of two");
	CHECK(fabsf(sfw_config_lightning_slope(32, 0) - 0.8408964152537145f) < 1e-7f, "slope 0 = 2^-0.25");
	/* Not a power of two: the 4-head list, then every other slope of the 8-head list. */
	static const float six[6] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
	ok = 1;
	for (int h = 0; h < 6; h++)
		ok &= sfw_config_lightning_slope(6, h) == six[h];
	CHECK(ok, "6-head slopes follow the ALiBi recipe for non-powers of two");
}

/* Parses the tiny-sparse golden config after edit(); returns status, err filled. */
typedef void (*edit_fn)(cJSON *root);
static cJSON *base_config(void)
{
	char path[512];
	struct sfw_buf b;
	struct sfw_err err;
	snprintf(path, sizeof(path), "%s/tiny-sparse/config.json", golden);
	if (sfw_read_file(path, 1 << 20, &b, &err) != SFW_OK)
		return NULL;
	cJSON *r = cJSON_Parse(b.data);
	sfw_buf_release(&b);
	return r;
}

static void set(cJSON *r, const char *key, cJSON *v)
{
	char k[128];
	snprintf(k, sizeof(k), "%s", key);
	char *dot = strchr(k, '.');
	if (dot) {
		*dot = '\0';
		r = cJSON_GetObjectItemCaseSensitive(r, k);
		key = dot + 1;
	} else {
		key = k;
	}
	if (!v)
		cJSON_DeleteItemFromObjectCaseSensitive(r, key);
	else if (cJSON_GetObjectItemCaseSensitive(r, key))
		cJSON_ReplaceItemInObjectCaseSensitive(r, key, v);
	else
		cJSON_AddItemToObject(r, key, v);
}

static enum sfw_status try_edit(const char *key, cJSON *v, struct sfw_config *c, struct sfw_err *err)
{
	cJSON *r = base_config();
	if (!r)
		return sfw_fail(err, SFW_E_IO, "no golden config");
	if (key)
		set(r, key, v);
	char *text = cJSON_PrintUnformatted(r);
	enum sfw_status s = sfw_config_parse(text, strlen(text), "x/config.json", c, err);
	free(text);
	cJSON_Delete(r);
	return s;
}

static void bad(const char *label, const char *key, cJSON *v, enum sfw_status want, const char *needle)
{
	struct sfw_config c;
	struct sfw_err err = {0};
	enum sfw_status s = try_edit(key, v, &c, &err);
	CHECK(s == want && strstr(err.msg, "'x/config.json'") && strstr(err.msg, needle) &&
		  !strchr(err.msg, '\n'),
	      "%s: status %d want %d, '%s' in: %s", label, s, want, needle, err.msg);
}

static cJSON *mixers(const char *letters, const char *lname)
{
	cJSON *a = cJSON_CreateArray();
	for (const char *p = letters; *p; p++)
		cJSON_AddItemToArray(a, cJSON_CreateString(*p == 'S'   ? "minicpm4"
							   : *p == 'L' ? lname
								       : "mamba"));
	return a;
}

static void test_hostile(void)
{
	struct sfw_config c;
	struct sfw_err err = {0};
	CHECK(try_edit(NULL, NULL, &c, &err) == SFW_OK, "unedited base parses: %s", err.msg);
	/* Accepted spellings and ignored fields. */
	static const char *const spell[] = {"lightning", "lightning_attn", "lightning-attn"};
	for (int i = 0; i < 3; i++) {
		CHECK(try_edit("mixer_types", mixers("SLLSLS", spell[i]), &c, &err) == SFW_OK &&
			  c.mixer[1] == SFW_MIXER_LIGHTNING,
		      "mixer spelling '%s' accepted: %s", spell[i], err.msg);
	}
	CHECK(try_edit("eos_token_id", cJSON_CreateNumber(7), &c, &err) == SFW_OK && c.n_eos == 1 &&
		  c.eos_token_ids[0] == 7,
	      "eos_token_id as a single int");
	CHECK(try_edit("torch_dtype", cJSON_CreateString("float32"), &c, &err) == SFW_OK,
	      "torch_dtype ignored");
	CHECK(try_edit("dtype", cJSON_CreateNumber(5), &c, &err) == SFW_OK, "dtype ignored");
	CHECK(try_edit("head_dim", NULL, &c, &err) == SFW_OK && c.head_dim == 32,
	      "head_dim defaults to hidden/heads");
	{
		/* a default obeys the field's range; an odd lightning head with RoPE
		 * is refused here, not by an assertion in the first layer */
		static const char *const keys[2][4] = {{"head_dim", "num_attention_heads", "num_key_value_heads", "hidden_size"},
						      {"hidden_size", "lightning_nh", "lightning_nkv", "lightning_head_dim"}};
		static const double vals[2][4] = {{-1, 1, 1, 2048}, {258, 2, 2, 129}};
		static const char *const want[2] = {"default 2048 is outside", "lightning_head_dim 129 must be even"};
		for (int t = 0; t < 2; t++) {
			cJSON *r = base_config();
			for (int i = 0; r && i < 4 && keys[t][i]; i++)
				set(r, keys[t][i], vals[t][i] < 0 ? NULL : cJSON_CreateNumber(vals[t][i]));
			char *text = r ? cJSON_PrintUnformatted(r) : NULL;
			enum sfw_status st = text ? sfw_config_parse(text, strlen(text), "x/config.json", &c, &err) : SFW_OK;
			CHECK(st != SFW_OK && strstr(err.msg, want[t]), "config refused: '%s' in: %s", want[t], err.msg);
			free(text);
			cJSON_Delete(r);
		}
	}

	/* Wrong types. */
	bad("hidden_size string", "hidden_size", cJSON_CreateString("256"), SFW_E_FORMAT,
	    "'hidden_size' must be an integer");
	bad("hidden_size fraction", "hidden_size", cJSON_CreateNumber(255.5), SFW_E_FORMAT,
	    "must be an integer");
	bad("eps string", "rms_norm_eps", cJSON_CreateString("1e-6"), SFW_E_FORMAT,
	    "'rms_norm_eps' must be a number");
	bad("mixer_types string", "mixer_types", cJSON_CreateString("minicpm4"), SFW_E_FORMAT,
	    "'mixer_types' must be a list");
	bad("mixer entry number", "mixer_types", cJSON_CreateIntArray((const int[]){1, 2, 3, 4, 5, 6}, 6),
	    SFW_E_FORMAT, "mixer_types[0] must be a string");
	bad("bool as int", "attn_use_output_gate", cJSON_CreateNumber(1), SFW_E_FORMAT,
	    "must be true or false");
	bad("sparse_config list", "sparse_config", cJSON_CreateArray(), SFW_E_FORMAT, "must be an object");
	bad("eos string", "eos_token_id", cJSON_CreateString("2"), SFW_E_FORMAT, "integer or a list");
	bad("model_type number", "model_type", cJSON_CreateNumber(1), SFW_E_FORMAT, "must be a string");
	/* Missing fields. */
	bad("no hidden_size", "hidden_size", NULL, SFW_E_FORMAT, "missing field 'hidden_size'");
	bad("no mixer_types", "mixer_types", NULL, SFW_E_FORMAT, "missing field 'mixer_types'");
	bad("no sparse_config", "sparse_config", NULL, SFW_E_FORMAT, "missing field 'sparse_config'");
	bad("no topk", "sparse_config.topk", NULL, SFW_E_FORMAT, "missing field 'sparse_config.topk'");
	bad("no model_type", "model_type", NULL, SFW_E_FORMAT, "missing field 'model_type'");
	bad("no eos", "eos_token_id", NULL, SFW_E_FORMAT, "missing field 'eos_token_id'");
	bad("no lightning_nh", "lightning_nh", NULL, SFW_E_FORMAT, "missing field 'lightning_nh'");
	bad("no scale_depth", "scale_depth", NULL, SFW_E_FORMAT, "missing field 'scale_depth'");
	/* Unknown model. */
	bad("llama", "model_type", cJSON_CreateString("llama"), SFW_E_UNSUPPORTED,
	    "model_type 'llama' is not supported");
	/* Zero and negative sizes. */
	bad("hidden 0", "hidden_size", cJSON_CreateNumber(0), SFW_E_RANGE, "'hidden_size' = 0 is outside");
	bad("layers -1", "num_hidden_layers", cJSON_CreateNumber(-1), SFW_E_RANGE,
	    "'num_hidden_layers' = -1");
	bad("vocab 0", "vocab_size", cJSON_CreateNumber(0), SFW_E_RANGE, "'vocab_size' = 0");
	bad("head_dim 0", "head_dim", cJSON_CreateNumber(0), SFW_E_RANGE, "'head_dim' = 0");
	bad("block_size 0", "sparse_config.block_size", cJSON_CreateNumber(0), SFW_E_RANGE,
	    "'sparse_config.block_size' = 0");
	bad("eps 0", "rms_norm_eps", cJSON_CreateNumber(0), SFW_E_RANGE,
	    "'rms_norm_eps' = 0 is out of range");
	bad("scale_emb -1", "scale_emb", cJSON_CreateNumber(-1), SFW_E_RANGE, "'scale_emb'");
	bad("too many layers", "num_hidden_layers", cJSON_CreateNumber(SFW_MAX_LAYERS + 1), SFW_E_RANGE,
	    "'num_hidden_layers' = 257 is outside [1, 256]");
	bad("huge hidden", "hidden_size", cJSON_CreateNumber(1e18), SFW_E_RANGE, "'hidden_size'");
	/* Mixer list. */
	bad("mixer list short", "mixer_types", mixers("SLLSL", "lightning-attn"), SFW_E_FORMAT,
	    "mixer_types has 5 entries for 6 layers");
	bad("layer 0 lightning", "mixer_types", mixers("LSLSLS", "lightning-attn"), SFW_E_UNSUPPORTED,
	    "layer 0 must be 'minicpm4'");
	bad("unknown mixer", "mixer_types", mixers("SLLSLX", "lightning-attn"), SFW_E_UNSUPPORTED,
	    "mixer_types[5] = 'mamba' is unknown");
	/* Inconsistent shapes. */
	bad("lightning width", "lightning_head_dim", cJSON_CreateNumber(16), SFW_E_FORMAT,
	    "lightning_nh 8 x lightning_head_dim 16 must equal hidden_size 256");
	bad("gqa groups", "num_key_value_heads", cJSON_CreateNumber(3), SFW_E_FORMAT,
	    "not a multiple of num_key_value_heads 3");
	bad("lightning gqa", "lightning_nkv", cJSON_CreateNumber(4), SFW_E_UNSUPPORTED,
	    "lightning_nkv 4 differs");
	bad("window not in blocks", "sparse_config.window_size", cJSON_CreateNumber(100), SFW_E_UNSUPPORTED,
	    "not a multiple of block_size");
	bad("stride > kernel", "sparse_config.kernel_stride", cJSON_CreateNumber(64), SFW_E_UNSUPPORTED,
	    "not consistent");
	bad("eos out of vocab", "eos_token_id", cJSON_CreateIntArray((const int[]){2, 1024}, 2), SFW_E_RANGE,
	    "token ids below 1024");
	bad("eos too many", "eos_token_id", cJSON_CreateIntArray((const int[]){1, 2, 3, 4, 5, 6, 7, 8, 9}, 9),
	    SFW_E_RANGE, "9 ids");
	bad("bos out of vocab", "bos_token_id", cJSON_CreateNumber(5000), SFW_E_RANGE, "'bos_token_id'");
	/* Features the engine does not implement. */
	bad("tied embeddings", "tie_word_embeddings", cJSON_CreateTrue(), SFW_E_UNSUPPORTED,
	    "tie_word_embeddings");
	bad("gelu", "hidden_act", cJSON_CreateString("gelu"), SFW_E_UNSUPPORTED, "hidden_act 'gelu'");
	bad("yarn", "rope_scaling", cJSON_CreateObject(), SFW_E_UNSUPPORTED, "rope_scaling");
	bad("sparse rope", "attn_use_rope", cJSON_CreateTrue(), SFW_E_UNSUPPORTED, "attn_use_rope");
	bad("lightning scale", "lightning_scale", cJSON_CreateString("1"), SFW_E_UNSUPPORTED,
	    "lightning_scale");

	/* Not JSON / not an object / duplicate keys. */
	const char *texts[][2] = {
	    {"[1,2]", "not a JSON object"},
	    {"{\"model_type\":", "invalid JSON"},
	    {"{\"model_type\":\"minicpm_sala\",\"model_type\":\"minicpm_sala\"}", "duplicate key"}};
	for (int i = 0; i < 3; i++) {
		enum sfw_status s =
		    sfw_config_parse(texts[i][0], strlen(texts[i][0]), "x/config.json", &c, &err);
		CHECK(s == SFW_E_FORMAT && strstr(err.msg, "'x/config.json'") && strstr(err.msg, texts[i][1]),
		      "'%s' rejected: %s", texts[i][0], err.msg);
	}
	CHECK(sfw_config_load("/nonexistent-model-dir", &c, &err) == SFW_E_MISSING &&
		  strstr(err.msg, "/nonexistent-model-dir/config.json"),
	      "missing config.json: %s", err.msg);
}

int main(void)
{
	golden = check_golden_dir();
	if (golden) {
		test_golden("tiny-dense", 4, "SLLS", 4, 8192, 0.7);
		test_golden("tiny-sparse", 6, "SLLSLS", 4, 512, 0.5715476066494083);
		test_golden("tiny-cross", 4, "SLSL", 2, 384, 0.7);
		test_hostile();
	}
	test_real();
	test_slopes();
	return CHECK_REPORT("test_config");
}
