/* The GPU memory arena: a bump allocator over one cudaMalloc of the budgeted size. */
#include "cu_arena.h"

#include <errno.h>

#include "gpu_worker/cuda/cu_common.h"

static const size_t arena_align = 256;

int fy_cu_arena_init(struct fy_cu_arena *a, size_t bytes)
{
    a->base = NULL;
    a->size = a->used = a->peak = 0;
    size_t free_bytes = 0, total = 0;
    FY_CUDA(cudaMemGetInfo(&free_bytes, &total), "reading the GPU's free memory");
    if (bytes > free_bytes) {
        fy_error("the GPU arena of %.2f GiB does not fit: %.2f GiB of %.2f GiB are free on the "
                 "device: lower --gpu-mem",
                 (double)bytes / (1 << 30), (double)free_bytes / (1 << 30),
                 (double)total / (1 << 30));
        return -ENOMEM;
    }
    FY_CUDA(cudaMalloc((void **)&a->base, bytes), "allocating the %.2f GiB GPU arena",
            (double)bytes / (1 << 30));
    a->size = bytes;
    return 0;
}

void fy_cu_arena_release(struct fy_cu_arena *a)
{
    if (a->base != NULL)
        cudaFree(a->base);
    a->base = NULL;
    a->size = a->used = 0;
}

size_t fy_cu_arena_footprint(size_t n) { return (n + arena_align - 1) / arena_align * arena_align; }

void *fy_cu_arena_take(struct fy_cu_arena *a, size_t n)
{
    size_t need = fy_cu_arena_footprint(n);
    if (a->base == NULL || need > a->size - a->used)
        return NULL;
    void *p = a->base + a->used;
    a->used += need;
    if (a->used > a->peak)
        a->peak = a->used;
    return p;
}

void fy_cu_arena_reset(struct fy_cu_arena *a, size_t mark)
{
    if (mark <= a->used)
        a->used = mark;
}

size_t fy_cu_arena_pieces_footprint(const struct fy_cu_piece *p, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += fy_cu_arena_footprint(p[i].bytes);
    return total;
}

int fy_cu_arena_take_pieces(struct fy_cu_arena *a, const struct fy_cu_piece *p, int n)
{
    size_t mark = a->used;
    for (int i = 0; i < n; i++) {
        *p[i].ptr = fy_cu_arena_take(a, p[i].bytes);
        if (*p[i].ptr == NULL) {
            fy_cu_arena_reset(a, mark);
            for (int j = 0; j < n; j++)
                *p[j].ptr = NULL;
            return -ENOMEM;
        }
    }
    return 0;
}
