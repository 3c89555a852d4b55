/* The CUDA backend's model families (cu_families.h): the one list of their units, one line each. */
#include "gpu_worker/cuda/cu_families.h"

#include <string.h>

#include "common/model/arch/arch.h"
#include "gpu_worker/cuda/cu_gpt2_units.h"
#include "gpu_worker/cuda/cu_llama_units.h"

static const struct fy_cu_family *const families[] = {
    &fy_cu_family_gpt2,  &fy_cu_family_llama,   &fy_cu_family_qwen2,
    &fy_cu_family_qwen3, &fy_cu_family_mistral, &fy_cu_family_phi3,
};

const struct fy_cu_family *fy_cu_family_of(const struct fy_model_config *c)
{
    const char *name = fy_model_arch(c)->name;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i]->arch, name) == 0)
            return families[i];
    return NULL;
}
