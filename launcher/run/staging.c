/* A run's new model built beside the previous one and put in place only when complete (see
 * staging.h): the staging directories, their removal after a failure or a killed init, and the
 * order of the renames that replace the previous model. */
#include "launcher/run/staging.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "io_worker/store.h"

/* The i-th path of a comma-separated list into out (empty items skipped, as the io worker skips
 * them); 0, or -ENOENT past the end. */
static int path_at(const char *list, unsigned i, char *out, size_t len)
{
    for (const char *p = list; *p != 0;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && i-- == 0) {
            snprintf(out, len, "%.*s", (int)n, p);
            return 0;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    return -ENOENT;
}

static void join(char *out, size_t len, const char *dir, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

/* The pid in a staging directory's name (prefix then digits), or -1 where it is not one. */
static long staging_pid(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] == 0)
        return -1;
    char *end;
    errno = 0;
    long pid = strtol(name + n, &end, 10);
    return *end == 0 && errno == 0 && pid > 0 ? pid : -1;
}

/* Whether the init that named a staging directory may still run: a process of that pid that is a
 * fuyou-launch and not a zombie (a killed init's pid may linger unreaped for a moment, or be
 * reused by another program). */
static int pid_alive(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    ssize_t got = fy_file_read_text(path, buf, sizeof buf, NULL);
    if (got < 0)
        return got == -ENOENT ? 0 : kill((pid_t)pid, 0) == 0 || errno == EPERM;
    const char *name = strchr(buf, '('), *end = strrchr(buf, ')');
    if (name == NULL || end == NULL || end < name || end[1] != ' ')
        return 1; /* unreadable: keep its directory */
    static const char self[] = "fuyou-launch";
    size_t len = (size_t)(end - name - 1);
    int ours = len == strlen(self) && strncmp(name + 1, self, len) == 0;
    return ours && end[2] != 'Z' && end[2] != 'X';
}

/* Removes, from dir, the staging directories (named prefix-PID) of inits that are no longer
 * running. */
static void remove_stale(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = staging_pid(e->d_name, prefix);
        if (pid < 0 || pid_alive(pid))
            continue;
        char path[PATH_MAX];
        join(path, sizeof path, dir, e->d_name);
        fy_remove_tree(path);
        fy_warn("init: removed %s, left by an init (pid %ld) that did not finish", path, pid);
    }
    closedir(d);
}

static void default_store(const char *run_dir, char *out, size_t len)
{
    snprintf(out, len, "%s/store", run_dir);
}

int fy_staging_check_target(const char *run_dir, const char *ssd, int overwrite)
{
    if (overwrite)
        return 0;
    char path[PATH_MAX], dir[PATH_MAX], store[PATH_MAX];
    join(path, sizeof path, run_dir, "model.conf");
    if (access(path, F_OK) == 0) {
        fy_error("%s exists: this run directory already has a model (pass --overwrite to replace "
                 "it and its store)",
                 path);
        return -EEXIST;
    }
    if (ssd == NULL)
        default_store(run_dir, store, sizeof store);
    const char *list = ssd != NULL ? ssd : store;
    for (unsigned i = 0; path_at(list, i, dir, sizeof dir) == 0; i++) {
        join(path, sizeof path, dir, FY_STORE_DATA_NAME);
        int there = access(path, F_OK) == 0;
        if (!there && i == 0) {
            join(path, sizeof path, dir, FY_STORE_INDEX_NAME);
            there = access(path, F_OK) == 0;
        }
        if (there) {
            fy_error("ssd path %s already holds a Fuyou store (%s): pass --overwrite to replace it "
                     "(its data is lost), or give another --ssd",
                     dir, path);
            return -EEXIST;
        }
    }
    return 0;
}

/* What this init staged, removed (the run's other files untouched). */
static void remove_staged(struct fy_staging *st)
{
    char dir[PATH_MAX];
    for (unsigned i = 0; path_at(st->store_stage, i, dir, sizeof dir) == 0; i++)
        fy_remove_tree(dir);
    if (st->dir[0] != 0)
        fy_remove_tree(st->dir);
    if (st->made_store[0] != 0)
        rmdir(st->made_store); /* only when empty: a store put in place stays */
    st->store_stage[0] = 0;
    st->dir[0] = 0;
    st->made_store[0] = 0;
}

int fy_staging_begin(struct fy_staging *st, const char *run_dir, const char *ssd)
{
    memset(st, 0, sizeof *st);
    snprintf(st->run_dir, sizeof st->run_dir, "%s", run_dir);
    /* the launcher made the run directory and its missing parents (launcher/cmd/main.c, which
     * removes them again if the init fails): it must be there */
    struct stat sb;
    FY_SYS(stat(run_dir, &sb), "run directory %s", run_dir);
    if (ssd == NULL) {
        default_store(run_dir, st->store, sizeof st->store);
        struct fy_made_dirs made;
        FY_TRY(fy_mkdirs(st->store, 0700, "the store's directory", &made));
        if (made.n > 0)
            snprintf(st->made_store, sizeof st->made_store, "%s", st->store);
    } else {
        snprintf(st->store, sizeof st->store, "%s", ssd);
    }
    char path[PATH_MAX];
    join(path, sizeof path, run_dir, "model.conf");
    st->had_model = access(path, F_OK) == 0;
    remove_stale(run_dir, FY_STAGING_RUN_PREFIX);
    char dir[PATH_MAX];
    for (unsigned i = 0; path_at(st->store, i, dir, sizeof dir) == 0; i++)
        remove_stale(dir, FY_STAGING_STORE_PREFIX);

    int rc = 0;
    snprintf(st->dir, sizeof st->dir, "%s/%s%d", run_dir, FY_STAGING_RUN_PREFIX, (int)getpid());
    if (mkdir(st->dir, 0700) != 0) {
        rc = -errno;
        fy_error("init: cannot create %s, where the new model is built: %s", st->dir,
                 strerror(-rc));
        st->dir[0] = 0;
    }
    join(st->hf_dir, sizeof st->hf_dir, st->dir, "hf");
    join(st->conf, sizeof st->conf, st->dir, "model.conf");
    size_t used = 0;
    for (unsigned i = 0; rc == 0 && path_at(st->store, i, dir, sizeof dir) == 0; i++) {
        int n = snprintf(st->store_stage + used, sizeof st->store_stage - used, "%s%s/%s%d",
                         i ? "," : "", dir, FY_STAGING_STORE_PREFIX, (int)getpid());
        if (n < 0 || (size_t)n >= sizeof st->store_stage - used) {
            st->store_stage[used] = 0;
            fy_error("init: the store's paths (%s) are too long to name a staging directory in "
                     "each (%d bytes at most in all): give shorter --ssd paths",
                     st->store, FY_CONFIG_VALUE_MAX - 1);
            rc = -ENAMETOOLONG;
            break;
        }
        const char *stage = st->store_stage + used + (i ? 1 : 0);
        if (mkdir(stage, 0700) != 0) {
            rc = -errno;
            fy_error("init: cannot create %s, where the new store is built: %s", stage,
                     strerror(-rc));
            st->store_stage[used] = 0;
            break;
        }
        used += (size_t)n;
    }
    if (rc < 0)
        remove_staged(st);
    return rc;
}

static int move(const char *from, const char *to)
{
    if (rename(from, to) == 0)
        return 0;
    int e = errno;
    fy_error("init: cannot rename %s to %s: %s", from, to, strerror(e));
    return -e;
}

/* The renames, in the order that keeps a crash from leaving a run that looks whole. */
static int put_in_place(struct fy_staging *st)
{
    char model_conf[PATH_MAX], old_conf[PATH_MAX], dir[PATH_MAX], stage[PATH_MAX];
    char from[PATH_MAX], to[PATH_MAX];
    join(model_conf, sizeof model_conf, st->run_dir, "model.conf");
    join(old_conf, sizeof old_conf, st->dir, "model.conf.old");
    /* 1. the run has no model from here on: the next use refuses a crash in between */
    int moved_conf = access(model_conf, F_OK) == 0;
    if (moved_conf) {
        FY_TRY(move(model_conf, old_conf));
        int rc = fy_fsync_dir(st->run_dir);
        if (rc < 0) {
            rename(old_conf, model_conf); /* nothing else changed */
            return rc;
        }
        st->touched = 1;
    }
    /* 2. the store's files, the first path's data file first */
    for (unsigned i = 0; path_at(st->store, i, dir, sizeof dir) == 0; i++) {
        path_at(st->store_stage, i, stage, sizeof stage);
        for (int k = 0; k < (i == 0 ? 2 : 1); k++) {
            const char *name = k == 0 ? FY_STORE_DATA_NAME : FY_STORE_INDEX_NAME;
            join(from, sizeof from, stage, name);
            join(to, sizeof to, dir, name);
            int rc = move(from, to);
            if (rc < 0 && i == 0 && k == 0 && moved_conf && rename(old_conf, model_conf) == 0)
                st->touched = 0; /* the previous model as it was */
            FY_TRY(rc);
            st->touched = 1;
        }
        FY_TRY(fy_fsync_dir(dir));
    }
    /* 3. RUN/hf: the previous one aside, the new one (an import's) in */
    join(from, sizeof from, st->run_dir, "hf");
    struct stat sb;
    if (lstat(from, &sb) == 0) {
        join(to, sizeof to, st->dir, "hf.old");
        FY_TRY(move(from, to));
    }
    if (lstat(st->hf_dir, &sb) == 0)
        FY_TRY(move(st->hf_dir, from));
    /* 4. what the previous model's training left goes with it: `resume` would run the old train
     * command on the new model, and report would chart the old run's metrics beside the new */
    static const char *const previous[] = {"train.args", "train.args.pending", "metrics.jsonl"};
    int gone = 0;
    for (size_t i = 0; i < sizeof previous / sizeof previous[0]; i++) {
        join(from, sizeof from, st->run_dir, previous[i]);
        if (lstat(from, &sb) != 0)
            continue;
        join(to, sizeof to, st->dir, previous[i]);
        FY_TRY(move(from, to));
        gone++;
    }
    if (gone > 0)
        fy_info("init: the previous model's train.args and metrics.jsonl went with it");
    /* 5. model.conf last: the run has its new model */
    FY_TRY(move(st->conf, model_conf));
    return fy_fsync_dir(st->run_dir);
}

int fy_staging_replace(struct fy_staging *st)
{
    /* Ctrl-C in the few renames would leave the run without a model: it waits for them */
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &mask, &old);
    /* the session that built the model has let go of the run directory: hold it again, so that no
     * other launch opens the run while its files change */
    char lock[PATH_MAX];
    join(lock, sizeof lock, st->run_dir, "launch.lock");
    int rc = 0, fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = -errno;
        fy_error("cannot open %s: %s", lock, strerror(-rc));
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        rc = -errno;
        if (rc == -EWOULDBLOCK) {
            fy_error("run directory %s is in use by another fuyou-launch: stop it or use another "
                     "--run-dir",
                     st->run_dir);
            rc = -EBUSY;
        } else {
            fy_error("cannot lock %s: %s", lock, strerror(-rc));
        }
    }
    if (rc == 0)
        rc = put_in_place(st);
    if (rc == 0)
        remove_staged(st);
    if (fd >= 0)
        close(fd);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

void fy_staging_abort(struct fy_staging *st)
{
    remove_staged(st);
    if (st->touched)
        fy_warn("init: the new model could not be put in place and %s has no model now (the "
                "previous one was partly replaced): run the init again with --overwrite",
                st->run_dir);
    else if (st->had_model)
        fy_warn("init: the new model's files were removed; the previous model of %s is intact "
                "(its model.conf, hf/ and store were not touched)",
                st->run_dir);
    else
        fy_warn("init: the new model's partly written files were removed; %s has no model",
                st->run_dir);
}

int fy_staging_explain_missing(const char *run_dir, const char *model_conf)
{
    DIR *d = opendir(run_dir);
    if (d == NULL)
        return 0;
    long pid = -1;
    char stage[PATH_MAX];
    struct dirent *e;
    while (pid < 0 && (e = readdir(d)) != NULL)
        if ((pid = staging_pid(e->d_name, FY_STAGING_RUN_PREFIX)) > 0)
            join(stage, sizeof stage, run_dir, e->d_name);
    closedir(d);
    if (pid < 0)
        return 0;
    if (pid_alive(pid)) {
        fy_error("%s: no model in this run directory yet: an init (pid %ld) is building it: wait "
                 "for it to finish",
                 model_conf, pid);
        return 1;
    }
    char old_conf[PATH_MAX];
    join(old_conf, sizeof old_conf, stage, "model.conf.old");
    if (access(old_conf, F_OK) == 0)
        fy_error("%s: no model in this run directory: an init --overwrite (pid %ld) stopped while "
                 "it replaced the previous model, which is no longer whole: run the init again "
                 "(fuyou-launch init --run-dir %s --overwrite ...)",
                 model_conf, pid, run_dir);
    else
        fy_error("%s: no model in this run directory: an init (pid %ld) stopped before it "
                 "finished: run the init again (fuyou-launch init --run-dir %s --overwrite ...)",
                 model_conf, pid, run_dir);
    return 1;
}
