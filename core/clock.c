/* clock.c - the monotonic clock every module times work with (core/sfw.h). */
#include "sfw.h"

#include <time.h>

double sfw_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
