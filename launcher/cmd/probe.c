/* Measuring the machine for the planner (launcher/cmd/probe.h): each part in this process, through
 * the same code the workers run (the backend, the io engine and store, AdamW). */
#include "launcher/cmd/probe.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/base/fsutil.h"
#include "gpu_worker/backend.h"
#include "io_worker/ring.h"
#include "io_worker/store.h"
#include "launcher/run/stopsig.h"
#include "opt_worker/adamw.h"
#include "opt_worker/quant8.h"
#include "opt_worker/threads.h"

static double now_s(void) { return (double)fy_monotonic_ns() * 1e-9; }

/* One block of a model sized for the backend: 1.3B's on CUDA, a small one on the CPU (its rate is
 * the CPU backend's, whatever the size). Rate: the block's model FLOPs (as the planner counts
 * them) over a forward, its recomputation and its backward. */
static int probe_backend(const struct fy_probe_opts *o, struct fy_probe_result *r)
{
    int cuda = strcmp(o->backend, "cuda") == 0;
    struct fy_model_config c = {.n_layer = 1,
                                .n_head = cuda ? 16 : 4,
                                .n_embd = cuda ? 2048 : 256,
                                .vocab = 50304,
                                .ctx = cuda ? 1024 : 128};
    int B = cuda ? 8 : 4, T = (int)c.ctx;
    size_t host_bytes = cuda ? (size_t)256 << 20 : (size_t)32 << 20;
    struct fy_backend *b = NULL;
    void *host = NULL;
    struct fy_block_profile p;
    int rc;
    FY_TRY_OUT(rc, fy_backend_open(&b, o->backend, o->gpu_mem));
    FY_TRY_OUT(rc, posix_memalign(&host, 4096, host_bytes) != 0 ? -ENOMEM : 0);
    memset(host, 1, host_bytes);
    FY_TRY_OUT(rc, fy_backend_register_host(b, host, host_bytes));
    FY_TRY_OUT(rc, fy_backend_model_prepare(b, &c, B, T));
    FY_TRY_OUT(rc, fy_backend_model_profile(b, host, host_bytes, &p));
    double tokens = (double)B * T;
    double flops = tokens * (6.0 * (double)fy_model_unit_params(&c, 1) + 6.0 * T * c.n_embd);
    r->rates.gpu_flops = flops / (2 * p.fwd_s + p.bwd_s);
    r->gemm_flops = p.flops_per_s;
    r->rates.h2d = p.h2d_Bps;
    r->rates.d2h = p.d2h_Bps;
    r->duplex_Bps = p.duplex_Bps;
    snprintf(r->device, sizeof r->device, "%s", fy_backend_device(b));
out:
    fy_backend_destroy(&b);
    free(host);
    return rc;
}

/* A scratch store over paths[0..n), as the io worker builds it: io_bytes written, synced, read
 * back (O_DIRECT: from the device); the files are removed by the caller. */
static int probe_store(const char *const *paths, unsigned n, uint64_t total, double *read_Bps,
                       double *write_Bps)
{
    size_t chunk = (size_t)64 << 20;
    total = (total + chunk - 1) / chunk * chunk;
    struct fy_store *s = NULL;
    struct fy_ring *ring = NULL;
    void *buf = NULL;
    struct fy_store_opts so = {.paths = paths, .npaths = n, .create = 1};
    int rc;
    FY_TRY_OUT(rc, fy_store_open(&s, &so));
    FY_TRY_OUT(rc, fy_ring_new(&ring, NULL));
    FY_TRY_OUT(rc, posix_memalign(&buf, 4096, chunk) != 0 ? -ENOMEM : 0);
    memset(buf, 0x5a, chunk);
    FY_TRY_OUT(rc, fy_ring_register_memory(ring, buf, chunk));
    FY_TRY_OUT(rc, fy_ring_register_files(ring, fy_store_fds(s), fy_store_file_names(s), n));
    FY_TRY_OUT(rc, fy_store_add_extent(s, 1, total));
    double t0 = now_s();
    for (uint64_t at = 0; at < total; at += chunk) {
        FY_TRY_OUT(rc, fy_stopsig_check()); /* the caller removes the files */
        FY_TRY_OUT(rc, fy_store_write(s, ring, 1, at, buf, chunk, 120000));
    }
    FY_TRY_OUT(rc, fy_store_sync(s));
    double t1 = now_s();
    for (uint64_t at = 0; at < total; at += chunk) {
        FY_TRY_OUT(rc, fy_stopsig_check());
        FY_TRY_OUT(rc, fy_store_read(s, ring, 1, at, buf, chunk, 120000));
    }
    double t2 = now_s();
    *write_Bps = (double)total / (t1 - t0);
    *read_Bps = (double)total / (t2 - t1);
out:
    fy_ring_destroy(&ring);
    fy_store_destroy(&s);
    free(buf);
    return rc;
}

static void remove_scratch_store(const char *dir)
{
    static const char *const files[] = {FY_STORE_DATA_NAME, FY_STORE_INDEX_NAME};
    for (int f = 0; f < 2; f++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        unlink(path);
    }
}

/* Each path alone (when there are several: a slow one shows), then the store over all of them
 * together, which is what training sees and what the planner takes. */
static int probe_ssd(const struct fy_probe_opts *o, struct fy_probe_result *r)
{
    char list[4096], dirs[FY_PROBE_MAX_PATHS][PATH_MAX];
    const char *paths[FY_PROBE_MAX_PATHS];
    unsigned n = 0;
    snprintf(list, sizeof list, "%s", o->ssd);
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        FY_USAGE(n < FY_PROBE_MAX_PATHS, "probe: more than %d SSD paths in --ssd %s",
                 FY_PROBE_MAX_PATHS, o->ssd);
        snprintf(r->ssd_path[n], sizeof r->ssd_path[n], "%s", p);
        snprintf(dirs[n], sizeof dirs[n], "%s/.fuyou-probe-%d", p, (int)getpid());
        FY_SYS(mkdir(dirs[n], 0700), "probe: cannot create %s", dirs[n]);
        paths[n] = dirs[n];
        n++;
    }
    r->ssd_paths = n;
    uint64_t total = o->io_bytes ? o->io_bytes : (uint64_t)1 << 30;
    int rc = 0;
    for (unsigned i = 0; rc == 0 && n > 1 && i < n; i++) {
        rc = probe_store(&paths[i], 1, total, &r->ssd_path_read[i], &r->ssd_path_write[i]);
        remove_scratch_store(dirs[i]);
    }
    if (rc == 0)
        rc = probe_store(paths, n, total * n, &r->rates.ssd_read, &r->rates.ssd_write);
    if (n == 1) {
        r->ssd_path_read[0] = r->rates.ssd_read;
        r->ssd_path_write[0] = r->rates.ssd_write;
    }
    for (unsigned i = 0; i < n; i++) {
        remove_scratch_store(dirs[i]);
        rmdir(dirs[i]);
    }
    return rc;
}

struct memcpy_job {
    char *a, *b;
    size_t bytes;
};

static int copy_share(void *arg, unsigned index, unsigned count)
{
    struct memcpy_job *j = arg;
    size_t begin, end;
    fy_threads_split(j->bytes, 4096, index, count, &begin, &end);
    for (int i = 0; i < 4; i++)
        memcpy((i % 2 ? j->a : j->b) + begin, (i % 2 ? j->b : j->a) + begin, end - begin);
    return 0;
}

/* Host memory bandwidth: a 256 MiB copy back and forth, by one thread and by one thread per
 * core (what the optimizer's threads share). */
static void probe_memcpy(struct fy_probe_result *r)
{
    struct memcpy_job j = {.bytes = (size_t)256 << 20};
    j.a = malloc(j.bytes);
    j.b = malloc(j.bytes);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    struct fy_threads *pool = NULL;
    if (j.a != NULL && j.b != NULL &&
        fy_threads_new(&pool, NULL, cores > 1 ? (unsigned)cores : 1) == 0) {
        memset(j.a, 1, j.bytes);
        memset(j.b, 2, j.bytes); /* every page touched before the timing */
        double t0 = now_s();
        copy_share(&j, 0, 1);
        r->memcpy_Bps = 4.0 * (double)j.bytes / (now_s() - t0);
        fy_threads_run(pool, copy_share, &j); /* a warm-up of the threads' pages */
        t0 = now_s();
        fy_threads_run(pool, copy_share, &j);
        r->memcpy_all_Bps = 4.0 * (double)j.bytes / (now_s() - t0);
        r->memcpy_threads = fy_threads_count(pool);
    }
    fy_threads_destroy(&pool);
    free(j.a);
    free(j.b);
}

/* AdamW over 16M parameters (bf16 gradients, as in training) with 1, 2, 4, ... threads up to the
 * cores online, for each moments storage (fp32, bf16, 8-bit) from the zero state; the fastest with
 * fp32 moments is the planner's rate. */
static int probe_adamw(struct fy_probe_result *r)
{
    size_t n = (size_t)16 << 20, nb = fy_quant8_blocks(n);
    float *p = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
    float *ma = calloc(nb, 4), *va = calloc(nb, 4);
    uint16_t *g = malloc(n * 2);
    int rc = p && m && v && g && ma && va ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        p[i] = 0.01f * (float)(i % 97);
        g[i] = 0x3c00; /* bf16 0.0078 */
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    struct fy_adamw_hparams hp = {
        .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    unsigned counts[FY_PROBE_MAX_THREADS], nc = 0; /* 1, 2, 4, ... and all the cores */
    for (unsigned k = 1; k < (unsigned)cores && nc < FY_PROBE_MAX_THREADS - 1; k *= 2)
        counts[nc++] = k;
    counts[nc++] = cores > 0 ? (unsigned)cores : 1;
    r->n_threads = 0;
    for (int mode = FY_ADAMW_MOMENTS_F32; rc == 0 && mode <= FY_ADAMW_MOMENTS_Q8; mode++) {
        /* the zero state of the mode (the fp32 buffers hold it for the narrower ones too) */
        memset(m, 0, n * 4);
        memset(v, 0, n * 4);
        if (mode == FY_ADAMW_MOMENTS_Q8) {
            memset(m, fy_quant8_zero_code(1), n);
            memset(v, fy_quant8_zero_code(0), n);
        }
        struct fy_adamw_tensor x = {.master = p,
                                    .m = m,
                                    .v = v,
                                    .m_absmax = ma,
                                    .v_absmax = va,
                                    .moments = mode,
                                    .grad = g,
                                    .grad_dtype = FY_DTYPE_BF16,
                                    .n = n};
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
            r->opt_params_by_moments[mode][i] = best;
            if (best > r->opt_params_best[mode])
                r->opt_params_best[mode] = best;
            if (mode == FY_ADAMW_MOMENTS_F32) {
                r->threads[r->n_threads] = k;
                r->opt_params[r->n_threads++] = best;
                if (best > r->rates.opt_params)
                    r->rates.opt_params = best;
            }
        }
    }
    free(p);
    free(m);
    free(v);
    free(ma);
    free(va);
    free(g);
    return rc;
}

int fy_probe_run(const struct fy_probe_opts *o, struct fy_probe_result *r)
{
    memset(r, 0, sizeof *r);
    double t0 = now_s();
    if (strcmp(o->backend, "cuda") != 0)
        fy_info("probe: no GPU here (the %s backend): its block and copies are timed in their "
                "stead, and the GPU parts (PCIe, GEMM rate) are skipped",
                o->backend);
    time_t started = time(NULL);
    struct tm utc;
    if (gmtime_r(&started, &utc) == NULL ||
        strftime(r->probed_at, sizeof r->probed_at, "%Y-%m-%dT%H:%M:%SZ", &utc) == 0)
        snprintf(r->probed_at, sizeof r->probed_at, "unknown");
    if (gethostname(r->host, sizeof r->host) != 0)
        snprintf(r->host, sizeof r->host, "unknown");
    r->host[sizeof r->host - 1] = 0;
    int which;
    if (strcmp(o->backend, "cuda") ==
        0) /* before the backend takes its own: the GPU as train finds it */
        FY_TRY(fy_backend_devices_free(1, &r->gpu_free, &r->gpu_total, &which));
    /* a stop (fy_stopsig) between the parts, and within the SSD's, which leaves scratch files */
    FY_TRY(probe_backend(o, r));
    FY_TRY(fy_stopsig_check());
    FY_TRY(probe_ssd(o, r));
    FY_TRY(fy_stopsig_check());
    probe_memcpy(r);
    FY_TRY(fy_stopsig_check());
    FY_TRY(probe_adamw(r));
    FY_TRY(fy_stopsig_check());
    r->seconds = now_s() - t0;
    return 0;
}

int fy_probe_save(const char *path, const struct fy_probe_opts *o, const struct fy_probe_result *r)
{
    cJSON *root = cJSON_CreateObject(), *paths = NULL, *threads = NULL;
    int ok = root != NULL;
    /* the six rates plan and train read (launcher/plan/forecast.h), then the details */
    const struct {
        const char *key;
        double value;
    } rates[] = {{"gpu_flops", r->rates.gpu_flops},
                 {"h2d", r->rates.h2d},
                 {"d2h", r->rates.d2h},
                 {"ssd_read", r->rates.ssd_read},
                 {"ssd_write", r->rates.ssd_write},
                 {"opt_params", r->rates.opt_params}};
    for (size_t i = 0; ok && i < sizeof rates / sizeof rates[0]; i++)
        ok = cJSON_AddNumberToObject(root, rates[i].key, rates[i].value) != NULL;
    ok = ok && cJSON_AddStringToObject(root, "backend", o->backend) != NULL &&
         cJSON_AddStringToObject(root, "device", r->device) != NULL &&
         cJSON_AddStringToObject(root, "host", r->host) != NULL &&
         cJSON_AddStringToObject(root, "probed_at", r->probed_at) != NULL &&
         (r->gpu_total == 0 ||
          (cJSON_AddNumberToObject(root, "gpu_free", (double)r->gpu_free) != NULL &&
           cJSON_AddNumberToObject(root, "gpu_total", (double)r->gpu_total) != NULL)) &&
         cJSON_AddNumberToObject(root, "copies_both_ways", r->duplex_Bps) != NULL &&
         cJSON_AddNumberToObject(root, "gemm_flops", r->gemm_flops) != NULL &&
         cJSON_AddNumberToObject(root, "memcpy", r->memcpy_Bps) != NULL &&
         cJSON_AddNumberToObject(root, "memcpy_all_threads", r->memcpy_all_Bps) != NULL &&
         cJSON_AddNumberToObject(root, "memcpy_threads", r->memcpy_threads) != NULL &&
         (paths = cJSON_AddArrayToObject(root, "ssd_by_path")) != NULL;
    for (unsigned i = 0; ok && i < r->ssd_paths; i++) {
        cJSON *one = cJSON_CreateObject();
        ok = one != NULL && cJSON_AddItemToArray(paths, one) &&
             cJSON_AddStringToObject(one, "path", r->ssd_path[i]) != NULL &&
             cJSON_AddNumberToObject(one, "read", r->ssd_path_read[i]) != NULL &&
             cJSON_AddNumberToObject(one, "write", r->ssd_path_write[i]) != NULL;
    }
    /* AdamW by thread count: fp32 moments under the names the planner has always read, then bf16
     * and 8-bit moments */
    static const char *const by_threads[3] = {"adamw_by_threads", "adamw_bf16_by_threads",
                                              "adamw_int8_by_threads"};
    static const char *const best[3] = {NULL, "opt_params_bf16", "opt_params_int8"};
    for (int mode = 0; ok && mode < 3; mode++) {
        ok = (threads = cJSON_AddObjectToObject(root, by_threads[mode])) != NULL;
        for (unsigned i = 0; ok && i < r->n_threads; i++) {
            char key[16];
            snprintf(key, sizeof key, "%u", r->threads[i]);
            ok = cJSON_AddNumberToObject(threads, key, r->opt_params_by_moments[mode][i]) != NULL;
        }
        if (ok && best[mode] != NULL)
            ok = cJSON_AddNumberToObject(root, best[mode], r->opt_params_best[mode]) != NULL;
    }
    ok = ok && cJSON_AddNumberToObject(root, "probe_seconds", r->seconds) != NULL;
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    FY_REQUIRE(text != NULL, -ENOMEM, "probe: out of memory writing the machine profile");
    int rc = fy_file_write_text(path, text);
    free(text);
    return rc;
}
