/* One launch of the workers for a run directory: directory lock and stale cleanup (a dead run's
 * and dead readers' beside it), placement, pool, run.conf, workers started and supervised, and a
 * cleanup that runs on every path. */
#include "launcher/run/session.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/base/knobs.h"
#include "launcher/run/gpus.h"

/* Whether process pid was started with --run-dir naming run_dir (the same directory, however
 * written; a relative one from the process's working directory). */
static int started_for(int pid, const char *run_dir)
{
    char path[PATH_MAX + 64], args[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    ssize_t got = fy_file_read_text(path, args, sizeof args, NULL);
    if (got < 0)
        return 0;
    size_t n = (size_t)got;
    const char *dir = NULL;
    for (size_t i = 0; i < n && dir == NULL; i += strlen(args + i) + 1)
        if (strcmp(args + i, "--run-dir") == 0 && i + strlen(args + i) + 1 < n)
            dir = args + i + strlen(args + i) + 1;
    if (dir == NULL)
        return 0;
    if (dir[0] == '/')
        snprintf(path, sizeof path, "%s", dir);
    else
        snprintf(path, sizeof path, "/proc/%d/cwd/%s", pid, dir);
    struct stat a, b;
    return stat(path, &a) == 0 && stat(run_dir, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* Workers that a launcher killed outright left behind (RUN/workers.pid names them): they die with
 * it (PDEATHSIG), but one may still be finishing a request, so each still alive is killed and
 * waited for before a new session touches the store. A pid that now belongs to another program,
 * or to a worker of another run directory, is left alone. */
static void kill_orphaned_workers(const char *run_dir)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/workers.pid", run_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char name[32];
    int pid;
    while (fscanf(f, "%31s %d", name, &pid) == 2) {
        char exe[PATH_MAX + 32], link[PATH_MAX], want[64];
        snprintf(exe, sizeof exe, "/proc/%d/exe", pid);
        ssize_t n = readlink(exe, link, sizeof link - 1);
        if (pid <= 0 || n <= 0)
            continue; /* gone */
        link[n] = 0;
        snprintf(want, sizeof want, "/fuyou-%s-worker", name);
        if (strstr(link, want) == NULL || !started_for(pid, run_dir))
            continue; /* the pid belongs to another program, or another run, now */
        fy_warn("the %s worker (pid %d) of a launcher that died is still running: killing it", name,
                pid);
        kill(pid, SIGKILL);
        for (int i = 0; i < 500 && kill(pid, 0) == 0; i++) {
            struct timespec pause = {0, 10 * 1000000};
            nanosleep(&pause, NULL);
        }
    }
    fclose(f);
}

/* Takes the run directory's lock. The directory is there: made by the launcher for the commands
 * that make one (launcher/cmd/main.c, with its parents, removed again where they fail), required by
 * the others. */
static int lock_run_dir(const char *run_dir, int *lock_fd)
{
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
    return 0;
}

/* The run directory is ours while we hold its lock (taken here unless *lock_fd already holds it);
 * anything left in its ipc/ is stale. */
static int prepare_run_dir(const char *run_dir, int *lock_fd)
{
    char path[PATH_MAX + 32];
    if (*lock_fd < 0)
        FY_TRY(lock_run_dir(run_dir, lock_fd));
    kill_orphaned_workers(run_dir);
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

/* Readers: sessions of an export that work beside the launch holding the run directory (a
 * training run), or without the lock of a run directory on a read-only file system. A reader's
 * directory is made as RUN/.reader-PID (or $TMPDIR/.fuyou-reader-PID), locked (its launch.lock)
 * and only then renamed RUN/reader-PID ($TMPDIR/fuyou-reader-PID); its close removes everything
 * in it, the lock file last, before it lets the lock go. So a reader directory whose lock nobody
 * holds, while the file locked is still the one linked there, was left by an export that died,
 * whatever became of its pid. */

static int pid_alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

/* Appends ", text" (or text, the first) to the list in buf. */
static void list_add(char *buf, size_t len, const char *text)
{
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s%s", n ? ", " : "", text);
}

/* Removes the entries of dir other than directories and launch.lock, each named in `what` as
 * prefix + name. */
static void remove_files(const char *dir, const char *prefix, char *what, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            strcmp(e->d_name, "launch.lock") == 0)
            continue;
        char path[PATH_MAX + 300], named[300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(named, sizeof named, "%s%s", prefix, e->d_name);
        if (unlink(path) == 0) /* a directory fails (EISDIR) and stays, named by rmdir's failure */
            list_add(what, len, named);
    }
    if (d != NULL)
        closedir(d);
}

/* READERS/name (PREFIX-PID or .PREFIX-PID: reader-PID in a run directory, fuyou-reader-PID in
 * $TMPDIR) removed when it was left by an export that died: its workers still running killed, its
 * pool, sockets and files removed, then the directory; said in one line. A reader alive, being
 * made or closing is left alone. */
static void remove_stale_reader(const char *readers, const char *prefix, const char *name)
{
    int making = name[0] == '.';
    int pid = atoi(name + making + strlen(prefix));
    char dir[PATH_MAX + 300], lock[PATH_MAX + 320];
    snprintf(dir, sizeof dir, "%s/%s", readers, name);
    snprintf(lock, sizeof lock, "%s/launch.lock", dir);
    if (making && pid_alive(pid))
        return; /* being made: its lock may not be taken yet */
    int fd = open(lock, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) { /* a reader between removing its lock file and its directory, or one that died
                   * there */
        if (errno == ENOENT && !pid_alive(pid) && rmdir(dir) == 0)
            fy_warn("removed %s, left empty by an export that died (pid %d)", dir, pid);
        return;
    }
    struct stat held, linked;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &held) != 0 || stat(lock, &linked) != 0 ||
        held.st_dev != linked.st_dev || held.st_ino != linked.st_ino) {
        close(fd); /* in use, or removed meanwhile by its reader or another launch */
        return;
    }
    kill_orphaned_workers(dir);
    char what[2048] = "", pool[FY_POOL_NAME_MAX], ipc[PATH_MAX + 320];
    int rc = fy_pool_name_for_run(dir, pool, sizeof pool);
    if (rc == 0)
        rc = fy_pool_remove_stale_quietly(pool);
    if (rc < 0) { /* said; its owner alive, against all odds: leave it */
        close(fd);
        return;
    }
    if (rc == 1) {
        char shm[FY_POOL_NAME_MAX + 32];
        snprintf(shm, sizeof shm, "shared memory %s", pool);
        list_add(what, sizeof what, shm);
    }
    snprintf(ipc, sizeof ipc, "%s/ipc", dir);
    remove_files(ipc, "ipc/", what, sizeof what);
    if (rmdir(ipc) != 0 && errno != ENOENT)
        fy_warn("cannot remove %s: %s", ipc, strerror(errno));
    remove_files(dir, "", what, sizeof what);
    if (unlink(lock) == 0)
        list_add(what, sizeof what, "launch.lock");
    if (rmdir(dir) != 0 && errno != ENOENT)
        fy_warn("cannot remove %s: %s", dir, strerror(errno));
    close(fd);
    fy_warn("removed %s, left by an export that died (pid %d): %s", dir, pid, what);
}

/* Every reader directory PREFIX-PID in `readers` that an export which died left
 * (remove_stale_reader). */
static void remove_stale_readers(const char *readers, const char *prefix)
{
    DIR *d = opendir(readers);
    if (d == NULL)
        return; /* no run directory yet, so no reader */
    size_t n = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        const char *name = e->d_name + (e->d_name[0] == '.');
        if (strncmp(name, prefix, n) == 0 && name[n] >= '0' && name[n] <= '9' &&
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
            remove_stale_reader(readers, prefix, e->d_name);
    }
    closedir(d);
}

/* READERS/PREFIX-PID made (as above) and locked, its path into out; -errno (unsaid) where it
 * cannot be. */
static int make_reader_dir(const char *readers, const char *prefix, char *out, size_t len,
                           int *lock_fd)
{
    char making[PATH_MAX + 64], lock[PATH_MAX + 96];
    snprintf(making, sizeof making, "%s/.%s%d", readers, prefix, (int)getpid());
    snprintf(lock, sizeof lock, "%s/launch.lock", making);
    snprintf(out, len, "%s/%s%d", readers, prefix, (int)getpid());
    int fd = -1, rc = mkdir(making, 0700) == 0 || errno == EEXIST ? 0 : -errno;
    /* made now, or left by a dead reader of this pid: a directory of ours, not a link (in a shared
     * $TMPDIR another user's could have the name) */
    struct stat st;
    int ours = rc == 0 && lstat(making, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid();
    if (rc == 0 && !ours)
        rc = -EEXIST;
    if (rc == 0 && (fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
        rc = -errno;
    if (rc == 0 && flock(fd, LOCK_EX | LOCK_NB) != 0)
        rc = -errno;
    if (rc == 0 && rename(making, out) != 0)
        rc = -errno;
    if (rc == 0) {
        *lock_fd = fd;
        return 0;
    }
    if (ours) {
        unlink(lock);
        rmdir(making);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/* A reader's files and directory, removed at its close while it still holds its lock. */
static void remove_reader_dir(const char *dir)
{
    static const char *const files[] = {"run.conf", "launch.lock"};
    char path[PATH_MAX + 32];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    if (rmdir(dir) != 0 && errno != ENOENT)
        fy_warn("cannot remove %s: %s", dir, strerror(errno));
}

static int plan_affinity(struct fy_session *s, const char *spec, const char *ssd, int cpu_backend)
{
    char described[2048];
    FY_TRY(fy_topo_locate_ssd(s->topo, ssd));
    fy_topo_describe(s->topo, described, sizeof described);
    fy_info("topology: %s", described);
    if (cpu_backend)
        FY_TRY(fy_affinity_default_cpu_backend(s->topo, &s->aff));
    else
        FY_TRY(fy_affinity_default(s->topo, &s->aff));
    int explicit_spec = spec != NULL && strcmp(spec, "auto") != 0; /* auto: hwloc's placement */
    if (explicit_spec)
        FY_TRY(fy_affinity_parse(s->topo, spec, &s->aff));
    const char *how = "auto: hwloc, the gpu worker near the GPU";
    if (explicit_spec)
        how = "explicit: --affinity";
    else if (cpu_backend)
        how = s->aff.io_near_ssd ? "auto: hwloc, the gpu worker (CPU backend) on the opt worker's "
                                   "cores too, the io worker near the SSD"
                                 : "auto: hwloc, the gpu worker (CPU backend) on the opt worker's "
                                   "cores too";
    else if (s->aff.io_near_ssd)
        how = "auto: hwloc, the gpu worker near the GPU, the io worker near the SSD";
    fy_info("placement: gpu worker on cpus %s, io worker on %s, opt worker on %s (NUMA node %d) "
            "[affinity %s]",
            s->aff.gpu, s->aff.io, s->aff.opt, s->aff.numa_node, how);
    return 0;
}

/* Whether another launch holds the run directory's lock. */
static int run_dir_busy(const char *run_dir)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/launch.lock", run_dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int busy = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* releases it where taken */
    return busy;
}

/* Whether path is on a read-only file system (a read-only mount, a snapshot). */
static int on_read_only_fs(const char *path)
{
    struct statvfs fs;
    return statvfs(path, &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0;
}

/* The reader's own directory: RUN/reader-PID beside a training run, $TMPDIR/fuyou-reader-PID for
 * a read-only run directory (what readers that died left there removed first). */
static int open_reader_dir(struct fy_session *s, const struct fy_session_opts *o, const char *what)
{
    const char *readers = o->run_dir, *prefix = "reader-";
    if (s->read_only) {
        readers = fy_knob_tmpdir();
        prefix = "fuyou-reader-";
        remove_stale_readers(readers, prefix);
    }
    int rc = make_reader_dir(readers, prefix, s->run_dir, sizeof s->run_dir, &s->lock_fd);
    if (rc < 0 && s->read_only)
        fy_error("cannot make %s, where the %s keeps its files (%s is on a read-only file "
                 "system): %s; set TMPDIR to a writable directory",
                 s->run_dir, what, o->run_dir, strerror(-rc));
    else if (rc < 0)
        fy_error("cannot make %s, where the %s works beside the launch that holds %s: %s",
                 s->run_dir, what, o->run_dir, strerror(-rc));
    else if (s->read_only)
        fy_info("%s is on a read-only file system, where nothing can be training: the %s reads "
                "the store without the run directory's lock, its own files in %s (logging to "
                "stderr only)",
                o->run_dir, what, s->run_dir);
    else
        fy_info("%s is in use by another launch (a training run): the %s works beside it in %s, "
                "from the store's last commit",
                o->run_dir, what, s->run_dir);
    return rc;
}

int fy_session_open(struct fy_session *s, const struct fy_session_opts *o,
                    const struct fy_pool_region_spec *regions, unsigned n, const char *what)
{
    memset(s, 0, sizeof *s);
    s->lock_fd = -1;
    snprintf(s->run_dir, sizeof s->run_dir, "%s", o->run_dir);
    s->read_only = o->reader && on_read_only_fs(o->run_dir);
    snprintf(s->log_dir, sizeof s->log_dir, "%s", s->read_only ? "" : o->run_dir);
    if (!s->read_only)
        remove_stale_readers(o->run_dir, "reader-");
    int beside = o->reader && !s->read_only && run_dir_busy(o->run_dir);
    uint64_t pool_bytes = fy_pool_layout_size(regions, n);
    char need[32], cap[32];
    fy_format_size(pool_bytes, need, sizeof need);
    if (o->cpu_mem != 0 && pool_bytes > o->cpu_mem) {
        fy_format_size(o->cpu_mem, cap, sizeof cap);
        char parts[512] = "";
        for (unsigned i = 0; i < n; i++) {
            char one[32];
            fy_format_size(regions[i].bytes, one, sizeof one);
            snprintf(parts + strlen(parts), sizeof parts - strlen(parts), "%s%s %s", i ? ", " : "",
                     regions[i].name, one);
        }
        fy_error("plan does not fit: the shared pool for %s needs %s (%s; 2 MiB aligned) but "
                 "--cpu-mem is %s: raise --cpu-mem or make the model or batch smaller",
                 what, need, parts, cap);
        return -FY_EUSAGE;
    }
    s->beside = beside;
    if (beside || s->read_only)
        FY_TRY(open_reader_dir(s, o, what));
    FY_TRY(prepare_run_dir(s->run_dir, &s->lock_fd));
    FY_TRY(fy_pool_name_for_run(s->run_dir, s->pool_name, sizeof s->pool_name));
    FY_TRY(fy_topo_load(&s->topo));
    FY_TRY(plan_affinity(s, o->affinity, o->ssd, o->cpu_backend));
    struct fy_pool_opts po = {
        .topo = s->topo, .numa_node = s->aff.numa_node, .run_dir = s->run_dir};
    FY_TRY(fy_pool_create(&s->pool, s->pool_name, regions, n, &po));
    return 0;
}

int fy_session_start(struct fy_session *s, struct fy_config *cfg, const char *const *workers,
                     unsigned n, int ready_timeout_ms)
{
    char path[PATH_MAX + 32];
    FY_TRY(fy_chan_endpoint(s->run_dir, "ctl", s->endpoint, sizeof s->endpoint));
    FY_TRY(fy_config_set(cfg, "pool", s->pool_name));
    FY_TRY(fy_config_set(cfg, "endpoint", s->endpoint));
    FY_TRY(fy_config_set(cfg, "affinity.gpu", s->aff.gpu));
    FY_TRY(fy_config_set(cfg, "affinity.io", s->aff.io));
    FY_TRY(fy_config_set(cfg, "affinity.opt", s->aff.opt));
    uint64_t ranks = 1;
    FY_TRY(fy_config_get_u64(cfg, "train.ranks", 0, 1, &ranks));
    FY_REQUIRE(ranks >= 1 && ranks <= FY_GPUS_MAX, -EINVAL,
               "train.ranks = %llu: give 1 to %d gpu workers (--gpus)", (unsigned long long)ranks,
               FY_GPUS_MAX);
    s->ranks = (int)ranks;
    const char *backend = fy_config_get(cfg, "backend");
    int on_gpus = backend != NULL && strcmp(backend, "cuda") == 0;
    for (int r = 1; r < s->ranks; r++) {
        char key[32], name[16], near[256];
        fy_gpus_worker_name(r, name, sizeof name);
        snprintf(key, sizeof key, "affinity.%s", name);
        int found = on_gpus && fy_topo_gpu_cpus(s->topo, r, near, sizeof near) == 0;
        FY_TRY(fy_config_set(cfg, key, found ? near : s->aff.gpu));
    }
    if (s->log_dir[0] != 0) {
        snprintf(path, sizeof path, "%s/fuyou.log", s->log_dir);
        FY_TRY(fy_config_set(cfg, "log_file", path));
    }
    snprintf(path, sizeof path, "%s/run.conf", s->run_dir);
    FY_TRY(fy_config_save(cfg, path));
    FY_TRY(fy_chan_bind(&s->chan, s->endpoint, "launch"));
    FY_TRY(fy_sup_new(&s->sup, s->run_dir, s->chan));
    if (s->ranks > 1) {
        struct fy_exec x = fy_session_exec(s);
        FY_TRY(fy_gpus_new(&s->gpus, &x, s->ranks));
    }
    for (unsigned i = 0; i < n; i++) {
        FY_TRY(fy_sup_spawn(s->sup, workers[i]));
        for (int r = 1; r < s->ranks && strcmp(workers[i], "gpu") == 0; r++) {
            char name[16];
            fy_gpus_worker_name(r, name, sizeof name);
            FY_TRY(fy_sup_spawn(s->sup, name));
        }
    }
    snprintf(path, sizeof path, "%s/workers.pid", s->run_dir);
    FY_TRY(fy_sup_write_pids(s->sup, path));
    int pause_ms = fy_knob_test_start_pause_ms();
    if (pause_ms > 0) { /* a test hook: time to stop or kill a launch at its start */
        fy_info("test hook: the launch waits %d ms with its workers starting, or until a signal "
                "(FUYOU_TEST_START_PAUSE_MS)",
                pause_ms);
        fy_sup_pause(s->sup, pause_ms);
    }
    return fy_sup_wait_ready(s->sup, ready_timeout_ms);
}

static int64_t session_submit(void *ctx, const char *worker, struct fy_desc *req, unsigned n)
{
    return fy_sup_submit(ctx, worker, req, n, NULL);
}

static int session_wait(void *ctx, int64_t ticket, struct fy_desc *reply, int timeout_ms)
{
    return fy_sup_wait(ctx, ticket, reply, timeout_ms);
}

static int session_poll(void *ctx, int64_t ticket) { return fy_sup_poll(ctx, ticket); }

struct fy_exec fy_session_exec(struct fy_session *s)
{
    struct fy_exec x = {
        .ctx = s->sup, .submit = session_submit, .wait = session_wait, .poll = session_poll};
    return s->gpus != NULL ? fy_gpus_exec(s->gpus) : x;
}

int fy_session_close(struct fy_session *s, int rc)
{
    fy_gpus_destroy(&s->gpus);
    if (s->sup != NULL) {
        int stop_rc = fy_sup_stop(s->sup, 10000);
        if (rc == 0 && stop_rc < 0)
            rc = stop_rc;
        fy_sup_fault(s->sup, &s->fault);
        if (s->fault.stuck) {
            fy_error("run failed: the %s worker stopped answering and was killed (above); the "
                     "other workers were stopped",
                     s->fault.worker);
            rc = -ECHILD;
        } else if (s->fault.worker[0] != 0) {
            fy_error("run failed: the %s worker died (its exit is reported above); the other "
                     "workers were stopped",
                     s->fault.worker);
            rc = -ECHILD;
        } else if (fy_sup_interrupted(s->sup)) {
            rc = -EINTR;
        }
    }
    fy_sup_destroy(&s->sup);
    fy_chan_destroy(&s->chan);
    fy_pool_destroy(&s->pool);
    fy_topo_destroy(&s->topo);
    if (s->lock_fd >= 0) {
        cleanup_run_dir(s->run_dir);
        if (s->beside || s->read_only) /* the reader's directory, gone before its lock goes */
            remove_reader_dir(s->run_dir);
        close(s->lock_fd);
        s->lock_fd = -1;
    }
    s->beside = s->read_only = 0;
    return rc;
}
