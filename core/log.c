#include "log.h"

#include <stdio.h>

static void default_sink(enum sfw_log_level level, const char *msg, void *user)
{
	(void)user;
	fprintf(stderr, "salafw: %s%s\n", level == SFW_LOG_WARN ? "warning: " : "", msg);
}

static sfw_log_fn sink = default_sink;
static void *sink_user;
static enum sfw_log_level min_lvl = SFW_LOG_INFO;

void sfw_log_set(sfw_log_fn fn, void *user, enum sfw_log_level min_level)
{
	sink = fn ? fn : default_sink;
	sink_user = user;
	min_lvl = min_level;
}

void sfw_log(enum sfw_log_level level, const char *fmt, ...)
{
	if (level < min_lvl)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sink(level, msg, sink_user);
}
