/* Integration tests with the real processes: fuyou-launch starting the gpu, io and opt workers.
 * The self-test's bytes on disk are compared with an in-process computation; malformed descriptors,
 * tmpfs SSD paths, over-budget plans, killed workers, SIGTERM and stale leftovers are exercised.
 * (The options and messages against the docs: test_docs.) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/chan.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/pool.h"
#include "common/synth.h"
#include "common/tokfile.h"
#include "gpu_worker/backend.h"
#include "common/topo.h"
#include "io_worker/ring.h"
#include "io_worker/store.h"
#include "launcher/cmd/selftest.h"
#include "opt_worker/adamw.h"
#include "tests/testutil.h"

struct run {
    char *dir;      /* holds run/, ssd0/, ssd1/ and launch.log */
    char run_dir[512];
    char ssd[2][512];
    char log[512];
};

static int setup_run(void **state)
{
    struct run *r = calloc(1, sizeof *r);
    r->dir = fy_test_tmpdir("launch");
    assert_non_null(r->dir);
    snprintf(r->run_dir, sizeof r->run_dir, "%s/run", r->dir);
    for (int i = 0; i < 2; i++) {
        snprintf(r->ssd[i], sizeof r->ssd[i], "%s/ssd%d", r->dir, i);
        assert_int_equal(mkdir(r->ssd[i], 0700), 0);
    }
    snprintf(r->log, sizeof r->log, "%s/launch.log", r->dir);
    *state = r;
    return 0;
}

static int teardown_run(void **state)
{
    struct run *r = *state;
    fy_test_rmdir(r->dir);
    free(r->dir);
    free(r);
    return 0;
}

/* Starts fuyou-launch with the given arguments (NULL-terminated), output to a fresh r->log. */
static pid_t start_launcher(struct run *r, const char *const *args)
{
    unlink(r->log);
    return fy_test_start("fuyou-launch", args, r->log);
}

static int wait_status(pid_t pid, int seconds) { return fy_test_wait(pid, seconds); }

static int run_launcher(struct run *r, const char *const *args, int seconds)
{
    return wait_status(start_launcher(r, args), seconds);
}

static int log_contains(struct run *r, const char *needle)
{
    return fy_test_file_contains(r->log, needle);
}

/* Waits until the log contains needle (the run reached some point). */
static int wait_for_log(struct run *r, const char *needle, int seconds)
{
    for (int i = 0; i < seconds * 20; i++) {
        char *text = fy_test_slurp(r->log, NULL);
        int found = text != NULL && strstr(text, needle) != NULL;
        free(text);
        if (found)
            return 1;
        struct timespec pause = {0, 50 * 1000000};
        nanosleep(&pause, NULL);
    }
    return 0;
}

/* Nothing of the run may remain in /dev/shm or among its sockets. */
static void assert_no_leftovers(struct run *r)
{
    char name[FY_POOL_NAME_MAX], path[600];
    if (access(r->run_dir, F_OK) != 0)
        return; /* refused before the run directory existed: nothing was made */
    assert_int_equal(fy_pool_name_for_run(r->run_dir, name, sizeof name), 0);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/ipc", r->run_dir);
    assert_int_equal(access(path, F_OK), -1);
}

static void read_extent(struct fy_store *s, struct fy_ring *ring, uint32_t tensor, void *buf,
                        size_t bytes)
{
    assert_int_equal(fy_store_read(s, ring, tensor, 0, buf, bytes, 30000), 0);
}

/* The cpus of one worker in the log's placement line, between `from` and `to`. */
static int placement_cpus(const char *line, const char *from, const char *to, int *cpus, int max)
{
    const char *begin = strstr(line, from), *end = begin ? strstr(begin, to) : NULL;
    assert_non_null(end);
    char list[256];
    begin += strlen(from);
    assert_true(end - begin > 0 && end - begin < (long)sizeof list);
    memcpy(list, begin, (size_t)(end - begin));
    list[end - begin] = 0;
    int n = fy_cpulist_parse(list, cpus, max);
    assert_true(n > 0);
    return n;
}

/* --backend cpu --affinity auto: the gpu worker computes, so it runs on every cpu of the opt
 * worker as well (all of this machine's cpus on a 2-core machine, not one of them). */
static void assert_cpu_backend_placement(struct run *r)
{
    assert_true(log_contains(r, "[affinity auto: hwloc, the gpu worker (CPU backend) on the opt "
                                "worker's cores too"));
    char *text = fy_test_slurp(r->log, NULL);
    assert_non_null(text);
    const char *line = strstr(text, "placement: ");
    assert_non_null(line);
    int gpu[1024], opt[1024];
    int ngpu = placement_cpus(line, "gpu worker on cpus ", ", io worker on ", gpu, 1024);
    int nopt = placement_cpus(line, ", opt worker on ", " (NUMA node", opt, 1024);
    for (int i = 0; i < nopt; i++) {
        int found = 0;
        for (int j = 0; j < ngpu && !found; j++)
            found = gpu[j] == opt[i];
        if (!found)
            fprintf(stderr, "cpu %d of the opt worker is not the gpu worker's: %.200s\n", opt[i],
                    line);
        assert_true(found);
    }
    free(text);
}

/* Runs the self-test and compares the SSD store, byte for byte, with the same steps computed here
 * by the scalar AdamW kernel (itself checked against float64 in test_adamw). */
static void check_roundtrip(struct run *r, unsigned npaths, int grad_dtype, uint64_t params,
                            unsigned steps, uint64_t seed)
{
    char ssd[1100], params_s[32], steps_s[32], seed_s[32];
    snprintf(ssd, sizeof ssd, npaths == 2 ? "%s,%s" : "%s", r->ssd[0], r->ssd[1]);
    snprintf(params_s, sizeof params_s, "%llu", (unsigned long long)params);
    snprintf(steps_s, sizeof steps_s, "%u", steps);
    snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)seed);
    const char *args[] = {"selftest", "--run-dir", r->run_dir, "--ssd", ssd, "--params", params_s,
                          "--steps", steps_s, "--seed", seed_s, "--grad-dtype",
                          grad_dtype == FY_DTYPE_BF16 ? "bf16" : "f32", "--backend", "cpu",
                          "--lr", "0.001", "--weight-decay", "0.1", "--stripe-unit", "64K",
                          "--affinity", "auto", NULL};
    int status = run_launcher(r, args, 120);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(log_contains(r, "selftest passed"));
    assert_true(log_contains(r, "[affinity auto: hwloc"));
    assert_cpu_backend_placement(r);
    assert_no_leftovers(r);

    struct fy_selftest_layout l;
    fy_selftest_layout(params, grad_dtype, &l);
    float *master = malloc(params * 4), *m = malloc(params * 4), *v = malloc(params * 4);
    uint16_t *weights = malloc(params * 2);
    void *grad = malloc(params * 4);
    fy_selftest_init_state(seed, params, master, m, v);
    struct fy_adamw_hparams hp = {0.001f, 0.9f, 0.999f, 1e-8f, 0.1f};
    for (unsigned t = 1; t <= steps; t++) {
        for (uint64_t i = 0; i < params; i++) {
            float g = fy_synth_value(seed, t, FY_SELFTEST_TENSOR_STATE, i);
            if (grad_dtype == FY_DTYPE_BF16)
                ((uint16_t *)grad)[i] = fy_f32_to_bf16(g);
            else
                ((float *)grad)[i] = g;
        }
        struct fy_adamw_tensor x = {.master = master, .m = m, .v = v, .grad = grad,
                                    .grad_dtype = grad_dtype, .weight_bf16 = weights, .n = params};
        assert_int_equal(fy_adamw_update_range(&hp, t, &x, 0, params, FY_ADAMW_SCALAR), 0);
    }

    const char *paths[2] = {r->ssd[0], r->ssd[1]};
    struct fy_store_opts so = {.paths = paths, .npaths = npaths, .stripe_unit = 64 << 10};
    struct fy_store *store = NULL;
    assert_int_equal(fy_store_open(&store, &so), 0);
    struct fy_ring *ring = NULL;
    struct fy_ring_opts ro = {.queue_depth = 8, .block_size = 1 << 20};
    assert_int_equal(fy_ring_new(&ring, &ro), 0);
    assert_int_equal(fy_ring_register_files(ring, fy_store_fds(store), fy_store_file_names(store),
                                            fy_store_file_count(store)),
                     0);
    uint8_t *disk_state = aligned_alloc(4096, l.state_bytes);
    uint8_t *disk_weights = aligned_alloc(4096, l.weights_bytes);
    read_extent(store, ring, FY_SELFTEST_TENSOR_STATE, disk_state, l.state_bytes);
    read_extent(store, ring, FY_SELFTEST_TENSOR_WEIGHTS, disk_weights, l.weights_bytes);
    assert_memory_equal(disk_state, master, params * 4);
    assert_memory_equal(disk_state + l.m_offset, m, params * 4);
    assert_memory_equal(disk_state + l.v_offset, v, params * 4);
    assert_memory_equal(disk_weights, weights, params * 2);
    /* The state moved: a round trip that silently did nothing would leave the initial values. */
    assert_true(master[0] != FY_SELFTEST_INIT_SCALE * fy_synth_value(seed, 0, 1, 0));
    fy_ring_destroy(&ring);
    fy_store_close(&store);
    free(disk_state);
    free(disk_weights);
    free(master);
    free(m);
    free(v);
    free(weights);
    free(grad);
}

static void test_roundtrip_two_paths_bf16(void **state)
{
    check_roundtrip(*state, 2, FY_DTYPE_BF16, 1000003, 3, 7);
}

static void test_roundtrip_one_path_f32(void **state)
{
    check_roundtrip(*state, 1, FY_DTYPE_F32, 4099, 2, 11);
}

static void test_tmpfs_ssd_refused(void **state)
{
    struct run *r = *state;
    char shm[128];
    snprintf(shm, sizeof shm, "/dev/shm/fuyou-test-ssd-%d", (int)getpid());
    if (mkdir(shm, 0700) != 0) {
        print_message("skipped: cannot create %s\n", shm);
        skip();
    }
    const char *args[] = {"selftest", "--run-dir", r->run_dir, "--ssd", shm, "--backend", "cpu",
                          "--params", "4096", NULL};
    int status = run_launcher(r, args, 60);
    rmdir(shm);
    assert_true(WIFEXITED(status));
    assert_int_not_equal(WEXITSTATUS(status), 0);
    assert_true(log_contains(r, "O_DIRECT"));
    assert_true(log_contains(r, shm));
    assert_no_leftovers(r);

    /* a run directory there (its store in it): refused, and the directory init made is gone */
    const char *init[] = {"init", "--run-dir", shm, "--layers", "2", "--embd", "32", "--ctx", "16",
                          NULL};
    status = run_launcher(r, init, 60);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3); /* the io worker refuses to start */
    assert_true(log_contains(r, "O_DIRECT"));
    assert_int_not_equal(access(shm, F_OK), 0);
}

static void test_over_budget_refused(void **state)
{
    struct run *r = *state;
    const char *args[] = {"selftest", "--run-dir", r->run_dir, "--ssd", r->ssd[0], "--params",
                          "100M", "--cpu-mem", "64M", NULL};
    int status = run_launcher(r, args, 30);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 2); /* a usage error */
    assert_true(log_contains(r, "plan does not fit"));
    assert_true(log_contains(r, "--cpu-mem is 64.0 MiB"));
    assert_no_leftovers(r);
}

static pid_t pid_of(struct run *r, const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/workers.pid", r->run_dir);
    char *text = fy_test_slurp(path, NULL);
    if (text == NULL)
        return -1;
    pid_t pid = -1;
    char key[32];
    snprintf(key, sizeof key, "%s ", name);
    for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (strncmp(line, key, strlen(key)) == 0)
            pid = atoi(line + strlen(key));
    free(text);
    return pid;
}

/* Starts a long self-test and waits until it is stepping. */
static pid_t start_long_run(struct run *r)
{
    const char *args[] = {"selftest", "--run-dir", r->run_dir, "--ssd", r->ssd[0], "--backend",
                          "cpu", "--params", "65536", "--steps", "100000000", NULL};
    pid_t launcher = start_launcher(r, args);
    assert_true(wait_for_log(r, "step 2/", 60));
    return launcher;
}

static void kill_worker(struct run *r, const char *name)
{
    pid_t launcher = start_long_run(r);
    pid_t victim = pid_of(r, name);
    assert_true(victim > 0);
    assert_int_equal(kill(victim, SIGKILL), 0);
    int status = wait_status(launcher, 60);
    assert_true(status != -1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);
    char expect[128];
    snprintf(expect, sizeof expect, "%s worker (pid %d) was killed by signal 9", name, (int)victim);
    assert_true(log_contains(r, expect));
    snprintf(expect, sizeof expect, "run failed: the %s worker died", name);
    assert_true(log_contains(r, expect));
    assert_no_leftovers(r);
    /* the other workers were stopped, not left running */
    const char *all[] = {"gpu", "io", "opt"};
    for (int i = 0; i < 3; i++)
        if (strcmp(all[i], name) != 0) {
            pid_t other = pid_of(r, all[i]);
            assert_true(other <= 0 || kill(other, 0) != 0);
        }
}

static void test_kill_gpu_worker(void **state) { kill_worker(*state, "gpu"); }
static void test_kill_io_worker(void **state) { kill_worker(*state, "io"); }
static void test_kill_opt_worker(void **state) { kill_worker(*state, "opt"); }

static void test_sigterm_orderly_stop(void **state)
{
    struct run *r = *state;
    pid_t launcher = start_long_run(r);
    assert_int_equal(kill(launcher, SIGTERM), 0);
    int status = wait_status(launcher, 60);
    assert_true(status != -1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 130);
    assert_true(log_contains(r, "[gpu "));
    assert_true(wait_for_log(r, "stopped by signal", 1));
    char *text = fy_test_slurp(r->log, NULL);
    int acks = 0;
    for (char *p = text; (p = strstr(p, "stop requested: exiting")) != NULL; p++)
        acks++;
    free(text);
    assert_int_equal(acks, 3);
    assert_no_leftovers(r);
}

/* A launcher killed with SIGKILL leaves its pool and sockets; the next start removes them. */
static void test_stale_leftovers_removed(void **state)
{
    struct run *r = *state;
    pid_t launcher = start_long_run(r);
    assert_int_equal(kill(launcher, SIGKILL), 0);
    waitpid(launcher, NULL, 0);
    char name[FY_POOL_NAME_MAX], path[600];
    assert_int_equal(fy_pool_name_for_run(r->run_dir, name, sizeof name), 0);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    assert_int_equal(access(path, F_OK), 0); /* really left behind */
    const char *args[] = {"selftest", "--run-dir", r->run_dir, "--ssd", r->ssd[0], "--backend",
                          "cpu", "--params", "4096", "--steps", "1", "--overwrite", NULL};
    int status = run_launcher(r, args, 60);
    assert_true(log_contains(r, "removed stale shared memory"));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_no_leftovers(r);
}

/* The test plays the launcher: a pool, a run config and a ROUTER, then a real opt worker. */
static void test_malformed_descriptor_rejected(void **state)
{
    struct run *r = *state;
    assert_int_equal(mkdir(r->run_dir, 0700), 0);
    char ipc[600], pool_name[FY_POOL_NAME_MAX], endpoint[700], conf[600];
    snprintf(ipc, sizeof ipc, "%s/ipc", r->run_dir);
    assert_int_equal(mkdir(ipc, 0700), 0);
    assert_int_equal(fy_pool_name_for_run(r->run_dir, pool_name, sizeof pool_name), 0);
    struct fy_pool_region_spec spec = {"data", 1 << 20};
    struct fy_pool *pool = NULL;
    assert_int_equal(fy_pool_create(&pool, pool_name, &spec, 1, NULL), 0);
    assert_int_equal(fy_chan_endpoint(r->run_dir, "ctl", endpoint, sizeof endpoint), 0);
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    fy_config_init(cfg);
    fy_config_set(cfg, "pool", pool_name);
    fy_config_set(cfg, "endpoint", endpoint);
    fy_config_set(cfg, "affinity.opt", "0");
    snprintf(conf, sizeof conf, "%s/run.conf", r->run_dir);
    assert_int_equal(fy_config_save(cfg, conf), 0);
    free(cfg);
    struct fy_chan *chan = NULL;
    assert_int_equal(fy_chan_bind(&chan, endpoint, "test"), 0);
    fy_chan_set_pool_size(chan, fy_pool_size(pool));

    pid_t worker = fork();
    if (worker == 0) {
        int fd = open(r->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 2);
        execl(fy_test_bin("fuyou-opt-worker"), "fuyou-opt-worker", "--run-dir", r->run_dir,
              (char *)NULL);
        _exit(127);
    }
    char peer[FY_CHAN_PEER_MAX];
    struct fy_desc d[FY_DESC_MAX_PARTS];
    assert_int_equal(fy_chan_recv(chan, peer, d, FY_DESC_MAX_PARTS, 30000, "READY", "opt"), 1);
    assert_string_equal(peer, "opt");
    assert_int_equal(d[0].op, FY_OP_READY);

    uint64_t data_off, data_bytes;
    assert_int_equal(fy_pool_region(pool, "data", &data_off, &data_bytes), 0);
    struct fy_desc good = {.op = FY_OP_PING, .kind = FY_KIND_CONTROL, .seq = 1};
    uint8_t wire[FY_DESC_WIRE_BYTES];

    /* bad magic */
    fy_desc_encode(&good, wire);
    wire[0] ^= 0xff;
    assert_int_equal(fy_chan_send_raw(chan, "opt", wire, sizeof wire), 0);
    assert_int_equal(fy_chan_recv(chan, peer, d, FY_DESC_MAX_PARTS, 30000, "reply", "opt"), 1);
    assert_int_equal(d[0].op, FY_OP_DONE);
    assert_int_equal(d[0].status, -EBADMSG);
    assert_int_equal(d[0].seq, 1);

    /* region outside the pool */
    struct fy_desc out = {.op = FY_OP_OPT_ADAMW, .kind = FY_KIND_GRAD, .dtype = FY_DTYPE_F32,
                          .offset = fy_pool_size(pool) - 64, .bytes = 4096, .seq = 2};
    assert_int_equal(fy_chan_send(chan, "opt", &out, 1), 0);
    assert_int_equal(fy_chan_recv(chan, peer, d, FY_DESC_MAX_PARTS, 30000, "reply", "opt"), 1);
    assert_int_equal(d[0].status, -ERANGE);
    assert_int_equal(d[0].seq, 2);

    /* unknown op: encode a valid descriptor, then overwrite the op slot */
    fy_desc_encode(&good, wire);
    wire[8] = 0xee;
    wire[48] = 3; /* seq */
    assert_int_equal(fy_chan_send_raw(chan, "opt", wire, sizeof wire), 0);
    assert_int_equal(fy_chan_recv(chan, peer, d, FY_DESC_MAX_PARTS, 30000, "reply", "opt"), 1);
    assert_int_equal(d[0].status, -EPROTO);
    assert_int_equal(d[0].seq, 3);

    /* well-formed but incomplete AdamW request: refused by the worker, not trusted */
    struct fy_desc lone = {.op = FY_OP_OPT_ADAMW, .kind = FY_KIND_GRAD, .dtype = FY_DTYPE_F32,
                           .offset = data_off, .bytes = 4096, .seq = 4, .step = 1};
    assert_int_equal(fy_chan_send(chan, "opt", &lone, 1), 0);
    assert_int_equal(fy_chan_recv(chan, peer, d, FY_DESC_MAX_PARTS, 30000, "reply", "opt"), 1);
    assert_int_equal(d[0].status, -EPROTO);

    /* the worker is still serving */
    good.seq = 5;
    assert_int_equal(fy_chan_send(chan, "opt", &good, 1), 0);
    assert_int_equal(fy_chan_recv(chan, peer, d, FY_DESC_MAX_PARTS, 30000, "reply", "opt"), 1);
    assert_int_equal(d[0].status, 0);
    assert_int_equal(d[0].seq, 5);

    struct fy_desc stop = {.op = FY_OP_STOP, .kind = FY_KIND_CONTROL, .seq = 6};
    assert_int_equal(fy_chan_send(chan, "opt", &stop, 1), 0);
    assert_int_equal(fy_chan_recv(chan, peer, d, FY_DESC_MAX_PARTS, 30000, "stop ack", "opt"), 1);
    assert_int_equal(d[0].seq, 6);
    int status = wait_status(worker, 30);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(log_contains(r, "rejected a malformed message"));
    assert_true(log_contains(r, "bad magic"));
    assert_true(log_contains(r, "outside the"));
    assert_true(log_contains(r, "unknown op"));
    fy_chan_destroy(&chan);
    fy_pool_destroy(&pool);
}

/* Launches fuyou-launch with args; expects exit `status` and `said` in its log, at most one error
 * line (a refusal of the option parser's kind has no time stamp), and nothing of a run left (no
 * pool, no sockets). */
static void expect_exit(struct run *r, const char *const *args, int status, const char *said)
{
    int got = run_launcher(r, args, 120);
    if (!WIFEXITED(got) || WEXITSTATUS(got) != status || !log_contains(r, said) ||
        fy_test_count_matches(r->log, "] error: ") > 1) {
        char *text = fy_test_slurp(r->log, NULL);
        fail_msg("%s: expected exit %d, an error line and \"%s\"; got wait status 0x%x and:\n%s",
                 args[0], status, said, got, text ? text : "(no log)");
    }
    assert_no_leftovers(r);
}

/* Option values out of their range, or beyond what the run's model or the plan's budgets hold, are
 * usage errors (exit 2) wherever a command finds them: a --batch of 0, a batch the pool cannot
 * hold under --cpu-mem (train and plan), a --cpu-mem below the pool's least (train and export),
 * a --seq beyond the model's context, model options that do not go together, a --gpus that does
 * not divide the batch, an --affinity naming no worker, --gpu-mem below the GPU's working buffers
 * (where the CUDA backend is built), a required option missing. A missing data file and a damaged
 * store are errors (exit 1). */
static void test_option_values_are_usage_errors(void **state)
{
    struct run *r = *state;
    const char *init[] = {"init", "--run-dir", r->run_dir, "--layers", "1", "--heads", "2",
                          "--embd", "16", "--vocab", "256", "--ctx", "16", NULL};
    assert_int_equal(run_launcher(r, init, 60), 0);
    char data[600], missing[600], out[600];
    snprintf(data, sizeof data, "%s/data.tok", r->dir);
    snprintf(missing, sizeof missing, "%s/no-such.tok", r->dir);
    snprintf(out, sizeof out, "%s/out.fywt", r->dir);
    static uint32_t tokens[60000];
    uint64_t seed = 7;
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
        tokens[i] = (uint32_t)(fy_test_rand(&seed) % 256);
    assert_int_equal(fy_tokfile_write(data, tokens, sizeof tokens / sizeof tokens[0], 256, 0), 0);
#define TRAIN(...)                                                                                 \
    ((const char *[]){"train", "--run-dir", r->run_dir, "--data", data, "--steps", "1", "--seq",   \
                      "16", "--backend", "cpu", "--eval-batches", "0", __VA_ARGS__, NULL})
    const struct {
        const char *const *args;
        int status;
        const char *said;
    } cases[] = {
        {TRAIN("--batch", "0"), 2, "train: --batch 0 --seq 16: need a batch of 1 to 65536"},
        /* 2048 x 16 tokens: activation slots of 2 MiB, a pool of 26 MiB */
        {TRAIN("--batch", "2048", "--cpu-mem", "20M"), 2, "but --cpu-mem is 20.0 MiB"},
        {TRAIN("--cpu-mem", "1"), 2, "but --cpu-mem is 1 B: raise --cpu-mem"},
        {TRAIN("--seq", "32"), 2, "--seq 32 exceeds the model's context of 16 tokens"},
        {TRAIN("--gpus", "3"), 2, "--batch 8 over --gpus 3"},
        {TRAIN("--affinity", "cpu=0"), 2, "--affinity 'cpu=0': token 'cpu=0': unknown worker"},
        {(const char *[]){"train", "--run-dir", r->run_dir, NULL}, 2, "--data is required"},
        {(const char *[]){"plan", "--run-dir", r->run_dir, "--batch", "0", NULL}, 2,
         "plan: --batch 0"},
        {(const char *[]){"plan", "--run-dir", r->run_dir, "--seq", "16", "--batch", "2048",
                          "--cpu-mem", "20M", "--backend", "cpu", NULL},
         2, "train would refuse it"},
        {(const char *[]){"export", "--run-dir", r->run_dir, "--out", out, "--cpu-mem", "1", NULL},
         2, "the shared pool for export needs"},
        {(const char *[]){"init", "--run-dir", fy_test_path(r->dir, "odd"), "--heads", "3",
                          "--embd", "16", NULL},
         2, "n_head 3 must divide n_embd 16"},
        /* errors, not usage */
        {TRAIN("--data", missing), 1, "cannot open token file"},
    };
#undef TRAIN
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_exit(r, cases[i].args, cases[i].status, cases[i].said);
    assert_int_not_equal(access(fy_test_path(r->dir, "odd"), F_OK), 0);
    if (fy_backend_cuda_built()) { /* the launcher's model of the GPU: no device needed */
        const char *gpu[] = {"train", "--run-dir", r->run_dir, "--data", data, "--steps", "1",
                             "--seq", "16", "--backend", "cuda", "--gpu-mem", "1M", NULL};
        expect_exit(r, gpu, 2, "plan does not fit the GPU: batch 8 x 16 needs");
    } else {
        printf("test_option_values_are_usage_errors: --gpu-mem not checked: no CUDA backend "
               "built\n");
    }
    /* a store whose commit records are damaged: an error */
    char store[700];
    snprintf(store, sizeof store, "%s/store/fuyou-store.data", r->run_dir);
    struct stat st;
    assert_int_equal(stat(store, &st), 0);
    int fd = open(store, O_WRONLY);
    assert_true(fd >= 0);
    static char zeros[1 << 16];
    for (off_t at = 4096; at < st.st_size; at += (off_t)sizeof zeros) {
        size_t n = st.st_size - at < (off_t)sizeof zeros ? (size_t)(st.st_size - at) : sizeof zeros;
        assert_int_equal(pwrite(fd, zeros, n, at), (ssize_t)n);
    }
    assert_int_equal(close(fd), 0);
    const char *exp[] = {"export", "--run-dir", r->run_dir, "--out", out, NULL};
    expect_exit(r, exp, 1, "no intact committed step");
    assert_int_not_equal(access(out, F_OK), 0);
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL); /* waitpid must see our children, whatever we inherited */
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0) {
        fprintf(stderr, "test_launch: %s not built (run make first)\n", fy_test_bin("fuyou-launch"));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_two_paths_bf16, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_roundtrip_one_path_f32, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_malformed_descriptor_rejected, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_tmpfs_ssd_refused, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_over_budget_refused, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_option_values_are_usage_errors, setup_run,
                                        teardown_run),
        cmocka_unit_test_setup_teardown(test_kill_gpu_worker, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_kill_io_worker, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_kill_opt_worker, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_sigterm_orderly_stop, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_stale_leftovers_removed, setup_run, teardown_run),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("launch (integration)", run, wanted, NULL, NULL);
}
