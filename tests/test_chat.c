/* modules: formats core */
/* test_chat.c - the chat format module (formats/chat.h): templates loaded
 * from a model directory, the built-in template against its .jinja file,
 * hostile templates and bounds (a status, never a crash), the tool-call
 * parser fed whole and in every split, garbled model output, and
 * generation_config.json defaults (the pinned real file included).
 *
 * With --render TEMPLATE CASES.json OUT.json it renders each case for
 * tests/test_chat_template.sh, which compares the text byte for byte with
 * python3-jinja2 rendering the same template (tests/chat/render.py). */
#include "check.h"

#include "alloc.h"
#include "buf.h"
#include "file.h"
#include "formats/chat.h"
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int render_mode(const char *tpl_path, const char *cases_path, const char *out_path)
{
	struct sfw_err err = {0};
	struct sfw_buf tb, cb;
	sfw_buf_init(&tb, SFW_CHAT_TEMPLATE_MAX + 1);
	sfw_buf_init(&cb, 64u << 20);
	cJSON *cases = NULL;
	if (sfw_read_file(tpl_path, SFW_CHAT_TEMPLATE_MAX + 1, &tb, &err) != SFW_OK ||
	    sfw_read_file(cases_path, 64u << 20, &cb, &err) != SFW_OK ||
	    sfw_json_parse(cb.data, cb.len, cases_path, &cases, &err) != SFW_OK) {
		fprintf(stderr, "test_chat --render: %s\n", err.msg);
		return 2;
	}
	struct sfw_chat_template *t = NULL;
	enum sfw_status cst = sfw_chat_template_new(tb.data ? tb.data : "", tb.len, tpl_path, NULL, NULL, &t, &err);
	char cerr[300];
	snprintf(cerr, sizeof(cerr), "compile: %s", err.msg);
	cJSON *out = cJSON_CreateArray();
	for (const cJSON *c = cases->child; c; c = c->next) {
		cJSON *r = cJSON_CreateObject();
		if (cst != SFW_OK) {
			cJSON_AddFalseToObject(r, "ok");
			cJSON_AddStringToObject(r, "error", cerr);
		} else {
			struct sfw_buf o;
			sfw_buf_init(&o, 64u << 20);
			const cJSON *agp = cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt");
			enum sfw_status st = sfw_chat_render(t, cJSON_GetObjectItemCaseSensitive(c, "messages"),
							     cJSON_GetObjectItemCaseSensitive(c, "tools"),
							     cJSON_GetObjectItemCaseSensitive(c, "kwargs"),
							     cJSON_IsTrue(agp), &o, &err);
			if (st == SFW_OK) {
				cJSON_AddTrueToObject(r, "ok");
				cJSON_AddStringToObject(r, "text", o.data ? o.data : "");
			} else {
				cJSON_AddFalseToObject(r, "ok");
				cJSON_AddStringToObject(r, "error", err.msg);
			}
			sfw_buf_release(&o);
		}
		cJSON_AddItemToArray(out, r);
	}
	char *s = cJSON_PrintUnformatted(out);
	FILE *f = fopen(out_path, "w");
	int rc = !s || !f || fputs(s, f) < 0;
	if (f && fclose(f))
		rc = 1;
	free(s);
	cJSON_Delete(out);
	cJSON_Delete(cases);
	sfw_chat_template_free(t);
	sfw_buf_release(&tb);
	sfw_buf_release(&cb);
	return rc ? 2 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "--render"))
		return render_mode(argv[2], argv[3], argv[4]);
	return CHECK_REPORT("test_chat");
}
