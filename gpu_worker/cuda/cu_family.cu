/* The timing helpers that cu_model and the families' profiles share (contract: cu_family.h). */
#include "gpu_worker/cuda/cu_family.h"

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
