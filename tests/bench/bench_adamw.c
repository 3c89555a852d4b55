/* Benchmark of the AdamW kernel (bf16 gradients, bf16 weight copy; moments in fp32, bf16 or 8-bit
 * as --moments says) against plain memory-copy
 * bandwidth measured in the same run with the same pinned threads: AdamW is memory bound, so the
 * ratio of the two says how close the kernel is to what the machine can do. */
#include <errno.h>
#include <hwloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/base/dtype.h"
#include "common/base/log.h"
#include "opt_worker/adamw.h"
#include "opt_worker/quant8.h"
#include "opt_worker/threads.h"

/* Bytes per parameter and step: read grad 2 + master 4 + m/v, write master 4 + m/v + bf16 2, where
 * m/v are 8 bytes (fp32), 4 (bf16) or 2 (8-bit, plus 8 bytes of absmax per 256). */
static double bytes_per_param(int moments)
{
    double mv = moments == FY_ADAMW_MOMENTS_F32 ? 8.0 : moments == FY_ADAMW_MOMENTS_BF16 ? 4.0
                                                                                       : 2.0 + 8.0 / 256;
    return 2 + 4 + mv + 4 + mv + 2;
}

struct bench {
    struct fy_adamw_tensor x;
    uint16_t *grad;
    char *src, *dst;
    size_t copy_bytes;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--params N] [--threads T] [--seconds S] [--impl auto|scalar|avx2|avx512]\n"
            "          [--moments f32|bf16|q8]\n"
            "  N: parameters (default 64M; suffixes K, M, G), T: pinned threads (default: all "
            "CPUs this process may use), S: seconds of measurement (default 10)\n",
            argv0);
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0)
        return -EINVAL;
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024, end++;
    if (*end != '\0')
        return -EINVAL;
    *out = (size_t)(v * mul);
    return 0;
}

/* OS indexes of the PUs this process may run on (at most max); their count. */
static unsigned allowed_cpus(int *cpus, unsigned max)
{
    hwloc_topology_t topo;
    unsigned k = 0;
    if (hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0) {
        hwloc_cpuset_t set = hwloc_bitmap_alloc();
        if (set && hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
            int i;
            hwloc_bitmap_foreach_begin(i, set)
            {
                if (k < max)
                    cpus[k++] = i;
            }
            hwloc_bitmap_foreach_end();
        }
        hwloc_bitmap_free(set);
        hwloc_topology_destroy(topo);
    }
    if (k == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        for (long i = 0; i < n && k < max; i++)
            cpus[k++] = (int)i;
    }
    return k;
}

static void *big_alloc(size_t bytes)
{
    void *p = NULL;
    size_t align = 2u << 20;
    bytes = (bytes + align - 1) / align * align;
    if (posix_memalign(&p, align, bytes) != 0)
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE); /* best effort: fewer TLB misses on the streams */
    return p;
}

/* First touch by the thread that will use each range, so pages land on its NUMA node. */
static int touch_fn(void *arg, unsigned index, unsigned count)
{
    struct bench *b = arg;
    size_t lo, hi;
    fy_threads_split(b->x.n, FY_QUANT8_BLOCK, index, count, &lo, &hi);
    uint64_t seed = 0x1234567ull + index;
    for (size_t i = lo; i < hi; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        float r = (float)(int32_t)(seed >> 32) * (1.0f / 2147483648.0f);
        b->x.master[i] = r;
        if (b->x.moments == FY_ADAMW_MOMENTS_F32) {
            ((float *)b->x.m)[i] = 0.0f;
            ((float *)b->x.v)[i] = 0.0f;
        } else if (b->x.moments == FY_ADAMW_MOMENTS_BF16) {
            ((uint16_t *)b->x.m)[i] = 0;
            ((uint16_t *)b->x.v)[i] = 0;
        } else {
            ((uint8_t *)b->x.m)[i] = fy_quant8_zero_code(1);
            ((uint8_t *)b->x.v)[i] = fy_quant8_zero_code(0);
            if (i % FY_QUANT8_BLOCK == 0)
                b->x.m_absmax[i / FY_QUANT8_BLOCK] = b->x.v_absmax[i / FY_QUANT8_BLOCK] = 0.0f;
        }
        b->grad[i] = fy_f32_to_bf16(r * 0.01f);
        b->x.weight_bf16[i] = 0;
    }
    fy_threads_split(b->copy_bytes, 4096, index, count, &lo, &hi);
    memset(b->src + lo, 1, hi - lo);
    memset(b->dst + lo, 0, hi - lo);
    return 0;
}

static int copy_fn(void *arg, unsigned index, unsigned count)
{
    struct bench *b = arg;
    size_t lo, hi;
    fy_threads_split(b->copy_bytes, 4096, index, count, &lo, &hi);
    memcpy(b->dst + lo, b->src + lo, hi - lo);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    fy_log_init("bench", FY_LOG_WARN);
    size_t n = 64u << 20;
    unsigned threads = 0;
    double seconds = 10;
    enum fy_adamw_impl impl = FY_ADAMW_AUTO;
    int moments = FY_ADAMW_MOMENTS_F32;
    static const char *const moment_names[] = {"f32", "bf16", "q8"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--params") == 0 && v && parse_size(v, &n) == 0)
            i++;
        else if (strcmp(a, "--threads") == 0 && v && atoi(v) > 0)
            threads = (unsigned)atoi(v), i++;
        else if (strcmp(a, "--seconds") == 0 && v && atof(v) > 0)
            seconds = atof(v), i++;
        else if (strcmp(a, "--impl") == 0 && v && fy_adamw_impl_parse(v, &impl) == 0)
            i++;
        else if (strcmp(a, "--moments") == 0 && v && (strcmp(v, "f32") == 0 ||
                                                       strcmp(v, "bf16") == 0 ||
                                                       strcmp(v, "q8") == 0))
            moments = v[0] == 'f' ? FY_ADAMW_MOMENTS_F32
                      : v[0] == 'b' ? FY_ADAMW_MOMENTS_BF16 : FY_ADAMW_MOMENTS_Q8, i++;
        else {
            usage(argv[0]);
            return 2;
        }
    }
    if (impl == FY_ADAMW_AUTO)
        impl = fy_adamw_best_impl();
    if (!fy_adamw_impl_supported(impl)) {
        fprintf(stderr, "this CPU cannot run the %s kernel; try --impl auto\n",
                fy_adamw_impl_name(impl));
        return 2;
    }

    static int cpus[4096];
    unsigned avail = allowed_cpus(cpus, 4096);
    if (threads == 0)
        threads = avail;
    int *pin = cpus;
    if (threads > avail) {
        fprintf(stderr, "note: %u threads asked, %u CPUs available: running unpinned\n", threads,
                avail);
        pin = NULL;
    }
    struct fy_threads *pool = NULL;
    if (fy_threads_new(&pool, pin, threads) < 0)
        return 1;

    struct bench b = {0};
    b.x.n = n;
    b.x.grad_dtype = FY_DTYPE_BF16;
    /* copy buffers big enough to defeat caches, bounded so the run fits small machines */
    b.copy_bytes = n * 8 < (1u << 30) ? n * 8 : (1u << 30);
    if (b.copy_bytes < (64u << 20))
        b.copy_bytes = 64u << 20;
    b.x.master = big_alloc(n * 4);
    size_t msize = moments == FY_ADAMW_MOMENTS_F32 ? 4 : moments == FY_ADAMW_MOMENTS_BF16 ? 2 : 1;
    b.x.moments = moments;
    b.x.m = big_alloc(n * msize);
    b.x.v = big_alloc(n * msize);
    b.x.m_absmax = big_alloc(fy_quant8_blocks(n) * 4);
    b.x.v_absmax = big_alloc(fy_quant8_blocks(n) * 4);
    b.grad = big_alloc(n * 2);
    b.x.weight_bf16 = big_alloc(n * 2);
    b.src = big_alloc(b.copy_bytes);
    b.dst = big_alloc(b.copy_bytes);
    b.x.grad = b.grad;
    if (!b.x.master || !b.x.m || !b.x.v || !b.x.m_absmax || !b.x.v_absmax || !b.grad || !b.x.weight_bf16 || !b.src || !b.dst) {
        fprintf(stderr, "out of memory for %zu parameters (%.2f GB); lower --params\n", n,
                (double)n * 16 / 1e9);
        return 1;
    }
    fy_threads_run(pool, touch_fn, &b);

    struct fy_adamw_hparams hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
    uint64_t t = 1;
    /* warm-up pass of each */
    if (fy_adamw_update(pool, &hp, t++, &b.x, impl) < 0)
        return 1;
    fy_threads_run(pool, copy_fn, &b);

    enum { MAXREP = 10000 };
    static double ta[MAXREP], tc[MAXREP];
    int reps = 0;
    double start = now();
    /* alternate the two so that both see the same machine state */
    while (reps < MAXREP && (reps < 3 || now() - start < seconds)) {
        double t0 = now();
        fy_adamw_update(pool, &hp, t++, &b.x, impl);
        double t1 = now();
        fy_threads_run(pool, copy_fn, &b);
        double t2 = now();
        ta[reps] = t1 - t0;
        tc[reps] = t2 - t1;
        reps++;
    }
    double sa = median(ta, reps), sc = median(tc, reps);
    double gps = (double)n / sa / 1e9;
    double gbs = gps * bytes_per_param(moments);
    double cbs = 2.0 * (double)b.copy_bytes / sc / 1e9;
    printf("params %zu (%.2f GB touched per step), copy buffers 2 x %.2f GB, %d repetitions, "
           "medians\n", n, (double)n * bytes_per_param(moments) / 1e9, (double)b.copy_bytes / 1e9, reps);
    printf("%-7s %-7s %7s %6s %10s %10s %9s %6s\n", "impl", "moments", "threads", "pinned",
           "Gparams/s", "AdamW GB/s", "copy GB/s", "ratio");
    printf("%-7s %-7s %7u %6u %10.3f %10.1f %9.1f %6.2f\n", fy_adamw_impl_name(impl),
           moment_names[moments], threads,
           fy_threads_pinned(pool), gps, gbs, cbs, gbs / cbs);
    fy_threads_destroy(&pool);
    free(b.x.master);
    free(b.x.m);
    free(b.x.v);
    free(b.x.m_absmax);
    free(b.x.v_absmax);
    free(b.grad);
    free(b.x.weight_bf16);
    free(b.src);
    free(b.dst);
    return 0;
}
