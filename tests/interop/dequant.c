/* dequant.c - salafw's own dequantization of a pack-quantized model, for
 * tests/interop/run.sh to compare with compressed-tensors': every
 * <module>.weight_packed / weight_scale (BF16) of MODEL_DIR becomes an F32
 * tensor <module>.weight in OUT.safetensors, computed by the reference
 * dequantizer (sfw_quant_dequant_row_w8: (b - 128) * scale in float32, the
 * runtime contract of num/w8_layout.h).
 *   dequant MODEL_DIR OUT.safetensors */
/* modules: quant runner formats kernels num core */
#include "alloc.h"
#include "formats/safetensors.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct sfw_tensor_info *find(const struct sfw_st_set *set, const char *mod, const char *suffix)
{
	char nm[512];
	snprintf(nm, sizeof(nm), "%s%s", mod, suffix);
	for (size_t k = 0; k < sfw_st_set_count(set); k++)
		if (!strcmp(sfw_st_set_at(set, k)->name, nm))
			return sfw_st_set_at(set, k);
	return NULL;
}

/* The group size whose scale width is G for K columns (G = 1: per channel). */
static int group_of(int64_t K, int64_t G)
{
	static const int gs[] = {32, 64, 128};
	if (G == 1)
		return SFW_QL_GROUP_CHANNEL;
	for (int i = 0; i < 3; i++)
		if (sfw_ql_ngroups(K, gs[i]) == G)
			return gs[i];
	return -1;
}

static int fail(const char *what, const struct sfw_err *e)
{
	fprintf(stderr, "dequant: %s: %s\n", what, e->msg);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: dequant MODEL_DIR OUT.safetensors\n");
		return 2;
	}
	struct sfw_err err = {0};
	struct sfw_st_set *set = NULL;
	struct sfw_st_writer *w = NULL;
	if (sfw_st_set_open(argv[1], &set, &err) != SFW_OK)
		return fail(argv[1], &err);
	if (sfw_st_writer_new(argv[2], &w, &err) != SFW_OK)
		return fail(argv[2], &err);
	size_t n = sfw_st_set_count(set);
	const struct sfw_tensor_info **packed = calloc(n, sizeof(*packed)),
				     **scale = calloc(n, sizeof(*scale));
	int64_t *Ks = calloc(n, sizeof(*Ks));
	size_t m = 0;
	static const char suf[] = ".weight_packed";
	for (size_t i = 0; i < n; i++) { /* declare first: the writer streams the data after the header */
		const struct sfw_tensor_info *t = sfw_st_set_at(set, i);
		size_t l = strlen(t->name);
		if (l <= sizeof(suf) - 1 || strcmp(t->name + l - (sizeof(suf) - 1), suf) != 0)
			continue;
		char mod[512];
		snprintf(mod, sizeof(mod), "%.*s", (int)(l - (sizeof(suf) - 1)), t->name);
		const struct sfw_tensor_info *s = find(set, mod, ".weight_scale"),
					     *ws = find(set, mod, ".weight_shape");
		if (!s || s->dtype != SFW_DTYPE_BF16 || s->ndim != 2 || t->ndim != 2 ||
		    t->dtype != SFW_DTYPE_I32 || s->shape[0] != t->shape[0] || !ws ||
		    ws->dtype != SFW_DTYPE_I64 || ws->nelem != 2) {
			fprintf(stderr, "dequant: '%s' lacks a BF16 weight_scale or an I64 weight_shape\n",
				mod);
			return 1;
		}
		int64_t N = ((const int64_t *)ws->data)[0], K = ((const int64_t *)ws->data)[1];
		if (N != (int64_t)t->shape[0] || sfw_ql_words(K) != (int64_t)t->shape[1] ||
		    group_of(K, (int64_t)s->shape[1]) < 0) {
			fprintf(stderr, "dequant: '%s': the shapes do not agree\n", mod);
			return 1;
		}
		packed[m] = t, scale[m] = s, Ks[m] = K, m++;
		uint64_t shape[2] = {(uint64_t)N, (uint64_t)K};
		char wn[520];
		snprintf(wn, sizeof(wn), "%s.weight", mod);
		if (sfw_st_writer_declare(w, wn, SFW_DTYPE_F32, 2, shape, &err) != SFW_OK)
			return fail(wn, &err);
	}
	for (size_t i = 0; i < m; i++) {
		const struct sfw_tensor_info *t = packed[i], *s = scale[i];
		int64_t N = (int64_t)t->shape[0], G = (int64_t)s->shape[1], P = (int64_t)t->shape[1],
			K = Ks[i];
		int group = group_of(K, G);
		float *row = malloc((size_t)K * sizeof(float));
		for (int64_t r = 0; r < N; r++) {
			sfw_quant_dequant_row_w8((const uint8_t *)t->data + (size_t)r * (size_t)P * 4,
						 (const uint16_t *)s->data + (size_t)r * (size_t)G, K, group,
						 row);
			if (sfw_st_writer_write(w, row, (size_t)K * sizeof(float), &err) != SFW_OK)
				return fail(argv[2], &err);
		}
		free(row);
	}
	if (sfw_st_writer_commit(w, &err) != SFW_OK)
		return fail(argv[2], &err);
	sfw_st_writer_free(w);
	sfw_st_set_close(set);
	free(packed);
	free(scale);
	free(Ks);
	printf("dequant: %zu linears -> %s\n", m, argv[2]);
	return 0;
}
