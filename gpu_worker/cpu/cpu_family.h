/* What the CPU backend needs of a model family: one table of operations per family file, each
 * exported by its own file (gpt2_cpu.c, llama_cpu.c) and listed in cpu_backend.c under the registry
 * name of every family it computes (llama_cpu.c's serves the Llama-like families), where the
 * backend finds a model's table by its family's name (common/model/arch/arch.h) and computes through it
 * alone. The tensors of each unit lie as the family's tensor table says (common/model/arch/).
 *
 * Shapes: B sequences of T tokens; activations x, y, dx, dy are [B][T][n_embd], f32. Scratch is
 * one float array of the size the family gives for the batch, owned by the caller. "Overwritten"
 * outputs are written in full; "+=" ones are accumulated. */
#ifndef FY_CPU_FAMILY_H
#define FY_CPU_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/actplan.h"
#include "common/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fy_cpu_family {
    /* Optional: refuses (-ENOTSUP, said) a model of the family that the family's file does not
     * compute; NULL: every valid model of the family is computed. */
    int (*check)(const struct fy_model_config *c);
    /* Floats of scratch one block's forward or backward, and the head, need at B x T. */
    size_t (*block_scratch)(const struct fy_model_config *c, int B, int T);
    size_t (*head_scratch)(const struct fy_model_config *c, int B, int T);
    /* x = the embeddings of tokens (unit 0's parameters); tokens must be < vocab. positions
     * [B][T] (NULL: t) are those of gpu_worker/backend.h: learned positions are looked up there. */
    void (*embed_forward)(const struct fy_model_config *c, const float *embed,
                          const int32_t *tokens, const int32_t *positions, float *x, int B, int T);
    /* dembed += the gradient of the embedding unit (what the head left there, then this). */
    void (*embed_backward)(const struct fy_model_config *c, const int32_t *tokens,
                           const int32_t *positions, const float *dx, float *dembed, int B, int T);
    /* y = block(x); x and y do not overlap. positions (NULL: t): each token attends to the earlier
     * tokens of its own document, at its positions (RoPE). */
    void (*block_forward)(const struct fy_model_config *c, const float *params,
                          const int32_t *positions, const float *x, float *y, float *scratch, int B,
                          int T);
    /* Recomputes the block's internals from x, then back-propagates dy: dx and dparams (the block
     * unit's layout) overwritten. positions: those of the forward. */
    void (*block_backward)(const struct fy_model_config *c, const float *params,
                           const int32_t *positions, const float *x, const float *dy, float *dx,
                           float *dparams, float *scratch, int B, int T);
    /* The final unit with the LM head and the mean cross-entropy over the targets (a target < 0
     * is ignored); returns the loss. With dx != NULL also back-propagates: dx and dfinal (the
     * final unit's layout) overwritten, dembed (the embedding unit's layout) overwritten with the
     * head's share of its gradient, which embed_backward then adds to. */
    float (*head)(const struct fy_model_config *c, const float *final_params, const float *embed,
                  const float *x, const int32_t *targets, float *dx, float *dfinal, float *dembed,
                  float *scratch, int B, int T);
    /* logits [B*T][vocab] of the final unit and the head on x (head_scratch floats of scratch). */
    void (*logits)(const struct fy_model_config *c, const float *final_params, const float *embed,
                   const float *x, float *logits, float *scratch, int B, int T);

    /* Optional: NULL where the family does not support it. */

    /* Swapped internals (struct fy_block_saved): the blocks' internals are the kinds of
     * common/model/actplan.h, and saved holds FY_ACT_KINDS buffers (NULL for a kind not given) in the
     * layout fy_actplan_sizes_backend gives for "cpu". The forward copies each kind given out; the
     * backward takes each kind given instead of recomputing it (the same bits whatever is given)
     * and leaves it untouched. Otherwise as block_forward and block_backward. */
    void (*block_forward_saved)(const struct fy_model_config *c, const float *params,
                                const int32_t *positions, const float *x, float *y, float *scratch,
                                void *const *saved, int B, int T);
    void (*block_backward_saved)(const struct fy_model_config *c, const float *params,
                                 const int32_t *positions, const float *x, const float *dy,
                                 float *dx, float *dparams, float *scratch, void *const *saved,
                                 int B, int T);
    /* The per-op profile for the activation planner (needs the swapped internals above): the
     * seconds each forward op of a block takes, by the kind it produces, as the backward
     * recomputes it; and the floating-point operations of the op timed as FY_ACT_QKV, from which
     * the profile gives the compute rate. */
    void (*block_op_times)(const struct fy_model_config *c, const float *params, const float *x,
                           float *scratch, int B, int T, double op_s[FY_ACT_KINDS]);
    double (*qkv_flops)(const struct fy_model_config *c, int B, int T);
};

#ifdef __cplusplus
}
#endif

#endif
