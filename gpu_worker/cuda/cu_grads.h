/* Where a block backward's weight gradients go, a piece at a time: a sink that hands out a device
 * buffer for each piece (a contiguous range of the unit's f32 gradient, in the unit's layout of
 * common/model/arch), zeroed, and takes it back once the piece's kernels are queued. cu_model's sink
 * downloads each piece while the backward goes on and reuses its buffer once it is home, so the
 * device never holds a whole block's f32 gradient; the whole-buffer sink (tests, benchmarks) hands
 * out ranges of one buffer. And a linear layer's weight and bias gradients through a sink: one piece
 * where it fits, else slices of whole rows. */
#ifndef FY_CU_GRADS_H
#define FY_CU_GRADS_H

#include <stddef.h>

#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_matmul.h"

struct fy_cu_grads {
    /* A buffer for the gradient of parameters [off, off + n) (n <= piece_max floats), zeroed on
     * the units' stream; -errno (said) on failure. */
    int (*take)(void *ctx, size_t off, size_t n, float **dev);
    /* The piece last taken has its kernels queued on the stream. */
    int (*put)(void *ctx, size_t off, size_t n);
    void *ctx;
    size_t piece_max; /* floats */
};

/* The most floats one piece may hold (256 MiB): a larger weight's gradient goes in slices of
 * rows. */
#define FY_CU_GRAD_PIECE_CAP ((size_t)64 << 20)

/* A sink over one device buffer of the unit's whole gradient (nothing is sliced: the bits of the
 * unsliced products). */
struct fy_cu_grads_whole {
    float *base;
    cudaStream_t stream;
};
void fy_cu_grads_whole(struct fy_cu_grads *g, struct fy_cu_grads_whole *w, float *dparams,
                       cudaStream_t stream);

/* No bias (b_off of fy_cu_grads_linear). */
#define FY_CU_GRADS_NO_BIAS ((size_t)-1)

/* A linear layer y = x w^T + b, w [OUT][IN] at w_off, b [OUT] at b_off (or FY_CU_GRADS_NO_BIAS):
 * dinp [N][IN] = dout w (NULL: skipped), then the gradients of w and b through the sink, from dout
 * [N][OUT] and inp [N][IN]. Where w's gradient (with b's right after it) fits one piece, one
 * product as fy_cu_matmul_backward computes it (the same bits); else slices of whole rows (each a
 * product of its own shape) and b's alone. */
int fy_cu_grads_linear(struct fy_cu_lt *lt, const struct fy_cu_grads *g, size_t w_off,
                       size_t b_off, bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w,
                       int N, int IN, int OUT, cudaStream_t stream);
/* The largest piece fy_cu_grads_linear takes for such a layer from a sink of piece_max `cap`. */
size_t fy_cu_grads_linear_piece(int IN, int OUT, int bias_adjacent, int has_bias, size_t cap);

#endif
