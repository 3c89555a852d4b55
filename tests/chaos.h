/* What the fault-isolation tests share (test_chaos: processes killed and stopped, exports beside a
 * run; test_chaos_store: the store damaged, full or moved): the group's fixture and the undisturbed
 * run every other run of the group must end as, bit for bit; the train command of every run; a
 * run's paths; and the check that nothing of a run is left behind. It asserts with cmocka, so the
 * test programs link it and the benchmarks do not. */
#ifndef FY_CHAOS_H
#define FY_CHAOS_H

#include <stddef.h>
#include <stdint.h>

#include "tests/testutil.h"

#define FY_CHAOS_SAMPLE_TEXT "tests/fixtures/sample.txt"
/* The steps of the runs that must end as the undisturbed run does. */
#define FY_CHAOS_STEPS "48"

/* The group's scratch: the token file, and the losses and weights of the undisturbed run. */
struct fy_chaos {
    struct fy_test_fixture *f;
    const char *optim_state; /* init --optim-state of every run (NULL: init's default, fp32) */
    const char *state_piece; /* init --state-piece of every run (NULL: init's default) */
    const char *const *train_extra; /* more train options of every run (NULL: none) */
    char *ref_losses;
    char *ref_weights;
    size_t ref_len;
};

/* A run's directory (a model initialised there), its export, metrics, background log, and its
 * store's directory and data file. */
struct fy_chaos_paths {
    char run[512], out[600], metrics[600], log[600], store[600], data[700];
};

/* What a program's main does first: SIGCHLD to its default (waitpid must see the children,
 * whatever was inherited), the check that it runs from the repository root after make
 * (fuyou-launch built, the sample text there), and stdout line-buffered (the lines printed for
 * the record come in order with the launcher's). 0, or 1 after saying so, naming `program`. */
int fy_chaos_start(const char *program);

/* cmocka group setup and teardown: *state = a struct fy_chaos, its token file the sample text's. */
int fy_chaos_group_setup(void **state);
int fy_chaos_group_teardown(void **state);
/* The undisturbed run every other is compared with: each program's first test, which it names
 * test_reference_run. */
void fy_chaos_reference_run(void **state);
/* The same for c's runs: the undisturbed run, in the group's directory under `name`. */
void fy_chaos_reference_run_in(struct fy_chaos *c, const char *name);

/* init of the GPT every run here trains (2 layers of width 64, 2 heads, context 32, seed 5). */
void fy_chaos_init_model_with(struct fy_test_fixture *f, const char *run, const char *optim_state,
                              const char *state_piece);
void fy_chaos_init_model(struct fy_test_fixture *f, const char *run);
/* The same with --optim-state `optim_state` (NULL: none given). */
void fy_chaos_init_model_as(struct fy_test_fixture *f, const char *run, const char *optim_state);
/* The train command of every run here (run, token file, steps, export path), then `extra`
 * (NULL-terminated, may be NULL), into args (48 of them are enough). */
void fy_chaos_train_args(const char **args, const char *run, const char *data, const char *steps,
                         const char *out, const char *const *extra);
/* fy_chaos_train_args with c's train_extra before `extra`. */
void fy_chaos_run_args(const struct fy_chaos *c, const char **args, const char *run,
                       const char *steps, const char *out, const char *const *extra);
/* The "loss" values of a metrics file, one per line. */
char *fy_chaos_losses(const char *metrics);
/* Nothing of the run is left: no process, no pool in /dev/shm, no temporary file. */
void fy_chaos_assert_nothing_left(const char *run);
/* The pid of a worker of the run (RUN/workers.pid), or -1. */
int fy_chaos_worker_pid(const char *run, const char *name);
/* The "restarted in X s" times of a log, printed: how many, and their largest and mean. */
void fy_chaos_report_recoveries(const char *what, const char *log);
/* Kills (SIGKILL) the named worker of a training run (a new run `run_name` of the group's
 * directory, trained with c's options), `kills` times, each at a random moment (from `seed`) once
 * the run has made progress since the last kill; the run restarts it itself and must end as c's
 * undisturbed run, leaving nothing behind. */
void fy_chaos_kill_worker(struct fy_chaos *c, const char *name, const char *run_name, uint64_t seed,
                          int kills);
/* The paths of a run named `name` in the group's directory, with a model initialised there (in
 * c->optim_state and c->state_piece). */
struct fy_chaos_paths fy_chaos_new_run(struct fy_chaos *c, const char *name);
/* Starts the usual training run to FY_CHAOS_STEPS in the background (its output to rp->log, made
 * anew), with `extra` options (may be NULL) and, where delay_ms is given, every AdamW that much
 * slower (FUYOU_TEST_OPT_DELAY_MS: a test stops or damages it between steps); its pid. */
int fy_chaos_start_run(struct fy_chaos *c, const struct fy_chaos_paths *rp,
                       const char *const *extra, const char *delay_ms);
/* The run's losses and exported weights equal the undisturbed run's, bit for bit. */
void fy_chaos_assert_same_as_reference(const struct fy_chaos *c, const char *run, const char *out);
/* Trains `run` to `steps` with the usual settings; 0 or the exit code. */
int fy_chaos_train_to(struct fy_chaos *c, const char *run, const char *steps, const char *out);

#endif
