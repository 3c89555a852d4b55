/* What the integration tests of GPT training through the real processes share (test_train,
 * test_placement, test_plan_cmd, test_clip): their fixture, a model made by init, the train command
 * with the settings every run uses, whether python3 is there, and the values a run's metrics.jsonl
 * holds. It asserts with cmocka, so the test programs link it and the benchmarks do not. */
#ifndef FY_TRAINUTIL_H
#define FY_TRAINUTIL_H

#include "tests/testutil.h"

/* A snapshot of the project's own docs and sources, fixed so the tests' loss bounds stay valid. */
#define FY_TRAINUTIL_SAMPLE_TEXT "tests/fixtures/sample.txt"

/* The training settings every run uses (the reference comparison needs them as numbers). */
#define FY_TRAINUTIL_BATCH 8
#define FY_TRAINUTIL_SEQ 32
#define FY_TRAINUTIL_LR 3e-3
#define FY_TRAINUTIL_WARMUP 20
#define FY_TRAINUTIL_STR_(x) #x
#define FY_TRAINUTIL_STR(x) FY_TRAINUTIL_STR_(x)

/* What a program's main does first: SIGCHLD to its default (waitpid must see the children,
 * whatever was inherited), and the check that it runs from the repository root after make
 * (fuyou-launch built, the sample text there). 0, or 1 after saying so, naming `program`. */
int fy_trainutil_start(const char *program);

/* cmocka setup and teardown: a fixture (fy_test_setup) whose token file is the sample text's. */
int fy_trainutil_setup(void **state);
int fy_trainutil_teardown(void **state);
/* A test of these programs with that fixture (for their tables of tests). */
#define FY_TRAINUTIL_TEST(test) \
    cmocka_unit_test_setup_teardown(test, fy_trainutil_setup, fy_trainutil_teardown)

/* init of a GPT of 2 layers of width `embd` (2 heads, context 32) in `run`, seeded with `seed`. */
void fy_trainutil_init_model(struct fy_test_fixture *f, const char *run, const char *embd,
                             const char *seed);
/* train of `run` on `data` to `steps` with the settings above on the CPU backend and --cpu-mem 0
 * (every unit's state streamed through the store, the paths these tests are about: the default
 * would keep a tiny model's all in memory), exporting to export_path (unless NULL), in one process
 * where inprocess, then the options in `extra` (NULL-terminated; may be NULL: a --cpu-mem there
 * replaces the 0); the launcher's exit code. */
int fy_trainutil_train_with(struct fy_test_fixture *f, const char *run, const char *data,
                            const char *steps, const char *export_path, int inprocess,
                            const char *const *extra);
/* fy_trainutil_train_with with one more option (extra_flag and its value; NULL for none). */
int fy_trainutil_train(struct fy_test_fixture *f, const char *run, const char *data,
                       const char *steps, const char *export_path, int inprocess,
                       const char *extra_flag, const char *extra_value);

/* Whether python3 (with json) is there to check `what`; said, visibly, when it is not. */
int fy_trainutil_have_python(const char *what);

/* The values of one field (key: "\"loss\": ", say) of a metrics file, as text, one per line. */
char *fy_trainutil_field_values(const char *metrics, const char *key);
/* The "loss" values of a metrics file, as text, one per line. */
char *fy_trainutil_losses(const char *metrics);

/* A group of runs that must end with the same bits: the first run's export and losses, which every
 * later run of the group is compared with. */
struct fy_trainutil_same_bits {
    char *weights, *losses;
    size_t n;
};
/* Takes a run's export (w, n bytes) and losses (l): kept as the group's first, or compared with it
 * and freed. */
void fy_trainutil_same_bits_add(struct fy_trainutil_same_bits *group, char *w, size_t n, char *l);
void fy_trainutil_same_bits_free(struct fy_trainutil_same_bits *group);
/* The values of one field of a metrics file as numbers; returns how many (at most max). */
int fy_trainutil_field_numbers(const char *metrics, const char *key, double *out, int max);
/* The last "eval_loss" of a metrics file. */
double fy_trainutil_last_eval_loss(const char *metrics);

#endif
