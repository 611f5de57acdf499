/* log.h - leveled messages through a replaceable sink (default: stderr).
 * The library logs warnings and progress here; errors travel in sfw_err. */
#ifndef SFW_LOG_H
#define SFW_LOG_H

#include "sfw.h"

enum sfw_log_level { SFW_LOG_DEBUG, SFW_LOG_INFO, SFW_LOG_WARN };

typedef void (*sfw_log_fn)(enum sfw_log_level level, const char *msg, void *user);

void sfw_log_set(sfw_log_fn fn, void *user, enum sfw_log_level min_level);
void sfw_log(enum sfw_log_level level, const char *fmt, ...) SFW_PRINTF(2, 3);

#endif
