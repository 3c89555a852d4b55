/* The whole GPT model for the tests that hold a backend against an outside reference
 * (tests/reference/gpt_ref.py in float64 numpy, tests/reference/gpt_torch.py in PyTorch): the
 * parameters of every unit, tokens and targets, the forward and backward of the whole model through
 * the backend interface as the gpu worker runs it, the references' file formats (documented at the
 * top of gpt_ref.py), and running a reference script as a child process. No cmocka here (the
 * benchmarks link this too): what can fail returns non-zero and says why. */
#ifndef FY_REFMODEL_H
#define FY_REFMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fy_backend;

enum { FY_REFMODEL_MAX_UNITS = 16 };

struct fy_refmodel {
    struct fy_model_config cfg;
    int B, T;
    unsigned n_units;
    size_t sizes[FY_REFMODEL_MAX_UNITS]; /* parameters per unit */
    float *params[FY_REFMODEL_MAX_UNITS];
    float *grads[FY_REFMODEL_MAX_UNITS]; /* the backend's, from fy_refmodel_forward_backward */
    double loss;                         /* the backend's */
    float *logits;                       /* the backend's, [B*T][V] */
    int32_t *tokens, *targets;           /* [B][T] */
    int32_t *positions;                  /* [B][T] documents (fy_refmodel_pack), or NULL: none */
    char err[512];                       /* why the last call that failed did */
};

/* A reference's output (gpt_ref.py's OUT format): the loss and every unit's gradient. */
struct fy_refmodel_output {
    double loss;
    double *grads[FY_REFMODEL_MAX_UNITS];
};

/* The family's init (fy_model_init_unit with seed), then noise on the parameters it sets to 0 or 1
 * so that their gradients, and the paths through them, are not trivial (GPT-2: every bias and
 * LayerNorm parameter; Llama: every RMSNorm weight; another family: every tensor its table
 * initialises to 0 or 1); then random tokens and targets, the target of sequence 1 position 3
 * ignored (-1: out of the mean, no gradient). All drawn from fy_test_rand seeded with seed. Needs
 * B >= 2 and T >= 4. 0, or -1 with m->err (and nothing to free). */
int fy_refmodel_init(struct fy_refmodel *m, const struct fy_model_config *cfg, int B, int T,
                     uint64_t seed);
void fy_refmodel_free(struct fy_refmodel *m);
/* Packs the rows with documents (gpu_worker/backend.h's positions): lengths drawn from 1 to
 * max_len with seed, the last cut at its row's end; each row's last document's last token (and
 * every single-token document: padding) gets target -1. The model's calls pass them from then on.
 * 0, or -1 with m->err. */
int fy_refmodel_pack(struct fy_refmodel *m, int max_len, uint64_t seed);
/* A small Llama for the GPU tests: 2 layers, 256 wide, 4 heads of 64 with 2 kv heads, MLP 344,
 * vocab 300, llama3 rope with an original context (8) below their T, so that every branch of its
 * scaling is used; the head tied to the embeddings or not. */
struct fy_model_config fy_refmodel_llama_small(int tied);

/* Forward and backward of the whole model on backend b (model_prepare for B x T first; m->positions
 * given to every embedding and block call), unit by unit as the gpu worker runs them: each block's input kept as its checkpoint, blocks recomputed in
 * their backward, the head's share of the wte gradient then the embedding backward accumulating
 * onto it. Fills m->loss, m->grads and m->logits (the backend's logits output on the head's input).
 * 0, or the failing call's code with m->err. */
int fy_refmodel_forward_backward(struct fy_refmodel *m, struct fy_backend *b);

/* Writes the model in gpt_ref.py's IN format (little-endian: see fy_refmodel_little_endian).
 * 0, or -1 with m->err. */
int fy_refmodel_write_input(struct fy_refmodel *m, const char *path);
/* Reads a reference's OUT file for this model into *out (fy_refmodel_output_free it). 0, or -1
 * with m->err (and nothing to free). */
int fy_refmodel_read_output(struct fy_refmodel *m, const char *path, struct fy_refmodel_output *out);
void fy_refmodel_output_free(const struct fy_refmodel *m, struct fy_refmodel_output *out);

/* 1 when this host is little-endian, as the references' file formats are. */
int fy_refmodel_little_endian(void);
/* 1 when python3 can import modules (a comma-separated list, such as "torch, numpy"). */
int fy_refmodel_python_has(const char *modules);
/* Path of tests/reference/NAME under $FUYOU_SRC, or under the working directory when that is unset,
 * into buf; 0 when it is readable, else -1. */
int fy_refmodel_script(const char *name, char *buf, size_t len);
/* ||a - ref|| / ||ref|| over n values (the plain norm of a - ref when ref is 0; infinite with a
 * NaN), printed on one line with `what`, n and the largest absolute difference. */
double fy_refmodel_rel_err(const float *a, const float *ref, size_t n, const char *what);
/* The number after `key` (such as "\"eval_loss\": ") on the line of step `step` of
 * RUN/metrics.jsonl, as fuyou-launch train reports it: 0, or -1 (said on stderr). */
int fy_refmodel_metric(const char *run, int step, const char *key, double *value);
/* Runs argv (argv[0] looked up in PATH), stdout and stderr passed through, for at most `seconds`
 * (then it is killed, with a message on stderr); its exit status, or -1. */
int fy_refmodel_run(char *const argv[], int seconds);

#ifdef __cplusplus
}
#endif

#endif
