/* modules: tools quant runner formats kernels num fetch verify core */
/* gpu_ctxstate.c - tests/test_ctxstate.c on the CUDA backend: the states
 * go through the cache views and device<->host transfers; a context that
 * loads one gives the logits, choices and selection notes of a context that
 * made the same calls bit for bit (decode steps replayed from recordings on
 * both sides), and every misfit leaves it reset. */
#include "runner/backend.h"

#define CS_CUDA 1
#define CS_NAME "gpu_ctxstate"
#define CS_DEVICE SFW_DEVICE_CUDA
#include "test_ctxstate.c"
