/* Fault isolation of long runs, through the real processes on the CPU backend: the SSD store
 * damaged (state and commit records corrupted, cut short, made before commit records), full (a
 * test hook, a real small filesystem, the run directory's filesystem) and moved (a run directory
 * copied, moved, read-only, its store gone); and a run of packed documents (--epochs) whose
 * workers and launcher are killed in the middle of its epochs. Each run must end with the losses
 * and final weights of a run never disturbed, bit for bit, or refuse saying why and write nothing,
 * and leave no process, shared memory or temporary file behind. (Processes killed and stopped:
 * test_chaos.) */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/formats/ckpt.h"
#include "common/model/optstate.h"
#include "io_worker/store.h"
#include "tests/chaos.h"
#include "tests/testutil.h"

static void test_reference_run(void **state) { fy_chaos_reference_run(state); }

/* The mount point of a test's filesystem while it is mounted (test_relocated_run's read-only
 * bind mount, the small filesystems of the tests of full disks), for the group's teardown. */
static char mounted[600];

static int run_cmd(const char *cmd)
{
    int rc = system(cmd);
    return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

static int group_teardown(void **state)
{
    if (mounted[0] != 0) /* a test of a full filesystem failed with it mounted (and perhaps
                            processes of its run still exiting) */
        run_cmd(fy_test_fmt("umount '%s' || { sleep 2; umount '%s'; } || umount -l '%s'", mounted,
                            mounted, mounted));
    return fy_chaos_group_teardown(state);
}

/* ---- damage on the SSD while the run is stopped ---- */

/* Byte offset of an extent in the store's one data file (one SSD path: logical + header). */
static uint64_t extent_at(const char *store, uint32_t tensor, uint64_t *bytes)
{
    const char *paths[] = {store};
    struct fy_store_opts o = {.paths = paths, .npaths = 1};
    struct fy_store *s = NULL;
    assert_int_equal(fy_store_open(&s, &o), 0);
    struct fy_extent e;
    assert_int_equal(fy_store_find(s, tensor, &e), 0);
    fy_store_destroy(&s);
    if (bytes != NULL)
        *bytes = e.bytes;
    return FY_STORE_HEADER_BYTES + e.logical_offset;
}

/* The store's newest intact commit record, and which of the two it is. */
static int newest_record(const char *store, struct fy_storemeta *m)
{
    const char *data = fy_test_fmt("%s/%s", store, FY_STORE_DATA_NAME);
    int best = -1;
    static struct fy_storemeta r;
    static uint8_t rec[FY_COMMIT_RECORD_BYTES];
    for (int i = 0; i < 2; i++) {
        int fd = open(data, O_RDONLY);
        assert_true(fd >= 0);
        off_t at = (off_t)extent_at(store, FY_TENSOR_COMMIT(i), NULL);
        ssize_t got = pread(fd, rec, sizeof rec, at);
        close(fd);
        if (got == (ssize_t)sizeof rec && fy_storemeta_check(rec, sizeof rec) == 0 &&
            fy_storemeta_decode(rec, sizeof rec, "test", &r) == 0 && (best < 0 || r.seq > m->seq)) {
            memcpy(m, &r, sizeof r);
            best = i;
        }
    }
    return best;
}

static void flip_byte(const char *file, uint64_t at)
{
    int fd = open(file, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* A file still holds exactly the `len` bytes it held before (`before`, as fy_test_slurp read it). */
static void assert_unchanged(const char *path, const char *before, size_t len)
{
    size_t n;
    char *now = fy_test_slurp(path, &n);
    assert_non_null(now);
    assert_int_equal(n, len);
    assert_memory_equal(now, before, n);
    free(now);
}

/* The newest commit's state of a unit corrupted, then its record: each time the next run says so,
 * goes back to the commit before it and ends as the undisturbed run does. With both commits
 * damaged it refuses, saying why, and writes nothing. */
static void test_damaged_state_and_records(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "damaged");
    const char *run = rp.run, *out = rp.out, *store = rp.store, *data = rp.data;
    static struct fy_storemeta m;

    /* corrupted state: one byte of block 1's Adam v in the newest copy */
    assert_int_equal(fy_chaos_train_to(c, run, "12", out), 0); /* commits at 3, 6, 9, 12 */
    assert_true(newest_record(store, &m) >= 0);
    assert_int_equal(m.step, 12);
    uint64_t bytes, at = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(1, m.copy), &bytes);
    flip_byte(data, at + bytes - 8);
    assert_int_equal(fy_chaos_train_to(c, run, "15", out), 0);
    assert_true(fy_test_file_contains(c->f->log, "step 12's state is damaged on the SSD; going "
                                                 "back to the commit before it, step 9"));
    assert_true(fy_test_file_contains(c->f->log, "dropped 3 lines of steps after the last commit"));

    /* a torn commit record: the newest one's digest no longer matches */
    int newest = newest_record(store, &m);
    assert_int_equal(m.step, 15);
    flip_byte(data, extent_at(store, FY_TENSOR_COMMIT(newest), NULL) + 4 * 40);
    assert_int_equal(fy_chaos_train_to(c, run, "18", out), 0);
    assert_true(fy_test_file_contains(
        c->f->log, fy_test_fmt("commit record %d is damaged: torn write or corruption; using "
                               "record %d (step 12)", newest, 1 - newest)));

    /* both commits damaged: refused, nothing written */
    int which = newest_record(store, &m);
    assert_int_equal(m.step, 18);
    at = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(0, m.copy), &bytes);
    flip_byte(data, at + 100);
    flip_byte(data, extent_at(store, FY_TENSOR_COMMIT(1 - which), NULL) + 4 * 40);
    size_t before_len;
    char *before = fy_test_slurp(data, &before_len);
    assert_int_not_equal(fy_chaos_train_to(c, run, "21", out), 0);
    assert_true(fy_test_file_contains(c->f->log, "no intact committed step before the damaged "
                                                 "one"));
    assert_unchanged(data, before, before_len);
    free(before);
    fy_chaos_assert_nothing_left(run);
}

/* The optimizer state in pieces (init --state-piece 16K) streamed piece by piece with one
 * gradient slot (the test hook FUYOU_TEST_STATE_PIECES): undisturbed it ends as the whole units'
 * run does; the io and opt workers killed amid the pieces' reads, updates and write-backs, each
 * run restarts from its last commit and ends as the undisturbed one, bit for bit; a piece of a
 * unit's committed state damaged is found by the check of the commit (its pieces read, their
 * digests' digest against the record's) and the run goes back to the commit before. */
static void test_state_pieces_killed_and_damaged(void **state)
{
    struct fy_chaos *c = *state;
    static const char *const one_slot[] = {"--grad-slots", "1", NULL};
    struct fy_chaos cp = {.f = c->f, .state_piece = "16K", .train_extra = one_slot};
    assert_int_equal(setenv("FUYOU_TEST_STATE_PIECES", "1", 1), 0);
    fy_chaos_reference_run_in(&cp, "reference-pieces");
    assert_true(fy_test_file_contains(c->f->log, "plan: optimizer state in pieces (3 units cut in "
                                                 "pieces of at most 16.0 KiB"));
    if (c->ref_weights != NULL) { /* the whole units' undisturbed run */
        assert_string_equal(cp.ref_losses, c->ref_losses);
        assert_int_equal(cp.ref_len, c->ref_len);
        assert_memory_equal(cp.ref_weights, c->ref_weights, c->ref_len);
    }
    fy_chaos_kill_worker(&cp, "io", "io-pieces", 31, 3);
    fy_chaos_kill_worker(&cp, "opt", "opt-pieces", 32, 3);
    /* a byte of block 1's last piece in the newest commit's copy */
    struct fy_chaos_paths rp = fy_chaos_new_run(&cp, "damaged-pieces");
    static struct fy_storemeta m;
    assert_int_equal(fy_chaos_train_to(&cp, rp.run, "6", rp.out), 0); /* commits at 3, 6 */
    assert_true(newest_record(rp.store, &m) >= 0);
    assert_int_equal(m.step, 6);
    assert_int_equal(m.model.state_piece, 16384);
    assert_true(fy_optstate_piece_count(&m.model, 1) > 2);
    uint64_t bytes, at = extent_at(rp.store, FY_TENSOR_UNIT_STATE_COPY(1, m.copy), &bytes);
    flip_byte(rp.data, at + bytes - 8);
    assert_int_equal(fy_chaos_train_to(&cp, rp.run, "9", rp.out), 0);
    assert_true(fy_test_file_contains(c->f->log, "read piece by piece, does not match its commit "
                                                 "record"));
    assert_true(fy_test_file_contains(c->f->log, "step 6's state is damaged on the SSD; going "
                                                 "back to the commit before it, step 3"));
    unsetenv("FUYOU_TEST_STATE_PIECES");
    fy_chaos_assert_nothing_left(rp.run);
    free(cp.ref_losses);
    free(cp.ref_weights);
}

/* A run directory is relocatable: a copy (cp -a) resumed trains the copy and leaves the original
 * as it was; a moved one resumes where it is; a model.conf written before stores were recorded
 * relative to their run directory still takes the copy's own store; a read-only one is refused,
 * and so is a run whose store outside it (--ssd) has gone. Each ends as the undisturbed run. */
static void test_relocated_run(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "orig");
    const char *run = rp.run, *data = rp.data;
    char copy[600], moved[600], legacy[600], ro[600], out[700], log[700];
    snprintf(copy, sizeof copy, "%s-copy", run);
    snprintf(moved, sizeof moved, "%s-moved", run);
    snprintf(legacy, sizeof legacy, "%s-legacy", run);
    snprintf(ro, sizeof ro, "%s-ro", run);
    snprintf(out, sizeof out, "%s.fywt", moved);
    snprintf(log, sizeof log, "%s/fuyou.log", run);
    assert_int_equal(fy_chaos_train_to(c, run, "12", rp.out), 0);
    size_t store_len, metrics_len, log_len;
    char *store_before = fy_test_slurp(data, &store_len);
    char *metrics_before = fy_test_slurp(rp.metrics, &metrics_len);
    char *log_before = fy_test_slurp(log, &log_len);
    assert_non_null(store_before);

    /* a copy resumed: the copy advances, the original does not change */
    assert_int_equal(run_cmd(fy_test_fmt("cp -a '%s' '%s'", run, copy)), 0);
    char copy_out[700];
    snprintf(copy_out, sizeof copy_out, "%s.fywt", copy);
    const char *resume_copy[] = {"resume", copy, "--steps", "18", "--export", copy_out, NULL};
    assert_int_equal(fy_test_launch_in(c->f, resume_copy, 300), 0);
    assert_int_equal(fy_test_count_matches(fy_test_fmt("%s/metrics.jsonl", copy), "\"step\": "),
                     18); /* within the warmup: the learning rates of a run to STEPS */
    assert_unchanged(data, store_before, store_len);
    assert_unchanged(rp.metrics, metrics_before, metrics_len);
    assert_unchanged(log, log_before, log_len); /* not even a line in the original's log */

    /* moved, then resumed where it is now: the old name is not made again */
    assert_int_equal(rename(copy, moved), 0);
    const char *resume_moved[] = {"resume", moved, "--steps", FY_CHAOS_STEPS, "--export", out,
                                  NULL};
    assert_int_equal(fy_test_launch_in(c->f, resume_moved, 300), 0);
    assert_int_not_equal(access(copy, F_OK), 0);
    fy_chaos_assert_same_as_reference(c, moved, out);
    fy_chaos_assert_nothing_left(moved);

    /* a model.conf of the old form (the store's path as init was given it) in a copy */
    assert_int_equal(run_cmd(fy_test_fmt("cp -a '%s' '%s' && sed -i -e 's|^ssd = store$|ssd = "
                                         "%s/store|' -e '/^store_in_run_dir/d' '%s/model.conf'",
                                         run, legacy, run, legacy)), 0);
    assert_false(fy_test_file_contains(fy_test_fmt("%s/model.conf", legacy), "store_in_run_dir"));
    const char *resume_legacy[] = {"resume", legacy, "--steps", "15", "--export", copy_out,
                                   "--overwrite", NULL};
    assert_int_equal(fy_test_launch_in(c->f, resume_legacy, 300), 0);
    assert_true(fy_test_file_contains(c->f->log, fy_test_fmt("names the store %s/store, of the run "
                                                             "directory it was made in", run)));
    assert_unchanged(data, store_before, store_len);

    /* read-only (a read-only bind mount of the original): refused, the original untouched */
    assert_int_equal(mkdir(ro, 0700), 0);
    if (run_cmd(fy_test_fmt("mount --bind '%s' '%s' && mount -o remount,ro,bind '%s'", run, ro,
                            ro)) == 0) {
        snprintf(mounted, sizeof mounted, "%s", ro);
        const char *resume_ro[] = {"resume", ro, "--steps", "15", NULL};
        assert_int_equal(fy_test_launch_in(c->f, resume_ro, 120), 1);
        assert_true(fy_test_file_contains(c->f->log, "cannot be written (Read-only file system)"));
        assert_int_equal(run_cmd(fy_test_fmt("umount '%s'", ro)), 0);
        mounted[0] = 0;
        assert_unchanged(data, store_before, store_len);
    } else {
        printf("test_relocated_run: the read-only part skipped: cannot bind-mount (needs root)\n");
    }
    free(store_before);
    free(metrics_before);
    free(log_before);

    /* a store outside the run directory (--ssd) that has gone is named, with the fix */
    char *ext = fy_test_in(c->f, "ext-store"), *extrun = fy_test_in(c->f, "ext-run");
    assert_int_equal(mkdir(ext, 0700), 0);
    const char *init[] = {"init", "--run-dir", extrun, "--layers", "2", "--heads", "2", "--embd",
                          "64", "--ctx", "32", "--seed", "5", "--ssd", ext, NULL};
    assert_int_equal(fy_test_launch_in(c->f, init, 60), 0);
    assert_int_equal(rename(ext, fy_test_fmt("%s-gone", ext)), 0);
    const char *args[48];
    fy_chaos_train_args(args, extrun, c->f->data, "3", fy_test_fmt("%s.fywt", extrun), NULL);
    assert_int_equal(fy_test_launch_in(c->f, args, 120), 1);
    assert_true(fy_test_file_contains(c->f->log, fy_test_fmt("the store of %s is missing", extrun)));
    assert_true(fy_test_file_contains(c->f->log, "pass --ssd with the store's directories"));
}

/* Both commits' state damaged (each record intact): the run refuses with one final line naming
 * both, and writes nothing. */
static void test_both_commits_damaged(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "bothbad");
    const char *run = rp.run, *out = rp.out, *store = rp.store, *data = rp.data;
    static struct fy_storemeta m;
    /* commits at 9 and 12 in the two copies */
    assert_int_equal(fy_chaos_train_to(c, run, "12", out), 0);
    int newest = newest_record(store, &m);
    assert_true(newest >= 0);
    assert_int_equal(m.step, 12);
    uint64_t bytes, at = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(1, m.copy), &bytes);
    flip_byte(data, at + 100);
    at = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(2, 1 - m.copy), &bytes);
    flip_byte(data, at + bytes - 8);
    size_t before_len;
    char *before = fy_test_slurp(data, &before_len);
    assert_int_equal(fy_chaos_train_to(c, run, "15", out), 1);
    assert_true(fy_test_file_contains(c->f->log, "step 12's state is damaged on the SSD; going "
                                                 "back to the commit before it, step 9"));
    assert_true(fy_test_file_contains(
        c->f->log, fy_test_fmt("neither commit of the store is intact: the state of step 12 "
                               "(commit record %d) and that of step 9 (record %d) do not match",
                               newest, 1 - newest)));
    assert_int_equal(fy_test_count_matches(c->f->log, "restart "), 0);
    assert_unchanged(data, before, before_len);
    free(before);
    fy_chaos_assert_nothing_left(run);
}

/* State damaged on the SSD while the run trains (one byte of each unit's working copy flipped while
 * the launcher is stopped, between two commits): the read that finds it says so, and the run goes
 * back to its last commit, which is intact, and ends as the undisturbed run does. */
static void test_damage_found_while_training(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "rot");
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    const char *store = rp.store, *data = rp.data;
    /* slower steps: the test stops it between two */
    int pid = fy_chaos_start_run(c, &rp, NULL, "20");
    /* stopped after step 3k + 1 and before the next commit, so the working copy holds state
     * written since the last commit that the next steps read back before they commit again */
    for (double t0 = fy_test_now_s();; fy_test_pause_ms(1)) {
        assert_true(fy_test_now_s() - t0 < 120);
        int done = fy_test_count_matches(metrics, "\"step\": ");
        if (done < 4 || done % 3 != 1)
            continue;
        assert_int_equal(kill(pid, SIGSTOP), 0);
        if (fy_test_count_matches(metrics, "\"step\": ") == done)
            break;
        assert_int_equal(kill(pid, SIGCONT), 0);
    }
    static struct fy_storemeta m;
    assert_true(newest_record(store, &m) >= 0);
    for (unsigned u = 0; u < fy_model_unit_count(&m.model); u++) {
        uint64_t bytes, at = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(u, 1 - m.copy), &bytes);
        flip_byte(data, at + bytes / 2);
    }
    assert_int_equal(kill(pid, SIGCONT), 0);
    int status = fy_test_wait(pid, 240);
    assert_true(status != -1 && WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fy_test_file_contains(log, "no such line: the log, to see why");
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(fy_test_file_contains(log, "read back from the SSD store is damaged"));
    assert_true(fy_test_file_contains(log, "restart 1: state read back from the SSD store was "
                                           "damaged"));
    assert_true(fy_test_file_contains(log, fy_test_fmt("the store's last commit is step %llu",
                                                       (unsigned long long)m.step)));
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}

/* Two exports' files are the same, byte for byte. */
static void assert_same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *wa = fy_test_slurp(a, &na), *wb = fy_test_slurp(b, &nb);
    assert_non_null(wa);
    assert_non_null(wb);
    assert_int_equal(na, nb);
    assert_memory_equal(wa, wb, na);
    free(wa);
    free(wb);
}

/* The newest commit's state damaged (a byte of a unit's master weights): export, to a weights file
 * and to a Hugging Face directory, says so and exports the commit before it, as an export of that
 * commit taken before wrote it; with that commit's state damaged too it refuses, naming both. */
static void test_export_damaged_commit(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "expdamaged");
    const char *run = rp.run, *out = rp.out, *store = rp.store, *data = rp.data;
    static struct fy_storemeta m;
    char *at6 = fy_test_in(c->f, "expdamaged-6.fywt"), *hf6 = fy_test_in(c->f, "expdamaged-6-hf");
    char *got = fy_test_in(c->f, "expdamaged-9.fywt"), *got_hf = fy_test_in(c->f, "expdamaged-9-hf");
    assert_int_equal(fy_chaos_train_to(c, run, "6", out), 0); /* commits at 3 and 6 */
    const char *exp6[] = {"export", "--run-dir", run, "--out", at6, NULL};
    const char *exp6_hf[] = {"export", "--run-dir", run, "--to-hf", hf6, NULL};
    assert_int_equal(fy_test_launch_in(c->f, exp6, 120), 0);
    assert_int_equal(fy_test_launch_in(c->f, exp6_hf, 120), 0);
    assert_int_equal(fy_chaos_train_to(c, run, "9", out), 0); /* and 9, into the other copy */
    assert_true(newest_record(store, &m) >= 0);
    assert_int_equal(m.step, 9);
    uint64_t bytes, at = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(1, m.copy), &bytes);
    flip_byte(data, at + 100);

    const char *exp[] = {"export", "--run-dir", run, "--out", got, NULL};
    if (fy_test_launch_in(c->f, exp, 120) != 0) /* its log, to see why */
        fy_test_file_contains(c->f->log, "a line no log has");
    assert_true(access(got, R_OK) == 0);
    const char *said = fy_test_fmt("%s: step 9's state is damaged on the SSD; exporting the commit "
                                   "before it, step 6", got);
    assert_true(fy_test_file_contains(c->f->log, said));
    assert_true(fy_test_file_contains(c->f->log, "exported step 6 to"));
    assert_same_file(got, at6);
    const char *exp_hf[] = {"export", "--run-dir", run, "--to-hf", got_hf, NULL};
    assert_int_equal(fy_test_launch_in(c->f, exp_hf, 120), 0);
    assert_true(fy_test_file_contains(c->f->log, fy_test_fmt("%s: step 9's state is damaged on "
                                                             "the SSD; exporting the commit "
                                                             "before it, step 6", got_hf)));
    assert_true(fy_test_file_contains(c->f->log, "exported step 6 to"));
    assert_same_file(fy_test_fmt("%s/model.safetensors", got_hf),
                     fy_test_fmt("%s/model.safetensors", hf6));
    assert_same_file(fy_test_fmt("%s/config.json", got_hf), fy_test_fmt("%s/config.json", hf6));

    /* step 6's state damaged too: nothing to export */
    at = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(2, 1 - m.copy), &bytes);
    flip_byte(data, at + 100);
    unlink(got);
    assert_int_not_equal(fy_test_launch_in(c->f, exp, 120), 0);
    assert_true(fy_test_file_contains(c->f->log, "step 9's state is damaged on the SSD, and so is "
                                                 "step 6's, the commit before it: nothing intact "
                                                 "to export; initialise the store anew"));
    assert_int_not_equal(access(got, F_OK), 0);
    fy_chaos_assert_nothing_left(run);
}

/* A store cut short (its data file truncated inside the newest commit's state): the next run
 * finds the newest commit damaged and goes back to the one before, and ends as the undisturbed
 * run does. */
static void test_truncated_store(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "truncated");
    const char *run = rp.run, *out = rp.out, *store = rp.store, *data = rp.data;
    static struct fy_storemeta m;
    /* commits at 3, 6, 9 and 12 (seq 2 to 5): the newest, seq 5, is in copy 0, which init
     * allocated after copy 1, so it is the end of the file (scratch extents aside) */
    assert_int_equal(fy_chaos_train_to(c, run, "12", out), 0);
    assert_true(newest_record(store, &m) >= 0);
    assert_int_equal(m.copy, 0);
    unsigned last = fy_model_unit_count(&m.model) - 1;
    uint64_t cut = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(last, 0), NULL) + 4096;
    uint64_t older = extent_at(store, FY_TENSOR_UNIT_STATE_COPY(last, 1), NULL);
    assert_true(older < cut);
    assert_int_equal(truncate(data, (off_t)cut), 0);
    assert_int_equal(fy_chaos_train_to(c, run, FY_CHAOS_STEPS, out), 0);
    assert_true(fy_test_file_contains(c->f->log, "step 12's state is damaged on the SSD; going "
                                                 "back to the commit before it, step 9"));
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}

/* The SSD fills during write-back (a test hook fails every write after the first 150 as a full
 * disk would): the run stops with a message that names the store, its last commit intact; once
 * there is room, resume ends as the undisturbed run does. */
static void test_disk_full(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "full");
    const char *run = rp.run, *out = rp.out;
    setenv("FUYOU_TEST_IO_ENOSPC_AFTER", "150", 1);
    int rc = fy_chaos_train_to(c, run, FY_CHAOS_STEPS, out);
    unsetenv("FUYOU_TEST_IO_ENOSPC_AFTER");
    assert_int_equal(rc, 1);
    assert_true(fy_test_file_contains(c->f->log, "No space left on device"));
    assert_true(fy_test_file_contains(c->f->log, fy_test_fmt("the SSD store (%s/store) is full: "
                                                             "training stopped", run)));
    assert_int_equal(fy_test_count_matches(c->f->log, "restart "), 0);
    const char *resume[] = {"resume", run, NULL};
    assert_int_equal(fy_test_launch_in(c->f, resume, 300), 0);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}

/* A real full disk: the store on a small ext4 filesystem (a loop-mounted image) that a filler file
 * has filled after the model was created. Training with the checkpoints on the SSD must allocate
 * their scratch extent and cannot: it stops before any step, naming the store, its last commit
 * intact; with the filler removed, resume ends as the undisturbed run does. (The store allocates
 * its extents when it creates them, so on such a filesystem a full disk shows there, not in a
 * write-back; test_disk_full covers a write-back failing.) Skipped, saying so, where a loop
 * filesystem cannot be mounted (not root, no loop devices). */
static void test_full_filesystem(void **state)
{
    struct fy_chaos *c = *state;
    char *img = fy_test_in(c->f, "small.img"), *mnt = fy_test_in(c->f, "small");
    char *run = fy_test_in(c->f, "onsmall"), out[600], store[640], filler[640];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(store, sizeof store, "%s/store", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    assert_int_equal(mkdir(mnt, 0700), 0);
    if (run_cmd(fy_test_fmt("truncate -s 48M '%s' && mkfs.ext4 -q -F -m 0 '%s' >/dev/null 2>&1",
                            img, img)) != 0 ||
        run_cmd(fy_test_fmt("mount -o loop '%s' '%s' 2>/dev/null", img, mnt)) != 0) {
        printf("test_full_filesystem: skipped: cannot make and mount a small ext4 filesystem "
               "(needs root, mkfs.ext4 and loop devices)\n");
        skip();
    }
    snprintf(mounted, sizeof mounted, "%s", mnt);
    assert_int_equal(mkdir(store, 0700), 0);
    const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd",
                          "64", "--ctx", "32", "--seed", "5", "--ssd", store, NULL};
    assert_int_equal(fy_test_launch_in(c->f, init, 60), 0);
    /* filled to the last block: the io worker cannot even start (its O_DIRECT probe); the launch
     * says so and stops the other workers at once, not after the stop timeout */
    run_cmd(fy_test_fmt("dd if=/dev/zero of='%s' bs=4k 2>/dev/null", filler));
    const char *full_args[40];
    fy_chaos_train_args(full_args, run, c->f->data, FY_CHAOS_STEPS, out, NULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(fy_test_launch_in(c->f, full_args, 120), 3);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(fy_test_file_contains(c->f->log, "the SSD is full (no room for a 4 KiB probe"));
    assert_int_equal(fy_test_count_matches(c->f->log, "did not stop: sending"), 0);
    assert_true(t1.tv_sec - t0.tv_sec < 8); /* the stop timeout is 10 s */
    assert_int_equal(unlink(filler), 0);
    /* filled to 512 KiB short of full: room for the io worker's 4 KiB O_DIRECT probe, none for
     * the checkpoints' scratch extent (1 MiB at least) */
    assert_int_equal(run_cmd(fy_test_fmt("fallocate -l $(( ($(df --output=avail -B4096 '%s' | "
                                         "tail -1) - 128) * 4096 )) '%s'", mnt, filler)), 0);
    const char *args[48], *extra[] = {"--ckpt-place", "ssd", NULL};
    fy_chaos_train_args(args, run, c->f->data, FY_CHAOS_STEPS, out, extra);
    assert_int_equal(fy_test_launch_in(c->f, args, 300), 1);
    assert_true(fy_test_file_contains(c->f->log, "the SSD is full"));
    assert_true(fy_test_file_contains(
        c->f->log, fy_test_fmt("the SSD store (%s) is full: training stopped; the last commit, "
                               "step 0, is intact", store)));
    assert_int_equal(unlink(filler), 0);
    const char *resume[] = {"resume", run, NULL};
    assert_int_equal(fy_test_launch_in(c->f, resume, 300), 0);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
    assert_int_equal(run_cmd(fy_test_fmt("umount '%s'", mnt)), 0);
    mounted[0] = 0;
}

/* The steps' lines in a metrics file, in order: 1 when they are first..last, each once, but for
 * those of lost_from..lost_to (none where lost_from is 0). */
static int steps_in_order(const char *metrics, int first, int last, int lost_from, int lost_to)
{
    char *text = fy_test_slurp(metrics, NULL);
    int want = first, ok = text != NULL;
    for (char *p = text; ok && (p = strstr(p, "{\"step\": ")) != NULL; p++) {
        want = want == lost_from ? lost_to + 1 : want;
        ok = atoi(p + strlen("{\"step\": ")) == want++;
    }
    free(text);
    return ok && want == last + 1;
}

/* Fills the filesystem mounted at mnt to its last block (filler files beside `filler`): large
 * writes stop short of it (ext4 reserves for the worst case), 1 KiB ones (its block) go on, and
 * again once the first ones are written back. */
static void fill_up(const char *mnt, const char *filler)
{
    run_cmd(fy_test_fmt("dd if=/dev/zero of='%s' bs=64k 2>/dev/null; dd if=/dev/zero of='%s-2' "
                        "bs=1k 2>/dev/null; sync -f '%s'; dd if=/dev/zero of='%s-3' bs=1k "
                        "2>/dev/null", filler, filler, mnt, filler));
}

static void free_up(const char *filler)
{
    assert_int_equal(run_cmd(fy_test_fmt("rm '%s' '%s-2' '%s-3'", filler, filler, filler)), 0);
}

/* The run directory fills while training (a small ext4 filesystem, filler files written to its
 * last block; the store elsewhere): the metrics lines and the log lines of the steps meanwhile
 * wait in memory, said once, and go in once the filler is removed. The run ends as the
 * undisturbed run does, with each step's metrics line once and in order, and RUN/fuyou.log holds
 * the progress lines of the steps trained while it was full. Full for longer than the memory kept
 * for the metrics lines, the run stops at a commit, and the lines that could not be written are
 * said lost. Skipped, saying so, where a loop filesystem cannot be mounted. */
static void test_run_directory_full(void **state)
{
    struct fy_chaos *c = *state;
    char *img = fy_test_in(c->f, "rundir.img"), *mnt = fy_test_in(c->f, "rundir");
    char *store = fy_test_in(c->f, "rundir-store"), *out = fy_test_in(c->f, "rundir.fywt");
    char *log = fy_test_in(c->f, "rundir.log");
    char run[640], filler[640], metrics[700], runlog[700];
    snprintf(run, sizeof run, "%s/run", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    snprintf(runlog, sizeof runlog, "%s/fuyou.log", run);
    assert_int_equal(mkdir(mnt, 0700), 0);
    assert_int_equal(mkdir(store, 0700), 0);
    if (run_cmd(fy_test_fmt("truncate -s 32M '%s' && mkfs.ext4 -q -F -m 0 '%s' >/dev/null 2>&1",
                            img, img)) != 0 ||
        run_cmd(fy_test_fmt("mount -o loop '%s' '%s' 2>/dev/null", img, mnt)) != 0) {
        printf("test_run_directory_full: skipped: cannot make and mount a small ext4 filesystem "
               "(needs root, mkfs.ext4 and loop devices)\n");
        skip();
    }
    snprintf(mounted, sizeof mounted, "%s", mnt);
    const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd",
                          "64", "--ctx", "32", "--seed", "5", "--ssd", store, NULL};
    assert_int_equal(fy_test_launch_in(c->f, init, 60), 0);
    const char *args[48];
    fy_chaos_train_args(args, run, c->f->data, FY_CHAOS_STEPS, out, NULL);
    setenv("FUYOU_TEST_OPT_DELAY_MS", "40", 1); /* slower steps: the disk fills mid-run */
    int pid = fy_test_start("fuyou-launch", args, log);
    unsetenv("FUYOU_TEST_OPT_DELAY_MS");
    assert_true(pid > 0);
    double t0 = fy_test_now_s();
    while (fy_test_count_matches(metrics, "\"step\": ") < 6 && fy_test_now_s() - t0 < 60)
        fy_test_pause_ms(5);
    fill_up(mnt, filler);
    int lines = fy_test_count_matches(metrics, "\"step\": ");
    int steps = fy_test_count_matches(log, "/" FY_CHAOS_STEPS " | loss");
    while (fy_test_count_matches(log, "/" FY_CHAOS_STEPS " | loss") < steps + 4 &&
           fy_test_now_s() - t0 < 60)
        fy_test_pause_ms(5);
    steps = fy_test_count_matches(log, "/" FY_CHAOS_STEPS " | loss");
    int stalled = fy_test_count_matches(metrics, "\"step\": ");
    printf("chaos: the run directory filled after %d metrics lines; %d lines in the file when "
           "%d steps were done\n", lines, stalled, steps);
    /* it was full, and the run went on */
    assert_true(stalled < steps && steps < atoi(FY_CHAOS_STEPS));
    free_up(filler);
    int status = fy_test_wait(pid, 240);
    assert_true(status != -1 && WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fy_test_file_contains(log, "no such line: the log, to see why");
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(steps_in_order(metrics, 1, atoi(FY_CHAOS_STEPS), 0, 0));
    fy_chaos_assert_same_as_reference(c, run, out);
    /* the progress lines, those of the full disk too */
    for (int s = 1; s <= atoi(FY_CHAOS_STEPS); s++)
        assert_int_equal(
            fy_test_count_matches(runlog, fy_test_fmt("] info: step %d/" FY_CHAOS_STEPS " | ", s)),
            1);
    assert_int_equal(fy_test_count_matches(log, fy_test_fmt("cannot write %s: No space left on "
                                                            "device: training goes on", metrics)),
                     1);
    assert_true(fy_test_file_contains(log, fy_test_fmt("%s: there is room again: ", metrics)));
    assert_true(fy_test_file_contains(log, fy_test_fmt("cannot write the run log %s: No space "
                                                       "left on device", runlog)));
    assert_true(fy_test_file_contains(runlog, fy_test_fmt("the run log %s is written again",
                                                          runlog)));
    fy_chaos_assert_nothing_left(run);

    /* full for longer than the memory kept (a test hook makes it 1000 bytes: two lines): the run
     * stops at a commit, saying so and which lines are lost (exit 1); with room, resume goes on
     * after them */
    const char *more[] = {"resume", run, "--steps", "60", NULL};
    unlink(out);
    setenv("FUYOU_TEST_OPT_DELAY_MS", "40", 1);
    setenv("FUYOU_TEST_METRICS_PENDING_MAX", "1000", 1);
    pid = fy_test_start("fuyou-launch", more, log);
    unsetenv("FUYOU_TEST_OPT_DELAY_MS");
    unsetenv("FUYOU_TEST_METRICS_PENDING_MAX");
    assert_true(pid > 0);
    t0 = fy_test_now_s();
    while (fy_test_count_matches(metrics, "\"step\": ") <= atoi(FY_CHAOS_STEPS) &&
           fy_test_now_s() - t0 < 60)
        fy_test_pause_ms(5);
    fill_up(mnt, filler);
    status = fy_test_wait(pid, 240);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    assert_true(fy_test_file_contains(log, "test hook: training stops once more than 1000 bytes "
                                           "of metrics lines wait for room"));
    char *text = fy_test_slurp(log, NULL), *at = strstr(text, "metrics lines of committed steps (");
    assert_non_null(at);
    int lost_from = atoi(at + strlen("metrics lines of committed steps (")), lost_to;
    at = strstr(at, " to ");
    assert_non_null(at);
    lost_to = atoi(at + strlen(" to "));
    free(text);
    printf("chaos: the run directory full again: the run stopped at step %d; the lines of steps "
           "%d to %d are lost\n", lost_to, lost_from, lost_to);
    assert_true(lost_from > atoi(FY_CHAOS_STEPS) && lost_to >= lost_from + 1 && lost_to < 60);
    assert_true(fy_test_file_contains(log, fy_test_fmt(
        "metrics lines (steps %d to %d) wait in memory for room on its file system (No space left "
        "on device), more than the 1000 B kept: training stopped at step %d, which is committed; "
        "free space on the file system of %s, then continue with fuyou-launch resume %s",
        lost_from, lost_to, lost_to, run, run)));
    assert_true(fy_test_file_contains(log, fy_test_fmt(
        "%d metrics lines of committed steps (%d to %d) could not be written (No space left on "
        "device) and are lost", lost_to - lost_from + 1, lost_from, lost_to)));
    /* The run log: at exit the launcher tries its refused lines once more. As the workers exit
     * ext4 may hand back blocks it had reserved (delayed allocation), so whether they then fit is
     * the filesystem's: either the exit says how many the log lacks (as test_log's
     * test_lines_lacking_at_exit checks whatever the filesystem), or every line went in, the
     * last ones too. */
    if (fy_test_count_matches(log, fy_test_fmt("the run log %s lacks ", runlog)) > 0)
        assert_true(fy_test_file_contains(log, " of this process (No space left on device): "
                                               "stderr has "));
    else
        assert_true(fy_test_file_contains(runlog, "could not be written (No space left on device) "
                                                  "and are lost"));
    fy_chaos_assert_nothing_left(run);
    free_up(filler);
    assert_int_equal(fy_test_launch_in(c->f, more, 300), 0);
    assert_true(fy_test_file_contains(c->f->log, fy_test_fmt("starting at step %d", lost_to)));
    assert_true(steps_in_order(metrics, 1, 60, lost_from, lost_to));
    fy_chaos_assert_nothing_left(run);
    assert_int_equal(run_cmd(fy_test_fmt("umount '%s'", mnt)), 0);
    mounted[0] = 0;
}

static void put32(uint8_t *b, int slot, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[4 * slot + i] = (uint8_t)(v >> (8 * i));
}

/* The store as versions of Fuyou from before commit records made it, in place of the one init
 * made for `model`: its version 1 metadata block (slots 0..12 as a commit record's, the checksum
 * in slot 13, slot 29 the flag of state written past the last sync) and one copy of each unit's
 * state, no commit record. */
static void make_pre_commit_store(const struct fy_chaos_paths *rp,
                                  const struct fy_model_config *model, uint64_t step)
{
    const char *paths[1] = {rp->store};
    struct fy_store_opts o = {.paths = paths, .npaths = 1, .create = 1, .overwrite = 1};
    struct fy_store *s = NULL;
    assert_int_equal(fy_store_open(&s, &o), 0);
    assert_int_equal(fy_store_add_extent(s, FY_TENSOR_META, FY_CKPT_BLOCK), 0);
    for (unsigned u = 0; u < fy_model_unit_count(model); u++)
        assert_int_equal(fy_store_add_extent(s, FY_TENSOR_UNIT_STATE(u),
                                             fy_optstate_bytes(model, u)), 0);
    struct fy_extent e;
    assert_int_equal(fy_store_find(s, FY_TENSOR_META, &e), 0);
    fy_store_destroy(&s);
    uint8_t block[FY_CKPT_BLOCK] = {0};
    uint64_t hash = fy_model_config_hash(model);
    const uint32_t v[13] = {FY_STOREMETA_MAGIC, 1, model->n_layer, model->n_head, model->n_embd,
                            model->vocab, model->ctx, (uint32_t)hash, (uint32_t)(hash >> 32),
                            (uint32_t)step, 0, 5, 0};
    for (int i = 0; i < 13; i++)
        put32(block, i, v[i]);
    uint32_t h = 2166136261u; /* FNV-1a of slots 0..12 */
    for (int i = 0; i < 4 * 13; i++)
        h = (h ^ block[i]) * 16777619u;
    put32(block, 13, h);
    put32(block, 29, 1);
    int fd = open(rp->data, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, block, sizeof block,
                            (off_t)(FY_STORE_HEADER_BYTES + e.logical_offset)),
                     (ssize_t)sizeof block);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* A store made before commit records is refused by training, resume and export with one line that
 * says what it is and what to do (after the io worker's lines about the absent commit records);
 * nothing of its state is written (train's profile may add a scratch extent after it), no export
 * made. The run trained once before (as a run of that version did), so resume has a command. */
static void test_pre_commit_store_refused(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "precommit");
    char *first = fy_test_in(c->f, "precommit-first.fywt");
    assert_int_equal(fy_chaos_train_to(c, rp.run, "1", first), 0);
    unlink(first);
    static struct fy_storemeta m;
    assert_true(newest_record(rp.store, &m) >= 0);
    make_pre_commit_store(&rp, &m.model, 12);
    size_t data_len, now_len;
    char *data = fy_test_slurp(rp.data, &data_len);
    assert_non_null(data);
    const char *said = "a store made by a version of Fuyou from before commit records (it has a "
                       "version 1 metadata block), which this version no longer reads: train or "
                       "export it with the Fuyou build that made it, or initialise the run again";
    assert_int_not_equal(fy_chaos_train_to(c, rp.run, "15", rp.out), 0);
    assert_true(fy_test_file_contains(c->f->log, said));
    const char *resume[] = {"resume", rp.run, NULL};
    assert_int_not_equal(fy_test_launch_in(c->f, resume, 60), 0);
    assert_true(fy_test_file_contains(c->f->log, said));
    const char *exp[] = {"export", "--run-dir", rp.run, "--out", rp.out, NULL};
    assert_int_not_equal(fy_test_launch_in(c->f, exp, 60), 0);
    assert_true(fy_test_file_contains(c->f->log, said));
    assert_int_equal(fy_test_count_matches(c->f->log, said), 1); /* said once */
    assert_int_not_equal(access(rp.out, F_OK), 0);
    char *now = fy_test_slurp(rp.data, &now_len);
    assert_non_null(now);
    assert_true(now_len >= data_len);
    assert_memory_equal(now, data, data_len);
    fy_chaos_assert_nothing_left(rp.run);
    free(data);
    free(now);
}

/* ---- packed documents ---- */

/* The pid of a worker of the run (RUN/workers.pid), or -1. */
static int worker_pid(const char *run, const char *name)
{
    FILE *f = fopen(fy_test_fmt("%s/workers.pid", run), "r");
    if (f == NULL)
        return -1;
    char have[32];
    int pid, found = -1;
    while (fscanf(f, "%31s %d", have, &pid) == 2)
        if (strcmp(have, name) == 0)
            found = pid;
    fclose(f);
    return found;
}

/* Waits (at most a minute) until the metrics file holds more than `lines` steps' lines. */
static void wait_past(const char *metrics, int lines)
{
    double t0 = fy_test_now_s();
    while (fy_test_count_matches(metrics, "\"step\": ") <= lines && fy_test_now_s() - t0 < 60)
        fy_test_pause_ms(5);
}

/* Packed documents over two epochs (--epochs 2, a commit every 3 steps): the gpu worker killed
 * twice and the launcher killed twice (then resumed), each in the middle of an epoch, end with the
 * losses and weights of an undisturbed packed run, bit for bit: each step's batch is its own. */
static void test_packed_documents_killed(void **state)
{
    struct fy_chaos *c = *state;
    const char *docs = fy_test_docs_data(c->f, FY_CHAOS_SAMPLE_TEXT, 100);
    assert_non_null(docs);
    char *ref = fy_test_in(c->f, "packed-ref"), *ref_out = fy_test_in(c->f, "packed-ref.fywt");
    fy_chaos_init_model(c->f, ref);
    const char *args[48];
    fy_chaos_train_args(args, ref, docs, "1", ref_out, NULL);
    assert_string_equal(args[5], "--steps");
    args[5] = "--epochs"; /* in place of --steps */
    args[6] = "2";
    assert_int_equal(fy_test_launch_in(c->f, args, 300), 0);
    assert_true(fy_test_file_contains(c->f->log, "batches: documents packed whole"));
    char *ref_losses = fy_chaos_losses(fy_test_fmt("%s/metrics.jsonl", ref));
    size_t ref_len;
    char *ref_weights = fy_test_slurp(ref_out, &ref_len);
    assert_non_null(ref_weights);
    int steps = fy_test_count_matches(fy_test_fmt("%s/metrics.jsonl", ref), "\"step\": ");
    assert_true(steps >= 20);

    struct fy_chaos_paths rp = fy_chaos_new_run(c, "packed");
    args[2] = rp.run;
    assert_string_equal(args[23], "--export");
    args[24] = rp.out;
    const char *resume[] = {"resume", rp.run, NULL};
    unlink(rp.log);
    int pid = fy_test_start("fuyou-launch", args, rp.log), gpu_kills = 0, launcher_kills = 0;
    assert_true(pid > 0);
    uint64_t seed = 40;
    int status = -1;
    for (int round = 0; round < 4; round++) {
        wait_past(rp.metrics, (round + 1) * steps / 5);
        fy_test_pause_ms((int)(fy_test_rand(&seed) % 40)); /* somewhere in a step */
        if (round % 2 == 0) { /* a worker: the launcher restarts it from the last commit */
            int victim = worker_pid(rp.run, "gpu");
            if (victim > 0 && kill(victim, SIGKILL) == 0)
                gpu_kills++;
            continue;
        }
        assert_int_equal(kill(pid, SIGKILL), 0); /* the launcher: resumed */
        assert_true(fy_test_wait(pid, 30) != -1);
        launcher_kills++;
        pid = fy_test_start("fuyou-launch", resume, rp.log);
        assert_true(pid > 0);
    }
    status = fy_test_wait(pid, 300);
    assert_true(status != -1 && WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fy_test_file_contains(rp.log, "no such line: the log, to see why");
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(gpu_kills, 2);
    assert_int_equal(launcher_kills, 2);
    printf("chaos: packed documents, %d steps over 2 epochs: the gpu worker killed %d times and "
           "the launcher %d times (resumed), the same bits as undisturbed\n",
           steps, gpu_kills, launcher_kills);
    char *losses = fy_chaos_losses(rp.metrics);
    assert_string_equal(losses, ref_losses);
    size_t n;
    char *weights = fy_test_slurp(rp.out, &n);
    assert_non_null(weights);
    assert_int_equal(n, ref_len);
    assert_memory_equal(weights, ref_weights, n);
    fy_chaos_assert_nothing_left(rp.run);
    free(losses);
    free(weights);
    free(ref_losses);
    free(ref_weights);
}

int main(void)
{
    if (fy_chaos_start("test_chaos_store") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_run),
        cmocka_unit_test(test_relocated_run),
        cmocka_unit_test(test_damaged_state_and_records),
        cmocka_unit_test(test_both_commits_damaged),
        cmocka_unit_test(test_damage_found_while_training),
        cmocka_unit_test(test_export_damaged_commit),
        cmocka_unit_test(test_truncated_store),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_full_filesystem),
        cmocka_unit_test(test_run_directory_full),
        cmocka_unit_test(test_pre_commit_store_refused),
        cmocka_unit_test(test_state_pieces_killed_and_damaged),
        cmocka_unit_test(test_packed_documents_killed),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("chaos_store (integration)", run, wanted, fy_chaos_group_setup,
                                   group_teardown);
}
