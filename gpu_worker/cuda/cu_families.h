/* The CUDA backend's one list of model families (the contract of each: cu_family.h), looked up by
 * the registry's name (common/model/arch/arch.h). It sits above the families' units, which include the
 * contract only. Adding a family: its units file and one line in cu_families.cu. */
#ifndef FY_CU_FAMILIES_H
#define FY_CU_FAMILIES_H

#include "common/model/model.h"
#include "gpu_worker/cuda/cu_family.h"

/* The CUDA units of c's family, by the registry's name; NULL when the backend has none. */
const struct fy_cu_family *fy_cu_family_of(const struct fy_model_config *c);

#endif
