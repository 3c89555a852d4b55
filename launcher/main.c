/* fuyou-launch: the run's owner. Prepares the run directory, the memory plan and the shared pool,
 * places the workers on cores, starts and supervises them, and drives the work. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include "common/chan.h"
#include "common/check.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/pool.h"
#include "common/topo.h"
#include "launcher/selftest.h"
#include "launcher/supervise.h"

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_USAGE = 2, EXIT_WORKER = 3, EXIT_INTERRUPTED = 130 };

static const char *const worker_names[] = {"gpu", "io", "opt"};

struct options {
    const char *run_dir;
    const char *ssd;
    const char *affinity;
    const char *backend;
    const char *adamw_impl;
    uint64_t params, steps, seed, cpu_mem, gpu_mem, queue_depth, block_size, stripe_unit;
    int grad_dtype;
    int overwrite;
    double lr, weight_decay;
    int ready_timeout_s, timeout_s;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fuyou-launch COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  selftest   run the data path (SSD -> pool -> gpu gradients -> AdamW -> SSD) through\n"
            "             the three worker processes for a few steps, and time each stage\n"
            "  help       this text\n"
            "\n"
            "options:\n"
            "  --run-dir DIR        run directory (created if missing; holds run.conf, sockets)\n"
            "  --ssd DIR[,DIR...]   SSD store directories, striped (each must support O_DIRECT)\n"
            "  --overwrite          replace an existing store in the --ssd directories\n"
            "  --cpu-mem SIZE       cap on the shared pool (e.g. 64G); refused if the plan needs more\n"
            "  --gpu-mem SIZE       GPU arena size (default 256M for the self-test)\n"
            "  --backend NAME       auto (default), cuda or cpu\n"
            "  --affinity SPEC      e.g. gpu=0,io=1,opt=2-15 (default: from hwloc)\n"
            "  --params N           parameters in the self-test tensor (default 1M)\n"
            "  --steps N            optimizer steps (default 3)\n"
            "  --seed N             seed of the synthetic data (default 1)\n"
            "  --grad-dtype T       bf16 (default) or f32\n"
            "  --lr X, --weight-decay X, --adamw-impl auto|scalar|avx2|avx512\n"
            "  --queue-depth N      io_uring queue depth (default 32)\n"
            "  --block-size SIZE    I/O block size (default 1M)\n"
            "  --stripe-unit SIZE   striping unit over SSD paths (default 1M)\n"
            "  --ready-timeout S    seconds to wait for workers to start (default 60)\n"
            "  --timeout S          seconds to wait for any one request (default 300)\n");
}

static int parse_size_opt(const char *name, const char *text, uint64_t *out)
{
    if (fy_parse_size(text, out) < 0) {
        fprintf(stderr, "fuyou-launch: %s '%s' is not a size (examples: 4096, 64K, 24G)\n", name,
                text);
        return -EINVAL;
    }
    return 0;
}

static int parse_options(int argc, char **argv, struct options *o)
{
    enum { O_RUN = 256, O_SSD, O_OVERWRITE, O_CPU_MEM, O_GPU_MEM, O_BACKEND, O_AFFINITY, O_PARAMS,
           O_STEPS, O_SEED, O_GRAD_DTYPE, O_LR, O_WD, O_IMPL, O_QD, O_BLOCK, O_STRIPE, O_READY,
           O_TIMEOUT };
    static const struct option longopts[] = {
        {"run-dir", required_argument, 0, O_RUN},       {"ssd", required_argument, 0, O_SSD},
        {"overwrite", no_argument, 0, O_OVERWRITE},     {"cpu-mem", required_argument, 0, O_CPU_MEM},
        {"gpu-mem", required_argument, 0, O_GPU_MEM},   {"backend", required_argument, 0, O_BACKEND},
        {"affinity", required_argument, 0, O_AFFINITY}, {"params", required_argument, 0, O_PARAMS},
        {"steps", required_argument, 0, O_STEPS},       {"seed", required_argument, 0, O_SEED},
        {"grad-dtype", required_argument, 0, O_GRAD_DTYPE}, {"lr", required_argument, 0, O_LR},
        {"weight-decay", required_argument, 0, O_WD},   {"adamw-impl", required_argument, 0, O_IMPL},
        {"queue-depth", required_argument, 0, O_QD},    {"block-size", required_argument, 0, O_BLOCK},
        {"stripe-unit", required_argument, 0, O_STRIPE},
        {"ready-timeout", required_argument, 0, O_READY}, {"timeout", required_argument, 0, O_TIMEOUT},
        {"help", no_argument, 0, 'h'},                  {0, 0, 0, 0},
    };
    *o = (struct options){.backend = "auto", .adamw_impl = "auto", .params = 1 << 20, .steps = 3,
                          .seed = 1, .grad_dtype = FY_DTYPE_BF16, .lr = 1e-3, .weight_decay = 0.1,
                          .queue_depth = 32, .block_size = 1 << 20, .stripe_unit = 1 << 20,
                          .ready_timeout_s = 60, .timeout_s = 300};
    int c, rc = 0;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_RUN: o->run_dir = optarg; break;
        case O_SSD: o->ssd = optarg; break;
        case O_OVERWRITE: o->overwrite = 1; break;
        case O_CPU_MEM: rc = parse_size_opt("--cpu-mem", optarg, &o->cpu_mem); break;
        case O_GPU_MEM: rc = parse_size_opt("--gpu-mem", optarg, &o->gpu_mem); break;
        case O_BACKEND: o->backend = optarg; break;
        case O_AFFINITY: o->affinity = optarg; break;
        case O_PARAMS: rc = parse_size_opt("--params", optarg, &o->params); break;
        case O_STEPS: rc = parse_size_opt("--steps", optarg, &o->steps); break;
        case O_SEED: rc = parse_size_opt("--seed", optarg, &o->seed); break;
        case O_GRAD_DTYPE:
            if (strcmp(optarg, "bf16") == 0)
                o->grad_dtype = FY_DTYPE_BF16;
            else if (strcmp(optarg, "f32") == 0)
                o->grad_dtype = FY_DTYPE_F32;
            else {
                fprintf(stderr, "fuyou-launch: --grad-dtype must be bf16 or f32\n");
                rc = -EINVAL;
            }
            break;
        case O_LR: o->lr = atof(optarg); break;
        case O_WD: o->weight_decay = atof(optarg); break;
        case O_IMPL: o->adamw_impl = optarg; break;
        case O_QD: rc = parse_size_opt("--queue-depth", optarg, &o->queue_depth); break;
        case O_BLOCK: rc = parse_size_opt("--block-size", optarg, &o->block_size); break;
        case O_STRIPE: rc = parse_size_opt("--stripe-unit", optarg, &o->stripe_unit); break;
        case O_READY: o->ready_timeout_s = atoi(optarg); break;
        case O_TIMEOUT: o->timeout_s = atoi(optarg); break;
        case 'h': usage(stdout); exit(EXIT_OK);
        default:
            fprintf(stderr, "fuyou-launch: unknown or incomplete option '%s' (see fuyou-launch help)\n",
                    argv[optind - 1]);
            rc = -EINVAL;
        }
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "fuyou-launch: unexpected argument '%s'\n", argv[optind]);
        rc = -EINVAL;
    }
    if (rc == 0 && (o->run_dir == NULL || o->ssd == NULL)) {
        fprintf(stderr, "fuyou-launch: --run-dir and --ssd are required (see fuyou-launch help)\n");
        rc = -EINVAL;
    }
    if (rc == 0 && (o->params == 0 || o->steps == 0 || o->ready_timeout_s <= 0 || o->timeout_s <= 0)) {
        fprintf(stderr, "fuyou-launch: --params, --steps and timeouts must be positive\n");
        rc = -EINVAL;
    }
    return rc;
}

/* The run directory is ours while we hold its lock; anything left in its ipc/ is stale. */
static int prepare_run_dir(const char *run_dir, int *lock_fd)
{
    if (mkdir(run_dir, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        fy_error("cannot create run directory %s: %s", run_dir, strerror(e));
        return -e;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/launch.lock", run_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    FY_SYS(fd, "cannot open %s", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK) {
            fy_error("run directory %s is in use by another fuyou-launch: stop it or use another "
                     "--run-dir",
                     run_dir);
            return -EBUSY;
        }
        fy_error("cannot lock %s: %s", path, strerror(e));
        return -e;
    }
    *lock_fd = fd;
    snprintf(path, sizeof path, "%s/ipc", run_dir);
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        fy_error("cannot create %s: %s", path, strerror(e));
        return -e;
    }
    DIR *d = opendir(path);
    FY_SYS(d == NULL ? -1 : 0, "cannot open %s", path);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char stale[PATH_MAX + 300];
        snprintf(stale, sizeof stale, "%s/%s", path, e->d_name);
        if (unlink(stale) == 0)
            fy_warn("removed stale socket %s from a run that died", stale);
    }
    closedir(d);
    return 0;
}

static void cleanup_run_dir(const char *run_dir)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/ipc/ctl", run_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/ipc", run_dir);
    if (rmdir(path) != 0 && errno != ENOENT)
        fy_warn("cannot remove %s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/workers.pid", run_dir);
    unlink(path);
}

static int write_run_config(const struct options *o, const struct fy_affinity *aff,
                            const char *pool_name, const char *endpoint)
{
    struct fy_config *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    fy_config_init(c);
    int rc = 0;
    rc = rc ? rc : fy_config_set(c, "pool", pool_name);
    rc = rc ? rc : fy_config_set(c, "endpoint", endpoint);
    rc = rc ? rc : fy_config_set(c, "ssd", o->ssd);
    rc = rc ? rc : fy_config_set(c, "store_create", "1");
    rc = rc ? rc : fy_config_setf(c, "store_overwrite", "%d", o->overwrite);
    rc = rc ? rc : fy_config_setf(c, "stripe_unit", "%llu", (unsigned long long)o->stripe_unit);
    rc = rc ? rc : fy_config_setf(c, "queue_depth", "%llu", (unsigned long long)o->queue_depth);
    rc = rc ? rc : fy_config_setf(c, "block_size", "%llu", (unsigned long long)o->block_size);
    rc = rc ? rc : fy_config_setf(c, "io_timeout_ms", "%d", o->timeout_s * 1000);
    rc = rc ? rc : fy_config_set(c, "backend", o->backend);
    rc = rc ? rc : fy_config_setf(c, "gpu_mem", "%llu", (unsigned long long)o->gpu_mem);
    rc = rc ? rc : fy_config_set(c, "affinity.gpu", aff->gpu);
    rc = rc ? rc : fy_config_set(c, "affinity.io", aff->io);
    rc = rc ? rc : fy_config_set(c, "affinity.opt", aff->opt);
    rc = rc ? rc : fy_config_set(c, "adamw_impl", o->adamw_impl);
    rc = rc ? rc : fy_config_setf(c, "lr", "%.9g", o->lr);
    rc = rc ? rc : fy_config_setf(c, "weight_decay", "%.9g", o->weight_decay);
    rc = rc ? rc : fy_config_set(c, "beta1", "0.9");
    rc = rc ? rc : fy_config_set(c, "beta2", "0.999");
    rc = rc ? rc : fy_config_set(c, "eps", "1e-8");
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run.conf", o->run_dir);
    rc = rc ? rc : fy_config_save(c, path);
    free(c);
    return rc;
}

static int plan_affinity(const struct options *o, struct fy_topo *topo, struct fy_affinity *aff)
{
    char described[2048];
    fy_topo_describe(topo, described, sizeof described);
    fy_info("topology: %s", described);
    FY_TRY(fy_affinity_default(topo, aff));
    if (o->affinity != NULL)
        FY_TRY(fy_affinity_parse(topo, o->affinity, aff));
    fy_info("placement: gpu worker on cpus %s, io worker on %s, opt worker on %s (NUMA node %d)%s",
            aff->gpu, aff->io, aff->opt, aff->numa_node,
            o->affinity ? " [--affinity]" : " [hwloc default]");
    return 0;
}

static int run_selftest(const struct options *o)
{
    struct fy_selftest_layout layout;
    fy_selftest_layout(o->params, o->grad_dtype, &layout);
    struct fy_pool_region_spec regions[3];
    fy_selftest_regions(&layout, regions);
    uint64_t pool_bytes = fy_pool_layout_size(regions, 3);
    char need[32], cap[32];
    fy_format_size(pool_bytes, need, sizeof need);
    if (o->cpu_mem != 0 && pool_bytes > o->cpu_mem) {
        fy_format_size(o->cpu_mem, cap, sizeof cap);
        fy_error("plan does not fit: the shared pool needs %s (state %llu + gradient slots %llu + "
                 "weights %llu bytes, 2 MiB aligned) but --cpu-mem is %s: raise --cpu-mem or lower "
                 "--params",
                 need, (unsigned long long)regions[0].bytes, (unsigned long long)regions[1].bytes,
                 (unsigned long long)regions[2].bytes, cap);
        return -ENOMEM;
    }
    fy_info("plan: %llu parameters, %llu steps; pool %s (state %llu, gradient slots %llu, weights "
            "%llu bytes); store on %s",
            (unsigned long long)o->params, (unsigned long long)o->steps, need,
            (unsigned long long)regions[0].bytes, (unsigned long long)regions[1].bytes,
            (unsigned long long)regions[2].bytes, o->ssd);

    int lock_fd = -1, rc;
    struct fy_topo *topo = NULL;
    struct fy_pool *pool = NULL;
    struct fy_chan *chan = NULL;
    struct fy_sup *sup = NULL;
    struct fy_affinity aff;
    char pool_name[FY_POOL_NAME_MAX], endpoint[512], path[PATH_MAX + 32];
    rc = prepare_run_dir(o->run_dir, &lock_fd);
    if (rc == 0)
        rc = fy_pool_name_for_run(o->run_dir, pool_name, sizeof pool_name);
    if (rc == 0)
        rc = fy_topo_load(&topo);
    if (rc == 0)
        rc = plan_affinity(o, topo, &aff);
    if (rc == 0) {
        struct fy_pool_opts po = {.topo = topo, .numa_node = aff.numa_node, .run_dir = o->run_dir};
        rc = fy_pool_create(&pool, pool_name, regions, 3, &po);
    }
    if (rc == 0)
        rc = fy_chan_endpoint(o->run_dir, "ctl", endpoint, sizeof endpoint);
    if (rc == 0)
        rc = write_run_config(o, &aff, pool_name, endpoint);
    if (rc == 0)
        rc = fy_chan_bind(&chan, endpoint, "launch");
    if (rc == 0)
        rc = fy_sup_new(&sup, o->run_dir, chan);
    for (unsigned i = 0; rc == 0 && i < sizeof worker_names / sizeof worker_names[0]; i++)
        rc = fy_sup_spawn(sup, worker_names[i]);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/workers.pid", o->run_dir);
        rc = fy_sup_write_pids(sup, path);
    }
    if (rc == 0)
        rc = fy_sup_wait_ready(sup, o->ready_timeout_s * 1000);
    if (rc == 0) {
        struct fy_selftest_opts so = {.params = o->params, .steps = (unsigned)o->steps,
                                      .seed = o->seed, .grad_dtype = o->grad_dtype,
                                      .timeout_ms = o->timeout_s * 1000};
        rc = fy_selftest_run(sup, pool, &so);
    }
    if (sup != NULL) {
        int stop_rc = fy_sup_stop(sup, 10000);
        if (rc == 0 && stop_rc < 0)
            rc = stop_rc;
        if (fy_sup_failed_worker(sup) != NULL) {
            fy_error("run failed: the %s worker died (its exit is reported above); the other "
                     "workers were stopped",
                     fy_sup_failed_worker(sup));
            rc = -ECHILD;
        } else if (fy_sup_interrupted(sup)) {
            rc = -EINTR;
        }
    }
    fy_sup_destroy(&sup);
    fy_chan_destroy(&chan);
    fy_pool_destroy(&pool);
    fy_topo_destroy(&topo);
    if (lock_fd >= 0) {
        cleanup_run_dir(o->run_dir);
        close(lock_fd);
    }
    return rc;
}

int main(int argc, char **argv)
{
    fy_log_init("launch", FY_LOG_INFO);
    signal(SIGPIPE, SIG_IGN); /* `fuyou-launch ... | head` must still clean up after itself */
    if (fy_sup_block_signals(NULL) != 0) {
        fy_error("cannot block SIGCHLD/SIGINT/SIGTERM for supervision");
        return EXIT_ERROR;
    }
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : EXIT_OK;
    }
    const char *command = argv[1];
    if (strcmp(command, "selftest") != 0) {
        fprintf(stderr, "fuyou-launch: unknown command '%s' (see fuyou-launch help)\n", command);
        return EXIT_USAGE;
    }
    struct options o;
    if (parse_options(argc - 1, argv + 1, &o) < 0)
        return EXIT_USAGE;
    int rc = run_selftest(&o);
    if (rc == -ECHILD)
        return EXIT_WORKER;
    if (rc == -EINTR) {
        fy_warn("stopped by signal");
        return EXIT_INTERRUPTED;
    }
    return rc < 0 ? EXIT_ERROR : EXIT_OK;
}
