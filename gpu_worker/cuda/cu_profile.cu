/* Timing for the activation planner's profile of a block on the CUDA backend (contract:
 * cu_profile.h). */
#include "gpu_worker/cuda/cu_profile.h"

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

int fy_cu_profile_links(cudaStream_t h2d, cudaStream_t d2h, cudaStream_t compute,
                        cudaEvent_t ev[FY_CU_PROFILE_EVENTS], char *host, char *dev, size_t bytes,
                        struct fy_block_profile *out)
{
    size_t half = bytes / 2;
    double up[FY_CU_PROFILE_REPS], down[FY_CU_PROFILE_REPS], both[FY_CU_PROFILE_REPS];
    for (int r = -1; r < FY_CU_PROFILE_REPS; r++) {
        double t_up, t_down, t_a, t_b;
        FY_CUDA(cudaEventRecord(ev[0], h2d), "recording a profiling event");
        FY_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, h2d),
                "profiling an upload of %zu bytes", bytes);
        FY_CUDA(cudaEventRecord(ev[1], h2d), "recording a profiling event");
        FY_TRY(fy_cu_profile_elapsed(ev[0], ev[1], &t_up));
        FY_CUDA(cudaEventRecord(ev[0], d2h), "recording a profiling event");
        FY_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, d2h),
                "profiling a download of %zu bytes", bytes);
        FY_CUDA(cudaEventRecord(ev[1], d2h), "recording a profiling event");
        FY_TRY(fy_cu_profile_elapsed(ev[0], ev[1], &t_down));
        FY_CUDA(cudaEventRecord(ev[0], compute), "recording a profiling event");
        FY_CUDA(cudaStreamWaitEvent(h2d, ev[0], 0), "starting the profile's copies together");
        FY_CUDA(cudaStreamWaitEvent(d2h, ev[0], 0), "starting the profile's copies together");
        FY_CUDA(cudaMemcpyAsync(dev, host, half, cudaMemcpyHostToDevice, h2d),
                "profiling an upload of %zu bytes", half);
        FY_CUDA(cudaMemcpyAsync(host + half, dev + half, half, cudaMemcpyDeviceToHost, d2h),
                "profiling a download of %zu bytes", half);
        FY_CUDA(cudaEventRecord(ev[1], h2d), "recording a profiling event");
        FY_CUDA(cudaEventRecord(ev[2], d2h), "recording a profiling event");
        FY_TRY(fy_cu_profile_elapsed(ev[0], ev[1], &t_a));
        FY_TRY(fy_cu_profile_elapsed(ev[0], ev[2], &t_b));
        if (r < 0)
            continue;
        up[r] = t_up;
        down[r] = t_down;
        both[r] = t_a > t_b ? t_a : t_b;
    }
    out->h2d_Bps = (double)bytes / fy_cu_profile_median(up, FY_CU_PROFILE_REPS);
    out->d2h_Bps = (double)bytes / fy_cu_profile_median(down, FY_CU_PROFILE_REPS);
    out->duplex_Bps = (double)(2 * half) / fy_cu_profile_median(both, FY_CU_PROFILE_REPS);
    return 0;
}
