/* The CUDA backend's model families (contract: cu_family.h): the one list of their units, one line
 * each, and the timing helpers that cu_model and the families' profiles share. */
#include "gpu_worker/cuda/cu_family.h"

#include <string.h>

#include "common/model/arch/arch.h"
#include "gpu_worker/cuda/cu_gpt2_units.h"
#include "gpu_worker/cuda/cu_llama_units.h"

static const struct fy_cu_family *const families[] = {
    &fy_cu_family_gpt2,
    &fy_cu_family_llama,   &fy_cu_family_qwen2, &fy_cu_family_qwen3,
    &fy_cu_family_mistral, &fy_cu_family_phi3,
};

const struct fy_cu_family *fy_cu_family_of(const struct fy_model_config *c)
{
    const char *name = fy_model_arch(c)->name;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i]->arch, name) == 0)
            return families[i];
    return NULL;
}

double fy_cu_profile_median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

int fy_cu_profile_elapsed(cudaEvent_t from, cudaEvent_t to, double *s)
{
    float ms = 0;
    FY_CUDA(cudaEventSynchronize(to), "waiting for a profiling event");
    FY_CUDA(cudaEventElapsedTime(&ms, from, to), "reading a profiling event");
    *s = 1e-3 * ms;
    return 0;
}
