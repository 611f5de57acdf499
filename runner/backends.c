/* backends.c - the registry of the backends this build has (backend.h), in
 * the order SFW_DEVICE_AUTO tries them. A build with CUDA lists the CUDA
 * backend first; the CPU backend, which always starts, comes last. */
#include "runner/backend.h"

static enum sfw_status cpu_create(const struct sfw_model_params *p, struct sfw_backend **out, struct sfw_err *err)
{
	return sfw_backend_cpu_new(p->threads, out, err);
}

#ifdef SFW_HAVE_CUDA
static enum sfw_status cuda_create(const struct sfw_model_params *p, struct sfw_backend **out, struct sfw_err *err)
{
	return sfw_backend_cuda_new(&p->be, out, err);
}
#endif

static const struct sfw_backend_entry list[] = {
#ifdef SFW_HAVE_CUDA
	{SFW_DEVICE_CUDA, "cuda", cuda_create},
#endif
	{SFW_DEVICE_CPU, "cpu", cpu_create},
};

const struct sfw_backend_entry *sfw_backend_list(int *n)
{
	*n = (int)(sizeof(list) / sizeof(list[0]));
	return list;
}
