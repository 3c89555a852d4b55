/* Integration tests with the real processes: fuyou-launch starting the gpu, io and opt workers.
 * The self-test's bytes on disk are compared with an in-process computation; malformed descriptors,
 * tmpfs SSD paths, over-budget plans, killed workers, SIGTERM and stale leftovers are exercised. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
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
#include "common/topo.h"
#include "io_worker/ring.h"
#include "io_worker/store.h"
#include "launcher/selftest.h"
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

/* Runs the self-test and compares the SSD store, byte for byte, with the same steps computed here
 * by the scalar AdamW kernel (itself checked against float64 in test_adamw). */
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
    assert_int_equal(WEXITSTATUS(status), 1);
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

/* The names "--x" of a text, one per line, found after `prefix` at a line's start. */
static int option_names(const char *text, const char *prefix, char names[][40], int max)
{
    int n = 0;
    size_t plen = strlen(prefix);
    for (const char *line = text; line != NULL && *line; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        if (strncmp(line, prefix, plen) != 0)
            continue;
        const char *name = line + plen;
        size_t len = strspn(name, "-abcdefghijklmnopqrstuvwxyz0123456789");
        if (len > 2 && len < 40 && n < max) {
            memcpy(names[n], name, len);
            names[n++][len] = 0;
        }
    }
    return n;
}

static int has_name(char names[][40], int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return 1;
    return 0;
}

/* docs/configuration.md describes every option of the launcher's option table (help --options)
 * and no other: an option added without its row, or a row left after its option went, fails. */
static void test_options_documented(void **state)
{
    (void)state;
    char *dir = fy_test_tmpdir("options"), *out = fy_test_path(dir, "options.txt");
    const char *args[] = {"help", "--options", NULL};
    assert_int_equal(fy_test_launch(out, args, 30), 0);
    char *table = fy_test_slurp(out, NULL), *doc = fy_test_slurp("docs/configuration.md", NULL);
    assert_non_null(table);
    assert_non_null(doc);
    static char have[128][40], documented[128][40];
    int nh = option_names(table, "", have, 128), nd = option_names(doc, "| `", documented, 128);
    assert_true(nh > 50);
    for (int i = 0; i < nh; i++)
        if (!has_name(documented, nd, have[i]))
            fail_msg("option %s is not in docs/configuration.md: add its row", have[i]);
    for (int i = 0; i < nd; i++)
        if (!has_name(have, nh, documented[i]))
            fail_msg("docs/configuration.md describes %s, which fuyou-launch does not have",
                     documented[i]);
    free(table);
    free(doc);
    fy_test_rmdir(dir);
    free(dir);
}

/* ---- each command takes the options docs/configuration.md's "commands" column gives it ------- */

static const char *const all_commands[] = {"prepare", "init",    "train",  "resume", "plan",
                                           "probe",   "profile", "report", "export", "selftest"};
#define N_COMMANDS ((int)(sizeof all_commands / sizeof all_commands[0]))

static unsigned command_bit(const char *name, size_t len)
{
    for (int c = 0; c < N_COMMANDS; c++)
        if (strlen(all_commands[c]) == len && strncmp(all_commands[c], name, len) == 0)
            return 1u << c;
    return 0;
}

/* The commands of a "commands" cell (one bit per all_commands[]): names separated by commas,
 * "train" with resume, "with workers" (the commands that start workers), "all", "all but X, Y";
 * parenthesised notes ignored. 0 where a word is none of these. */
static unsigned cell_commands(const char *cell, size_t len)
{
    const unsigned workers = command_bit("init", 4) | command_bit("train", 5) |
                             command_bit("resume", 6) | command_bit("profile", 7) |
                             command_bit("export", 6) | command_bit("selftest", 8);
    char text[256];
    size_t n = 0;
    for (size_t i = 0, depth = 0; i < len && n + 1 < sizeof text; i++) {
        depth += cell[i] == '(';
        if (depth == 0)
            text[n++] = cell[i];
        depth -= cell[i] == ')' && depth > 0;
    }
    text[n] = 0;
    unsigned set = 0, but = 0;
    for (char *save = NULL, *w = strtok_r(text, ",", &save); w != NULL;
         w = strtok_r(NULL, ",", &save)) {
        w += strspn(w, " ");
        size_t wl = strlen(w);
        while (wl > 0 && w[wl - 1] == ' ')
            wl--;
        w[wl] = 0;
        if (strncmp(w, "all but ", 8) == 0) {
            set = (1u << N_COMMANDS) - 1;
            but = 1;
            w += 8;
            wl -= 8;
        }
        unsigned bits = strcmp(w, "all") == 0            ? (1u << N_COMMANDS) - 1
                        : strcmp(w, "with workers") == 0 ? workers
                                                         : command_bit(w, wl);
        if (bits == 0)
            return 0;
        if (bits == command_bit("train", 5))
            bits |= command_bit("resume", 6);
        set = but ? set & ~bits : set | bits;
    }
    return set;
}

struct doc_option {
    char name[40];  /* --x */
    char value[40]; /* a valid value for it ("" for a switch), from its placeholder */
    unsigned commands;
};

/* A valid value for an option from the placeholder of its row: the first of alternatives, a
 * count, a size, a number, or a name. */
static void value_for(const char *placeholder, size_t len, char *out, size_t cap)
{
    const char *bar = memchr(placeholder, '\\', len);
    if (len == 0)
        snprintf(out, cap, "%s", "");
    else if (bar != NULL)
        snprintf(out, cap, "%.*s", (int)(bar - placeholder), placeholder);
    else if (len == 4 && strncmp(placeholder, "SIZE", 4) == 0)
        snprintf(out, cap, "1M");
    else if (len == 1 && placeholder[0] == 'X')
        snprintf(out, cap, "0.5");
    else if (strspn(placeholder, "NBTSMAX") == len)
        snprintf(out, cap, "3");
    else
        snprintf(out, cap, "x");
}

/* The rows "| `--name VALUE` | commands | ..." of docs/configuration.md. */
static int doc_options(const char *doc, struct doc_option *out, int max)
{
    int n = 0;
    for (const char *line = doc; line != NULL && *line; line = strchr(line + 1, '\n')) {
        line += *line == '\n';
        if (strncmp(line, "| `--", 5) != 0 || n == max)
            continue;
        const char *name = line + 3, *end = strchr(line, '\n');
        size_t len = strspn(name, "-abcdefghijklmnopqrstuvwxyz0123456789");
        const char *cell = strstr(name, "` | ");
        assert_true(len < sizeof out[n].name && cell != NULL && (end == NULL || cell < end));
        snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)len, name);
        const char *ph = name + len + (name[len] == ' ');
        value_for(ph, (size_t)(name[len] == ' ' ? strcspn(ph, "`") : 0), out[n].value,
                  sizeof out[n].value);
        cell += 4;
        out[n].commands = cell_commands(cell, strcspn(cell, "|"));
        if (out[n].commands == 0)
            fail_msg("docs/configuration.md, %s: the commands column '%.*s' names no command",
                     out[n].name, (int)strcspn(cell, "|"), cell);
        n++;
    }
    return n;
}

/* A run directory that resume can read (RUN/train.args with no arguments, started here). */
static void resumable_dir(const char *dir)
{
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    FILE *f = fopen(fy_test_path(dir, "train.args"), "w");
    assert_non_null(f);
    fprintf(f, "fuyou-train-args 1\n%s\n", cwd);
    assert_int_equal(fclose(f), 0);
}

/* Every command's --help lists exactly the options the doc's "commands" column gives it (the
 * parser's table), and the parser takes them: all of them with valid values, before an unknown
 * option, get as far as the unknown one; one it does not take (a different one for each command)
 * is refused, naming the option and the command (exit 2). Nothing runs: each launch stops at its
 * options. */
static void test_options_per_command(void **state)
{
    (void)state;
    char *dir = fy_test_tmpdir("percmd"), *out = fy_test_path(dir, "out.txt");
    char *run = fy_test_path(dir, "run");
    assert_int_equal(mkdir(run, 0700), 0);
    resumable_dir(run);
    char *doc = fy_test_slurp("docs/configuration.md", NULL);
    assert_non_null(doc);
    static struct doc_option opts[128];
    int n = doc_options(doc, opts, 128);
    assert_true(n > 50);
    for (int c = 0; c < N_COMMANDS; c++) {
        const char *cmd = all_commands[c], *help[] = {cmd, "--help", NULL};
        assert_int_equal(fy_test_launch(out, help, 30), 0);
        char *text = fy_test_slurp(out, NULL);
        assert_non_null(text);
        assert_non_null(strstr(text, fy_test_fmt("usage: fuyou-launch %s ", cmd)));
        static char listed[128][40];
        int nl = option_names(text, "  ", listed, 128);
        for (int i = 0; i < n; i++) {
            int takes = (opts[i].commands >> c) & 1, shown = has_name(listed, nl, opts[i].name);
            if (takes != shown)
                fail_msg("fuyou-launch %s --help %s %s, which docs/configuration.md says it %s",
                         cmd, shown ? "lists" : "does not list", opts[i].name,
                         takes ? "takes" : "does not take");
        }
        free(text);
        /* every option it takes at once, then an unknown one; one of those it does not take */
        const char *args[200];
        int k = 0, refused = 0;
        args[k++] = cmd;
        if (strcmp(cmd, "resume") == 0)
            args[k++] = run;
        for (int i = 0; i < n; i++) {
            if (strcmp(opts[i].name, "--help") == 0)
                continue;
            if (((opts[i].commands >> c) & 1) == 0) {
                refused++;
                continue;
            }
            assert_true(k + 3 < (int)(sizeof args / sizeof args[0]));
            args[k++] = opts[i].name;
            if (opts[i].value[0] != 0)
                args[k++] = opts[i].value;
        }
        args[k++] = "--no-such-option";
        args[k] = NULL;
        assert_int_equal(fy_test_launch(out, args, 30), 2);
        if (!fy_test_file_contains(out, "unknown or incomplete option '--no-such-option'"))
            fail_msg("fuyou-launch %s refused one of the options docs/configuration.md gives it",
                     cmd);
        for (int i = 0, seen = 0; i < n && refused > 0; i++) {
            if (((opts[i].commands >> c) & 1) != 0 || strcmp(opts[i].name, "--help") == 0 ||
                seen++ != c * 7 % refused)
                continue;
            k = strcmp(cmd, "resume") == 0 ? 2 : 1;
            args[k++] = opts[i].name;
            if (opts[i].value[0] != 0)
                args[k++] = opts[i].value;
            args[k] = NULL;
            assert_int_equal(fy_test_launch(out, args, 30), 2);
            assert_true(fy_test_file_contains(
                out, fy_test_fmt("fuyou-launch %s: %s does not apply to %s (see fuyou-launch %s "
                                 "--help)", cmd, opts[i].name, cmd, cmd)));
        }
    }
    free(doc);
    fy_test_rmdir(dir);
    free(dir);
}

/* An option a command does not take is refused before anything starts: init --batch creates no
 * run directory and exits 2 with one line naming the option and the command. --help and -h print
 * the command's own usage (resume's without its run directory), as help COMMAND does. */
static void test_command_help_and_refusal(void **state)
{
    (void)state;
    char *dir = fy_test_tmpdir("refuse"), *out = fy_test_path(dir, "out.txt");
    char *run = fy_test_path(dir, "r");
    const char *init[] = {"init", "--run-dir", run, "--batch", "4", NULL};
    assert_int_equal(fy_test_launch(out, init, 30), 2);
    assert_true(fy_test_file_contains(out, "fuyou-launch init: --batch does not apply to init"));
    assert_int_equal(fy_test_count_matches(out, "\n"), 1);
    assert_int_equal(access(run, F_OK), -1);
    const char *two[] = {"init", "--run-dir", run, "--layers", "2", "--clip-grad-norm", "3", NULL};
    assert_int_equal(fy_test_launch(out, two, 30), 2);
    assert_true(fy_test_file_contains(out, "--clip-grad-norm does not apply to init"));
    assert_int_equal(access(run, F_OK), -1);
    const char *resume[] = {"resume", "--help", NULL};
    assert_int_equal(fy_test_launch(out, resume, 30), 0);
    assert_true(fy_test_file_contains(out, "usage: fuyou-launch resume DIR"));
    assert_false(fy_test_count_matches(out, "give the run directory") > 0);
    for (int c = 0; c < N_COMMANDS; c++) {
        const char *h[] = {all_commands[c], "-h", NULL}, *hc[] = {"help", all_commands[c], NULL};
        assert_int_equal(fy_test_launch(out, h, 30), 0);
        char *mine = fy_test_slurp(out, NULL);
        assert_int_equal(fy_test_launch(out, hc, 30), 0);
        char *by_help = fy_test_slurp(out, NULL);
        assert_non_null(mine);
        assert_non_null(by_help);
        assert_string_equal(mine, by_help);
        assert_non_null(strstr(mine, fy_test_fmt("usage: fuyou-launch %s ", all_commands[c])));
        free(mine);
        free(by_help);
    }
    fy_test_rmdir(dir);
    free(dir);
}

/* ---- every message the tool prints is in docs/troubleshooting.md ---------------------------- */

/* Where the messages are, from the repository root (where the tests run). */
static const char *const msg_roots[] = {"common", "launcher", "gpu_worker", "io_worker",
                                        "opt_worker"};
#define MSG_KEY_MIN 10 /* a literal run this long keys its message alone */
#define MSG_MAX_RUNS 32
#define MSG_RUN_MAX 256

struct msg_logger {
    char name[64];
    int fmt_arg; /* which argument is the format: fy_error's 0, FY_REQUIRE's 2, ... */
};

struct msg_scan {
    struct msg_logger loggers[64];
    int nloggers;
    char *files[512], *texts[512]; /* each source and its text with the comments blanked */
    int python[512];
    int nfiles;
    char **spans; /* the doc's code spans, whitespace-normalised */
    int nspans, messages, missing;
};

static int msg_ident_char(char c) { return c == '_' || isalnum((unsigned char)c); }

/* Past the string (or char) literal opening at p; Python's strings may be triple-quoted. */
static const char *msg_skip_literal(const char *p, int python)
{
    char q = *p;
    if (python && p[1] == q && p[2] == q) {
        const char *end = strstr(p + 3, q == '"' ? "\"\"\"" : "'''");
        return end != NULL ? end + 3 : p + strlen(p);
    }
    for (p++; *p && *p != q && *p != '\n'; p++)
        if (*p == '\\' && p[1])
            p++;
    return *p == q ? p + 1 : p;
}

/* Blanks the comments of a C or Python text in place, keeping newlines and literals. */
static void msg_blank_comments(char *t, int python)
{
    for (char *p = t; *p;) {
        if (*p == '"' || *p == '\'') {
            p = (char *)msg_skip_literal(p, python);
        } else if ((python && *p == '#') || (!python && p[0] == '/' && p[1] == '/')) {
            while (*p && *p != '\n')
                *p++ = ' ';
        } else if (!python && p[0] == '/' && p[1] == '*') {
            char *end = strstr(p + 2, "*/");
            end = end != NULL ? end + 2 : p + strlen(p);
            for (; p < end; p++)
                if (*p != '\n')
                    *p = ' ';
        } else {
            p++;
        }
    }
}

static void msg_list(struct msg_scan *s, const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        fail_msg("cannot open %s: run the test from the repository root", dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            msg_list(s, path);
            continue;
        }
        const char *ext = strrchr(e->d_name, '.');
        int python = ext != NULL && strcmp(ext, ".py") == 0;
        if (ext == NULL || (!python && strcmp(ext, ".c") && strcmp(ext, ".h") &&
                            strcmp(ext, ".cu") && strcmp(ext, ".cuh")))
            continue;
        assert_true(s->nfiles < 512);
        s->files[s->nfiles] = strdup(path);
        s->texts[s->nfiles] = fy_test_slurp(path, NULL);
        assert_non_null(s->texts[s->nfiles]);
        msg_blank_comments(s->texts[s->nfiles], python);
        s->python[s->nfiles++] = python;
    }
    closedir(d);
}

static int msg_logger(const struct msg_scan *s, const char *name, size_t len)
{
    for (int i = 0; i < s->nloggers; i++)
        if (strlen(s->loggers[i].name) == len && strncmp(s->loggers[i].name, name, len) == 0)
            return i;
    return -1;
}

/* Whether text holds a call of a known logger. */
static int msg_calls_logger(const struct msg_scan *s, const char *text)
{
    for (const char *p = text; *p; p++) {
        if (!msg_ident_char(*p) || (p > text && msg_ident_char(p[-1])))
            continue;
        size_t len = 1;
        while (msg_ident_char(p[len]))
            len++;
        const char *after = p + len;
        while (*after == ' ' || *after == '\t')
            after++;
        if (*after == '(' && msg_logger(s, p, len) >= 0)
            return 1;
        p += len - 1;
    }
    return 0;
}

/* Whether `at` is the name of a "#define", at its line's start. */
static int msg_after_define(const char *text, const char *at)
{
    const char *p = at;
    while (p > text && (p[-1] == ' ' || p[-1] == '\t'))
        p--;
    if (p - text < 6 || strncmp(p - 6, "define", 6) != 0)
        return 0;
    for (p -= 6; p > text && (p[-1] == ' ' || p[-1] == '\t'); p--)
        ;
    return p > text && p[-1] == '#';
}

/* A macro whose variadic arguments reach a logger (FY_REQUIRE, FY_SYS, FY_CUDA, a file's own
 * CHECK_ARG, ...) is a logger too, its format at the place of its "...": repeated until no more
 * are found, so that a macro over such a macro counts. */
static void msg_define_loggers(struct msg_scan *s)
{
    for (int added = 1; added;) {
        added = 0;
        for (int f = 0; f < s->nfiles; f++) {
            const char *t = s->texts[f];
            for (const char *p = t; !s->python[f] && (p = strstr(p, "define")) != NULL; p += 6) {
                const char *name = p + 6;
                while (*name == ' ' || *name == '\t')
                    name++;
                size_t len = 0;
                while (msg_ident_char(name[len]))
                    len++;
                if (!msg_after_define(t, name) || len == 0 || len >= 64 || name[len] != '(' ||
                    msg_logger(s, name, len) >= 0)
                    continue;
                const char *close = strchr(name, ')');
                if (close == NULL || close - name < 4 || strncmp(close - 3, "...", 3) != 0)
                    continue;
                int params = 0;
                for (const char *c = name; c < close; c++)
                    params += *c == ',';
                const char *end = close; /* the body: to the line's end without a backslash */
                while (*end && !(*end == '\n' && end[-1] != '\\'))
                    end++;
                char *body = strndup(close + 1, (size_t)(end - close - 1));
                assert_non_null(body);
                if (strstr(body, "__VA_ARGS__") != NULL && msg_calls_logger(s, body) &&
                    s->nloggers < 64) {
                    struct msg_logger *l = &s->loggers[s->nloggers++];
                    memcpy(l->name, name, len);
                    l->name[len] = 0;
                    l->fmt_arg = params;
                    added = 1;
                }
                free(body);
            }
        }
    }
}

/* The start of argument `index` of the call whose "(" is at p; NULL when it has fewer. */
static const char *msg_arg(const char *p, int index, int python)
{
    int depth = 0;
    for (const char *at = p; *at;) {
        if (*at == '"' || *at == '\'') {
            at = msg_skip_literal(at, python);
            continue;
        }
        if (*at == '(' || *at == '[' || *at == '{')
            depth++;
        else if (*at == ')' || *at == ']' || *at == '}') {
            if (--depth == 0)
                return NULL;
        } else if (*at == ',' && depth == 1 && --index == 0) {
            return at + 1;
        }
        if (depth == 1 && index == 0 && at == p)
            return at + 1;
        at++;
    }
    return NULL;
}

/* The format starting at p: adjacent string literals, an identifier between them (PRIu64, a
 * macro's string) cutting it like a conversion (\x01); "" when the argument is no literal. */
static void msg_format(const char *p, int python, char *out, size_t cap)
{
    size_t n = 0;
    int literal = 0;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '"' || (python && *p == '\'')) {
            char q = *p++;
            for (; *p && *p != q && *p != '\n'; p++) {
                char c = *p;
                if (c == '\\' && p[1]) {
                    c = *++p;
                    c = c == 'n' || c == 't' ? ' ' : c;
                }
                if (n + 1 < cap)
                    out[n++] = c;
            }
            p += *p == q;
            literal = 1;
        } else if (literal && msg_ident_char(*p)) {
            while (msg_ident_char(*p))
                p++;
            if (n + 1 < cap)
                out[n++] = '\x01';
        } else {
            break;
        }
    }
    out[literal ? n : 0] = 0;
}

/* The literal runs of a format, cut at its conversions, whitespace collapsed and trimmed. */
static int msg_runs(const char *fmt, char runs[][MSG_RUN_MAX], int max)
{
    int nr = 0;
    char cur[MSG_RUN_MAX];
    size_t n = 0;
    for (size_t i = 0;; i++) {
        char c = fmt[i];
        int cut = c == 0 || c == '\x01';
        if (c == '%' && fmt[i + 1] == '%') {
            i++;
        } else if (c == '%') {
            for (i++; fmt[i] && strchr("-+ #0123456789.*hljztL", fmt[i]) != NULL; i++)
                ;
            i -= fmt[i] == 0; /* the conversion's letter (or \x01) ends it */
            cut = 1;
        }
        if (cut) {
            n -= n > 0 && cur[n - 1] == ' ';
            if (n > 0 && nr < max) {
                memcpy(runs[nr], cur, n);
                runs[nr++][n] = 0;
            }
            n = 0;
            if (c == 0)
                return nr;
        } else if (isspace((unsigned char)c)) {
            if (n > 0 && cur[n - 1] != ' ' && n + 1 < sizeof cur)
                cur[n++] = ' ';
        } else if (n + 1 < sizeof cur) {
            cur[n++] = c;
        }
    }
}

/* The code spans of a Markdown text (`...` or ``...`` within a line, a table's "\|" as "|"),
 * their whitespace collapsed and trimmed. */
static void msg_doc_spans(struct msg_scan *s, const char *doc)
{
    int cap = 0;
    for (const char *p = doc; (p = strchr(p, '`')) != NULL;) {
        size_t ticks = strspn(p, "`");
        const char *start = p + ticks, *end = start;
        while ((end = strchr(end, '`')) != NULL && strspn(end, "`") != ticks)
            end += strspn(end, "`");
        if (end == NULL || memchr(start, '\n', (size_t)(end - start)) != NULL) {
            p = start;
            continue;
        }
        char *span = malloc((size_t)(end - start) + 1);
        assert_non_null(span);
        size_t n = 0;
        for (const char *c = start; c < end; c++) {
            if (c[0] == '\\' && c[1] == '|')
                continue;
            if (!isspace((unsigned char)*c))
                span[n++] = *c;
            else if (n > 0 && span[n - 1] != ' ')
                span[n++] = ' ';
        }
        n -= n > 0 && span[n - 1] == ' ';
        span[n] = 0;
        if (s->nspans == cap) {
            cap = cap ? 2 * cap : 1024;
            s->spans = realloc(s->spans, (size_t)cap * sizeof *s->spans);
            assert_non_null(s->spans);
        }
        s->spans[s->nspans++] = span;
        p = end + ticks;
    }
}

/* Whether one code span holds the message's key: its longest run when that has MSG_KEY_MIN
 * characters, else all its runs in order. */
static int msg_documented(const struct msg_scan *s, char runs[][MSG_RUN_MAX], int nr)
{
    int longest = 0;
    for (int i = 1; i < nr; i++)
        if (strlen(runs[i]) > strlen(runs[longest]))
            longest = i;
    int whole = strlen(runs[longest]) < MSG_KEY_MIN;
    for (int sp = 0; sp < s->nspans; sp++) {
        const char *at = s->spans[sp];
        int i = whole ? 0 : longest, last = whole ? nr - 1 : longest;
        for (; i <= last && (at = strstr(at, runs[i])) != NULL; i++)
            at += strlen(runs[i]);
        if (i > last)
            return 1;
    }
    return 0;
}

/* Checks each call of a logger in file f (fprintf's to stderr and, in Python, InputError's). */
static void msg_check_file(struct msg_scan *s, int f)
{
    const char *t = s->texts[f];
    int line = 1, python = s->python[f];
    for (const char *p = t; *p;) {
        if (*p == '"' || *p == '\'') {
            const char *end = msg_skip_literal(p, python);
            for (; p < end; p++)
                line += *p == '\n';
            continue;
        }
        if (!msg_ident_char(*p) || (p > t && msg_ident_char(p[-1]))) {
            line += *p++ == '\n';
            continue;
        }
        size_t len = 0;
        while (msg_ident_char(p[len]))
            len++;
        const char *name = p, *open = p + len;
        p += len;
        while (*open == ' ' || *open == '\t')
            open++;
        int logger = python ? -1 : msg_logger(s, name, len), fmt_arg = -1;
        if (logger >= 0)
            fmt_arg = s->loggers[logger].fmt_arg;
        else if (!python && len == 7 && strncmp(name, "fprintf", 7) == 0)
            fmt_arg = 1;
        else if (python && len == 10 && strncmp(name, "InputError", 10) == 0)
            fmt_arg = 0;
        if (fmt_arg < 0 || *open != '(' || msg_after_define(t, name))
            continue;
        const char *arg = msg_arg(open, fmt_arg, python);
        if (arg == NULL)
            continue;
        if (logger < 0 && !python) { /* fprintf: only to stderr */
            const char *to = msg_arg(open, 0, 0);
            while (isspace((unsigned char)*to))
                to++;
            if (strncmp(to, "stderr", 6) != 0 || msg_ident_char(to[6]))
                continue;
        }
        char fmt[2048], runs[MSG_MAX_RUNS][MSG_RUN_MAX];
        msg_format(arg, python, fmt, sizeof fmt);
        int nr = msg_runs(fmt, runs, MSG_MAX_RUNS), letters = 0;
        for (int i = 0; i < nr; i++)
            for (const char *c = runs[i]; *c; c++)
                letters |= isalpha((unsigned char)*c);
        if (!letters) /* no literal or no words: it prints what the caller made */
            continue;
        s->messages++;
        if (msg_documented(s, runs, nr))
            continue;
        s->missing++;
        for (char *c = fmt; *c; c++)
            *c = *c == '\x01' ? '~' : *c == '\n' ? ' ' : *c;
        fprintf(stderr, "%s:%d: not in docs/troubleshooting.md: \"%s\"\n", s->files[f], line,
                fmt);
    }
}

/* docs/troubleshooting.md lists every message the tool prints. Each call of fy_error, fy_warn, a
 * macro that passes its "..." on to them (found in the sources: FY_REQUIRE, FY_SYS, FY_CUDA, a
 * file's CHECK_ARG, ...), fprintf(stderr, ...) and the tokenizer helper's InputError gives a
 * format: its string literals, adjacent ones joined, an identifier between them (PRIu64, a
 * macro's string) cutting it as a conversion does. Its key is its longest literal run between
 * conversions, whitespace collapsed, when that has MSG_KEY_MIN characters; for a format mostly
 * of conversions ("fsync %s: %s") all its runs, in order. The key must lie within one code span
 * of the doc, where FILE, N, ... stand for the conversions. Not seen: a format without words
 * ("%s: %s", a wrapper's own: its callers' formats are checked), a message built in a buffer
 * and logged through "%s", a format that is not a literal; a short key may be matched by the row
 * of another message, and a row whose message is gone does not fail. */
static void test_messages_documented(void **state)
{
    (void)state;
    static struct msg_scan s;
    memset(&s, 0, sizeof s);
    s.loggers[s.nloggers++] = (struct msg_logger){"fy_error", 0};
    s.loggers[s.nloggers++] = (struct msg_logger){"fy_warn", 0};
    for (size_t i = 0; i < sizeof msg_roots / sizeof *msg_roots; i++)
        msg_list(&s, msg_roots[i]);
    char *doc = fy_test_slurp("docs/troubleshooting.md", NULL);
    assert_non_null(doc);
    msg_doc_spans(&s, doc);
    msg_define_loggers(&s);
    assert_true(msg_logger(&s, "FY_REQUIRE", 10) >= 0);
    for (int f = 0; f < s.nfiles; f++)
        msg_check_file(&s, f);
    assert_true(s.messages > 300); /* fewer: the scan broke */
    int missing = s.missing;
    for (int f = 0; f < s.nfiles; f++) {
        free(s.files[f]);
        free(s.texts[f]);
    }
    for (int i = 0; i < s.nspans; i++)
        free(s.spans[i]);
    free(s.spans);
    free(doc);
    if (missing > 0)
        fail_msg("%d of the %d messages are not in docs/troubleshooting.md (listed above): "
                 "add their rows", missing, s.messages);
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
        cmocka_unit_test_setup_teardown(test_kill_gpu_worker, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_kill_io_worker, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_kill_opt_worker, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_sigterm_orderly_stop, setup_run, teardown_run),
        cmocka_unit_test_setup_teardown(test_stale_leftovers_removed, setup_run, teardown_run),
        cmocka_unit_test(test_options_documented),
        cmocka_unit_test(test_options_per_command),
        cmocka_unit_test(test_command_help_and_refusal),
        cmocka_unit_test(test_messages_documented),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("launch (integration)", run, wanted, NULL, NULL);
}
