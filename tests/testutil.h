/* Helpers shared by the test programs: temporary directories, deterministic random data,
 * the build's executables, and a way to skip visibly. */
#ifndef FY_TESTUTIL_H
#define FY_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/ipc/desc.h"
#include "common/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit code by which a whole test program reports that it skipped (as automake does). */
#define FY_TEST_SKIP 77

/* A fresh directory under $TMPDIR (or /tmp, which must support O_DIRECT); caller frees. */
char *fy_test_tmpdir(const char *tag);
/* rm -rf of a directory made by fy_test_tmpdir. */
void fy_test_rmdir(const char *path);
/* "dir/name" in one of 256 buffers used in turn, so a test can hold many paths at once. */
char *fy_test_path(const char *dir, const char *name);
/* Entries of a directory other than . and ..; -1 when it cannot be read. */
int fy_test_count_entries(const char *dir);
/* Runs `python3 SCRIPT run CMD...` (each command one argument, without single quotes) in one
 * process; the values of the "loss X" lines it prints go to losses[] in order (at most max), the
 * other lines to stderr. Returns how many, or -1 (said on stderr) when the script fails. */
int fy_test_python_run(const char *script, const char *const *commands, double *losses, int max);
/* printf into one of 16 buffers used in turn. */
const char *fy_test_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Runs fuyou-launch with args (NULL-terminated, without the program name) and its output in a fresh
 * log; returns its exit code, or -1 when it did not exit normally within `seconds`. */
int fy_test_launch(const char *log, const char *const *args, int seconds);
/* The scratch of an integration test that drives fuyou-launch: a fresh directory, the log every
 * launch rewrites (DIR/log), and a token file (DIR/data.tok). */
struct fy_test_fixture {
    char *dir;
    char log[512];
    char data[512];
};
/* A cmocka setup: *state = a fixture in a fresh directory tagged `tag`; with text != NULL,
 * `fuyou-launch prepare` makes the token file from that text file. Non-zero on failure. */
int fy_test_setup(void **state, const char *tag, const char *text);
/* The matching teardown: removes the directory and frees the fixture. */
int fy_test_teardown(void **state);
/* DIR/name (fy_test_path). */
char *fy_test_in(struct fy_test_fixture *f, const char *name);
/* DIR/docs.tok, a token file of documents: the first `lines` non-empty lines of the text file
 * `text`, each a JSON line's text field (prepare --jsonl, byte-level), so that train packs them as
 * documents. Its path, or NULL (said on stderr). */
const char *fy_test_docs_data(struct fy_test_fixture *f, const char *text, int lines);
/* fy_test_launch with the fixture's log. */
int fy_test_launch_in(struct fy_test_fixture *f, const char *const *args, int seconds);
/* Path of a built executable such as "fuyou-launch" ($BUILD/bin, default build/bin); static buffer. */
const char *fy_test_bin(const char *name);
/* splitmix64: a small deterministic generator for test data. */
uint64_t fy_test_rand(uint64_t *state);
/* Uniform float in [lo, hi). */
float fy_test_uniform(uint64_t *state, float lo, float hi);
/* Number of entries in /dev/shm whose name starts with prefix. */
int fy_test_count_shm(const char *prefix);
/* Number of processes, other than this one, whose command line (its arguments joined by spaces)
 * contains needle. */
int fy_test_count_processes(const char *needle);
/* Reads a whole file into a malloc'd NUL-terminated buffer; NULL on error. */
char *fy_test_slurp(const char *path, size_t *len);

/* CLOCK_MONOTONIC in seconds. */
double fy_test_now_s(void);
/* Sleeps ms milliseconds. */
void fy_test_pause_ms(int ms);

/* Starts build/bin/PROGRAM with args (NULL-terminated, without argv[0]), stdout and stderr appended
 * to log; returns the pid (or -1). */
int fy_test_start(const char *program, const char *const *args, const char *log);
/* Waits up to `seconds` for pid; returns its wait status, or -1 on timeout (the child is killed). */
int fy_test_wait(int pid, int seconds);
/* fy_test_start then fy_test_wait. */
int fy_test_run(const char *program, const char *const *args, const char *log, int seconds);
/* Runs `command` (a shell command line, output to log) in a mount namespace of its own where `ro`
 * is a read-only bind mount of `dir`: its exit status (128 + N for signal N), or -1, said on
 * stdout, where such a namespace cannot be made here (to skip). Root gets a private mount
 * namespace (unshare -m); another user a user namespace (unshare -rm), where the io worker's
 * registered pool needs RLIMIT_MEMLOCK (no CAP_IPC_LOCK there): 256 MiB of it, or -1. */
int fy_test_run_read_only(const char *dir, const char *ro, const char *command, const char *log);
/* 1 when the file contains needle; otherwise 0, and the file is printed to stderr to show why. */
int fy_test_file_contains(const char *path, const char *needle);
/* How many times needle occurs in the file (0 when it cannot be read). */
int fy_test_count_matches(const char *path, const char *needle);

/* Whether the test of this name is to run: FY_TEST_ONLY unset, or one of its comma-separated
 * globs matches it (to run a few tests of a program while working on them). */
int fy_test_wanted(const char *name);
/* Whether this runs under CI (CI=true), where a missing reference is a failure, not a skip. */
int fy_test_in_ci(void);
/* Newlines in s. */
int fy_test_count_lines(const char *s);
/* 1 when two model configs are the same, field by field (the struct has padding, which
 * assignments need not copy, so memcmp cannot tell). */
int fy_test_same_model(const struct fy_model_config *a, const struct fy_model_config *b);

/* Runs fn(arg) with stderr sent to a temporary file; *rc gets its result. Returns what was logged
 * (caller frees; also echoed to the real stderr), or NULL if the redirection failed. */
char *fy_test_capture_stderr(int (*fn)(void *), void *arg, int *rc);

/* "" when two descriptors are equal field by field, else the name of the first field that differs
 * (so assert_string_equal(fy_test_desc_diff(a, b), "") names it on failure). */
const char *fy_test_desc_diff(const struct fy_desc *a, const struct fy_desc *b);

#ifdef __cplusplus
}
#endif

#endif
