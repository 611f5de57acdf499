/* jinja.h - library-internal: the bounded Jinja2 subset behind chat
 * templates (formats/chat.h documents the subset and the bounds). */
#ifndef SFWI_JINJA_H
#define SFWI_JINJA_H

#include "buf.h"
#include "sfw.h"

#include <cjson/cJSON.h>
#include <stddef.h>

struct sfwi_jinja;

/* Compiles len bytes of template source (UTF-8, no NUL); what names it in
 * messages. Syntax errors are SFW_E_FORMAT, constructs outside the subset
 * SFW_E_UNSUPPORTED, both naming the line. */
SFW_MUST_CHECK enum sfw_status sfwi_jinja_compile(const char *src, size_t len, const char *what,
						  struct sfwi_jinja **out, struct sfw_err *err);
void sfwi_jinja_free(struct sfwi_jinja *j);

/* Renders with the members of vars (a JSON object) as the variables;
 * appends to out (its cap bounds the output: SFW_E_RANGE past it).
 * raise_exception(msg) is SFW_E_INVAL with msg; other template errors are
 * SFW_E_FORMAT; too deep, too many steps or too much memory SFW_E_RANGE. */
SFW_MUST_CHECK enum sfw_status sfwi_jinja_render(const struct sfwi_jinja *j, const cJSON *vars,
						 struct sfw_buf *out, struct sfw_err *err);

#endif
