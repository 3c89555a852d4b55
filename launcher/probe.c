/* Measuring the machine for the planner (launcher/probe.h): each part in this process, through
 * the same code the workers run (the backend, the io engine and store, AdamW). */
#include "probe.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/config.h"
#include "common/desc.h"
#include "common/dtype.h"
#include "common/fsutil.h"
#include "gpu_worker/backend.h"
#include "io_worker/ring.h"
#include "io_worker/store.h"
#include "opt_worker/adamw.h"
#include "opt_worker/threads.h"

static double now_s(void) { return (double)fy_monotonic_ns() * 1e-9; }

/* One block of a model sized for the backend: 1.3B's on CUDA, a small one on the CPU (its rate is
 * the CPU backend's, whatever the size). Rate: the block's model FLOPs (as the planner counts
 * them) over a forward, its recomputation and its backward. */
static int probe_backend(const struct fy_probe_opts *o, struct fy_probe_result *r)
{
    int cuda = strcmp(o->backend, "cuda") == 0;
    struct fy_gpt_config c = {.n_layer = 1, .n_head = cuda ? 16 : 4, .n_embd = cuda ? 2048 : 256,
                              .vocab = 50304, .ctx = cuda ? 1024 : 128};
    int B = cuda ? 8 : 4, T = (int)c.ctx;
    size_t host_bytes = cuda ? (size_t)256 << 20 : (size_t)32 << 20;
    struct fy_backend *b = NULL;
    void *host = NULL;
    int rc = fy_backend_open(&b, o->backend, o->gpu_mem);
    if (rc == 0 && posix_memalign(&host, 4096, host_bytes) != 0)
        rc = -ENOMEM;
    if (rc == 0) {
        memset(host, 1, host_bytes);
        rc = fy_backend_register_host(b, host, host_bytes);
    }
    if (rc == 0)
        rc = fy_backend_gpt_prepare(b, &c, B, T);
    struct fy_gpt_profile p;
    if (rc == 0)
        rc = fy_backend_gpt_profile(b, host, host_bytes, &p);
    if (rc == 0) {
        double tokens = (double)B * T;
        double flops = tokens * (6.0 * (double)fy_gpt_unit_params(&c, 1) + 6.0 * T * c.n_embd);
        r->rates.gpu_flops = flops / (2 * p.fwd_s + p.bwd_s);
        r->rates.h2d = p.h2d_Bps;
        r->rates.d2h = p.d2h_Bps;
        r->duplex_Bps = p.duplex_Bps;
        snprintf(r->device, sizeof r->device, "%s", fy_backend_device(b));
    }
    fy_backend_close(&b);
    free(host);
    return rc;
}

/* The store over the given paths, as the io worker builds it, in a scratch directory of each:
 * io_bytes written, synced, read back (O_DIRECT: from the device), then removed. */
static int probe_ssd(const struct fy_probe_opts *o, struct fy_probe_result *r)
{
    char list[4096], dirs[16][PATH_MAX];
    const char *paths[16];
    unsigned n = 0;
    snprintf(list, sizeof list, "%s", o->ssd);
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p != NULL && n < 16;
         p = strtok_r(NULL, ",", &save), n++) {
        snprintf(dirs[n], sizeof dirs[n], "%s/.fuyou-probe-%d", p, (int)getpid());
        FY_SYS(mkdir(dirs[n], 0700), "probe: cannot create %s", dirs[n]);
        paths[n] = dirs[n];
    }
    r->ssd_paths = n;
    uint64_t total = o->io_bytes ? o->io_bytes : (uint64_t)1 << 30;
    size_t chunk = (size_t)64 << 20;
    total = (total + chunk - 1) / chunk * chunk;
    struct fy_store *s = NULL;
    struct fy_ring *ring = NULL;
    void *buf = NULL;
    struct fy_store_opts so = {.paths = paths, .npaths = n, .create = 1};
    int rc = fy_store_open(&s, &so);
    if (rc == 0)
        rc = fy_ring_new(&ring, NULL);
    if (rc == 0 && posix_memalign(&buf, 4096, chunk) != 0)
        rc = -ENOMEM;
    if (rc == 0) {
        memset(buf, 0x5a, chunk);
        rc = fy_ring_register_memory(ring, buf, chunk);
    }
    if (rc == 0)
        rc = fy_ring_register_files(ring, fy_store_fds(s), fy_store_file_names(s), n);
    if (rc == 0)
        rc = fy_store_add_extent(s, 1, total);
    double t0 = now_s();
    for (uint64_t at = 0; rc == 0 && at < total; at += chunk)
        rc = fy_store_write(s, ring, 1, at, buf, chunk, 120000);
    if (rc == 0)
        rc = fy_store_sync(s);
    double t1 = now_s();
    for (uint64_t at = 0; rc == 0 && at < total; at += chunk)
        rc = fy_store_read(s, ring, 1, at, buf, chunk, 120000);
    double t2 = now_s();
    if (rc == 0) {
        r->rates.ssd_write = (double)total / (t1 - t0);
        r->rates.ssd_read = (double)total / (t2 - t1);
    }
    fy_ring_destroy(&ring);
    fy_store_close(&s);
    free(buf);
    for (unsigned i = 0; i < n; i++) { /* the scratch store's files, then its directory */
        static const char *const files[] = {FY_STORE_DATA_NAME, FY_STORE_INDEX_NAME};
        for (int f = 0; f < 2; f++) {
            char path[PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/%s", dirs[i], files[f]);
            unlink(path);
        }
        rmdir(dirs[i]);
    }
    return rc;
}

static void probe_memcpy(struct fy_probe_result *r)
{
    size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        return;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes); /* every page touched before the timing */
    double t0 = now_s();
    for (int i = 0; i < 4; i++)
        memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
    r->memcpy_Bps = 4.0 * (double)bytes / (now_s() - t0);
    free(a);
    free(b);
}

/* AdamW over 16M parameters (bf16 gradients, as in training) with 1, 2, 4, ... threads up to the
 * cores online; the fastest is the planner's rate. */
static int probe_adamw(struct fy_probe_result *r)
{
    size_t n = (size_t)16 << 20;
    float *p = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
    uint16_t *g = malloc(n * 2);
    int rc = p && m && v && g ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        p[i] = 0.01f * (float)(i % 97);
        g[i] = 0x3c00; /* bf16 0.0078 */
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    struct fy_adamw_hparams hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                  .weight_decay = 0.1f};
    struct fy_adamw_tensor x = {.master = p, .m = m, .v = v, .grad = g,
                                .grad_dtype = FY_DTYPE_BF16, .n = n};
    unsigned counts[FY_PROBE_MAX_THREADS], nc = 0; /* 1, 2, 4, ... and all the cores */
    for (unsigned k = 1; k < (unsigned)cores && nc < FY_PROBE_MAX_THREADS - 1; k *= 2)
        counts[nc++] = k;
    counts[nc++] = cores > 0 ? (unsigned)cores : 1;
    r->n_threads = 0;
    for (unsigned i = 0; rc == 0 && i < nc; i++) {
        unsigned k = counts[i];
        struct fy_threads *pool = NULL;
        rc = fy_threads_new(&pool, NULL, k);
        double best = 0;
        for (int rep = 0; rc == 0 && rep < 3; rep++) {
            double t0 = now_s();
            rc = fy_adamw_update(pool, &hp, (uint64_t)rep + 1, &x, FY_ADAMW_AUTO);
            double rate = (double)n / (now_s() - t0);
            best = rate > best ? rate : best;
        }
        fy_threads_destroy(&pool);
        r->threads[r->n_threads] = k;
        r->opt_params[r->n_threads++] = best;
        if (best > r->rates.opt_params)
            r->rates.opt_params = best;
    }
    free(p);
    free(m);
    free(v);
    free(g);
    return rc;
}

int fy_probe_run(const struct fy_probe_opts *o, struct fy_probe_result *r)
{
    memset(r, 0, sizeof *r);
    double t0 = now_s();
    if (strcmp(o->backend, "cuda") != 0)
        fy_info("probe: no GPU here (the %s backend): its block and copies are timed in their "
                "stead, and the GPU parts (PCIe, GEMM rate) are skipped", o->backend);
    FY_TRY(probe_backend(o, r));
    FY_TRY(probe_ssd(o, r));
    probe_memcpy(r);
    FY_TRY(probe_adamw(r));
    r->seconds = now_s() - t0;
    return 0;
}

int fy_probe_save(const char *path, const struct fy_probe_opts *o, const struct fy_probe_result *r)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    FY_SYS(f == NULL ? -1 : 0, "probe: cannot create %s", tmp);
    fprintf(f, "{\n  \"gpu_flops\": %.6g,\n  \"h2d\": %.6g,\n  \"d2h\": %.6g,\n"
               "  \"ssd_read\": %.6g,\n  \"ssd_write\": %.6g,\n  \"opt_params\": %.6g,\n",
            r->rates.gpu_flops, r->rates.h2d, r->rates.d2h, r->rates.ssd_read,
            r->rates.ssd_write, r->rates.opt_params);
    fprintf(f, "  \"backend\": \"%s\",\n  \"device\": \"%s\",\n  \"copies_both_ways\": %.6g,\n"
               "  \"memcpy\": %.6g,\n  \"ssd_paths\": %u,\n  \"adamw_by_threads\": {",
            o->backend, r->device, r->duplex_Bps, r->memcpy_Bps, r->ssd_paths);
    for (unsigned i = 0; i < r->n_threads; i++)
        fprintf(f, "%s\"%u\": %.6g", i ? ", " : "", r->threads[i], r->opt_params[i]);
    fprintf(f, "},\n  \"probe_seconds\": %.3f\n}\n", r->seconds);
    return fy_file_replace(f, tmp, path);
}
