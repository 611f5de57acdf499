/* fuzz_serve_req - libFuzzer target for the server's request parser
 * (serve/req.c): the bytes as a /v1/completions body and as a
 * /v1/chat/completions body. Whatever is accepted must respect the bounds
 * (stop strings 1..SFW_STOP_MAX_LEN bytes of UTF-8, at most SFW_STOP_MAX;
 * token ids below the vocab; roles system/user/assistant/tool; sampling
 * values, n, logprobs and biases in range); whatever is refused must give a
 * 400/404/413 error object that is valid JSON. */
#include "alloc.h"
#include "json.h"
#include "serve/serve.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(const struct sfw_serve_error *e)
{
	if (e->http != 400 && e->http != 404 && e->http != 413)
		abort();
	char *j = sfw_serve_error_json(e);
	cJSON *o = NULL;
	struct sfw_err err;
	if (!j || sfw_json_parse(j, strlen(j), "error", &o, &err) != SFW_OK)
		abort();
	cJSON_Delete(o);
	sfw_free(j);
}

static void check_req(const struct sfw_serve_req *r, int vocab)
{
	if (r->n_stop > SFW_STOP_MAX || r->max_tokens < 0 || r->max_tokens > (1 << 30) ||
	    r->temperature < 0 || r->temperature > 2 || !(r->top_p > 0 && r->top_p <= 1) || r->top_k < 0 ||
	    (strcmp(r->model, "m") && strcmp(r->model, "org/m")) || r->n < 1 || r->n > SFW_SERVE_N_MAX ||
	    r->top_logprobs < 0 || r->top_logprobs > SFW_SAMPLE_TOP_MAX || r->n_bias > SFW_SERVE_BIAS_MAX ||
	    !(r->min_p >= 0 && r->min_p <= 1) || !(r->repetition_penalty > 0) ||
	    !(r->presence_penalty >= -2 && r->presence_penalty <= 2) ||
	    !(r->frequency_penalty >= -2 && r->frequency_penalty <= 2))
		abort();
	for (size_t i = 0; i < r->n_stop; i++) {
		size_t n = strlen(r->stop[i]);
		if (n < 1 || n > SFW_STOP_MAX_LEN || !sfw_utf8_valid((const unsigned char *)r->stop[i], n))
			abort();
	}
	if (r->kind == SFW_SERVE_COMPLETION) {
		if (!r->prompt == !r->prompt_ids)
			abort();
		for (size_t i = 0; i < r->n_prompt_ids; i++)
			if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= vocab)
				abort();
	} else {
		if (r->n_msgs < 1 || r->n_msgs > SFW_SERVE_MSGS_MAX)
			abort();
		for (size_t i = 0; i < r->n_msgs; i++)
			if (!r->msgs[i].content ||
			    (strcmp(r->msgs[i].role, "system") && strcmp(r->msgs[i].role, "user") &&
			     strcmp(r->msgs[i].role, "assistant") && strcmp(r->msgs[i].role, "tool")))
				abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const int vocab = 73448;
	static const char *const names[] = {"org/m", "m"};
	for (int k = 0; k < 2; k++) {
		struct sfw_serve_req r;
		struct sfw_serve_error e;
		enum sfw_serve_kind kind = k ? SFW_SERVE_CHAT : SFW_SERVE_COMPLETION;
		if (sfw_serve_req_parse((const char *)data, size, kind, names, 2, vocab, &r, &e) == SFW_OK)
			check_req(&r, vocab);
		else
			check_error(&e);
		sfw_serve_req_release(&r);
	}
	return 0;
}
