/* modules: quant runner formats kernels num fetch verify core */
/* gpu_reentrant.c - tests/test_reentrant.c on the CUDA backend: tiny-dense
 * and tiny-sparse loaded side by side, each with its own CUDA backend (its
 * stream, cuBLASLt handle, scratch and options: CUDA-core attention and
 * stage-1 kernels for one, tensor cores for every supported shape for the
 * other), run alone (checked against golden_bf16 at test_golden's bf16 logit
 * tolerance, 1.5e-2), interleaved on one thread and on two threads at once;
 * the later runs must give the logits of the runs alone bit for bit. */
#include "runner/backend.h"

#define RE_CUDA 1
#define RE_NAME "gpu_reentrant"
#define RE_DEVICE SFW_DEVICE_CUDA
#define RE_GOLDEN "golden_bf16"
#define RE_TOL 1.5e-2
#include "test_reentrant.c"
