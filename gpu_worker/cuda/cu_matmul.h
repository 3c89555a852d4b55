/* Matrix products of the CUDA backend through cuBLASLt: bf16 operands, fp32 accumulation, bias,
 * GELU and residual epilogues where they fit. One algorithm is chosen per shape, once, and reused, so results
 * are identical from run to run; algorithms that reduce with atomics are excluded. */
#ifndef FY_CU_MATMUL_H
#define FY_CU_MATMUL_H

#include "gpu_worker/cuda/cu_common.h"

struct fy_cu_lt;

/* workspace: device memory for cuBLASLt (e.g. 32 MiB, from the arena). */
int fy_cu_lt_new(struct fy_cu_lt **out, void *workspace, size_t workspace_bytes);
void fy_cu_lt_destroy(struct fy_cu_lt **lt);

/* out [N][OUT] bf16 = inp [N][IN] @ w[OUT][IN]^T (+ bias[OUT] bf16 if not NULL). */
int fy_cu_matmul_forward(struct fy_cu_lt *lt, bf16 *out, const bf16 *inp, const bf16 *w,
                         const bf16 *bias, int N, int IN, int OUT, cudaStream_t stream);
/* dinp [N][IN] bf16 = dout @ w (overwritten; NULL: skipped); dw [OUT][IN] f32 += dout^T @ inp;
 * dbias [OUT] f32 += column sums of dout (NULL: skipped; reduced in a fixed order). */
int fy_cu_matmul_backward(struct fy_cu_lt *lt, bf16 *dinp, float *dw, float *dbias,
                          const bf16 *dout, const bf16 *inp, const bf16 *w, int N, int IN, int OUT,
                          cudaStream_t stream);
/* The backward in parts, for gradients computed a piece at a time: dinp [N][IN] bf16 = dout @ w
 * (overwritten); rows row0..row0+rows-1 of dW [OUT][IN] f32 += dout^T @ inp into dw, which points
 * at row row0's start, and the same columns' bias gradient into dbias (pointing at column row0;
 * NULL: skipped). A slice of rows is its own product, whose algorithm is chosen for its shape:
 * not necessarily the bits of the whole product. fy_cu_matmul_backward_bias: dbias [cols] f32 +=
 * column sums of dout [N][cols], rows ld apart, in the fixed order of every bias gradient (a
 * column's sum does not depend on the others). */
int fy_cu_matmul_backward_input(struct fy_cu_lt *lt, bf16 *dinp, const bf16 *dout,
                                const bf16 *w, int N, int IN, int OUT, cudaStream_t stream);
int fy_cu_matmul_backward_weight(struct fy_cu_lt *lt, float *dw, float *dbias, const bf16 *dout,
                                 const bf16 *inp, int N, int IN, int OUT, int row0, int rows,
                                 cudaStream_t stream);
int fy_cu_matmul_backward_bias(float *dbias, const bf16 *dout, int N, int cols, int ld,
                               cudaStream_t stream);
/* The forward with epilogues fused: out = inp @ w^T + bias + residual (residual NULL: none); or,
 * with gelu_pre != NULL, out = gelu_tanh(inp @ w^T + bias) and gelu_pre = the pre-activation (bf16,
 * [N][OUT]) for the backward. Not both. */
int fy_cu_matmul_forward_ex(struct fy_cu_lt *lt, bf16 *out, const bf16 *inp, const bf16 *w,
                            const bf16 *bias, const bf16 *residual, bf16 *gelu_pre, int N, int IN,
                            int OUT, cudaStream_t stream);
/* Batched products for attention, row-major, `count` independent problems with the given strides
 * (in elements): C[i] (M x N, bf16 or f32 per c_f32) = alpha * op(A[i]) @ op(B[i]) + beta * C[i],
 * where op(X) = X^T when the trans flag is set; A is M x K (K x M if trans_a), B is K x N (N x K if
 * trans_b). */
int fy_cu_matmul_batched(struct fy_cu_lt *lt, void *c, int c_f32, const bf16 *a, const bf16 *b,
                         int M, int N, int K, int trans_a, int trans_b, long long stride_a,
                         long long stride_b, long long stride_c, int count, float alpha,
                         float beta, cudaStream_t stream);

/* For callers: a product's failure said with what it was for, and returned. */
#define FY_MM(call, what)                                                                          \
    do {                                                                                           \
        int fy_mm_rc_ = (call);                                                                    \
        if (fy_mm_rc_) {                                                                           \
            fy_error("%s: fy_cu_matmul_batched failed (%d)", what, fy_mm_rc_);                     \
            return fy_mm_rc_;                                                                      \
        }                                                                                          \
    } while (0)

#endif
