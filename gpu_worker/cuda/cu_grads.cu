/* Gradient sinks and a linear layer's gradients through one (contract: cu_grads.h). */
#include "gpu_worker/cuda/cu_grads.h"

/* Rows of a slice are a multiple of this, so every slice's operands stay 128-byte aligned. */
#define SLICE_ROWS_ALIGN 64

static int whole_take(void *ctx, size_t off, size_t n, float **dev)
{
    struct fy_cu_grads_whole *w = (struct fy_cu_grads_whole *)ctx;
    *dev = w->base + off;
    FY_CUDA(cudaMemsetAsync(*dev, 0, n * sizeof(float), w->stream), "zeroing gradients");
    return 0;
}

static int whole_put(void *ctx, size_t off, size_t n) { return 0; }

void fy_cu_grads_whole(struct fy_cu_grads *g, struct fy_cu_grads_whole *w, float *dparams,
                       cudaStream_t stream)
{
    w->base = dparams;
    w->stream = stream;
    *g = (struct fy_cu_grads){whole_take, whole_put, w, (size_t)-1};
}

/* Rows of w a slice holds: as many whole rows as a piece takes, a multiple of SLICE_ROWS_ALIGN
 * where that leaves any. */
static size_t slice_rows(int IN, size_t cap)
{
    size_t rows = cap / (size_t)IN;
    if (rows >= SLICE_ROWS_ALIGN)
        rows -= rows % SLICE_ROWS_ALIGN;
    return rows ? rows : 1;
}

size_t fy_cu_grads_linear_piece(int IN, int OUT, int bias_adjacent, int has_bias, size_t cap)
{
    size_t wn = (size_t)OUT * IN, whole = wn + (has_bias && bias_adjacent ? (size_t)OUT : 0);
    if (whole <= cap)
        return has_bias && !bias_adjacent && (size_t)OUT > whole ? (size_t)OUT : whole;
    size_t rows = slice_rows(IN, cap);
    size_t piece = (rows < (size_t)OUT ? rows : (size_t)OUT) * IN;
    return has_bias && (size_t)OUT > piece ? (size_t)OUT : piece;
}

int fy_cu_grads_linear(struct fy_cu_lt *lt, const struct fy_cu_grads *g, size_t w_off,
                       size_t b_off, bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w,
                       int N, int IN, int OUT, cudaStream_t stream)
{
    int has_bias = b_off != FY_CU_GRADS_NO_BIAS;
    size_t wn = (size_t)OUT * IN;
    int adjacent = has_bias && b_off == w_off + wn;
    if (dinp != NULL)
        FY_TRY(fy_cu_matmul_backward_input(lt, dinp, dout, w, N, IN, OUT, stream));
    float *p;
    if (wn + (adjacent ? (size_t)OUT : 0) <= g->piece_max) {
        size_t n = wn + (adjacent ? (size_t)OUT : 0);
        FY_TRY(g->take(g->ctx, w_off, n, &p));
        FY_TRY(fy_cu_matmul_backward_weight(lt, p, adjacent ? p + wn : NULL, dout, inp, N, IN,
                                            OUT, 0, OUT, stream));
        FY_TRY(g->put(g->ctx, w_off, n));
    } else {
        size_t rows = slice_rows(IN, g->piece_max);
        for (size_t r0 = 0; r0 < (size_t)OUT; r0 += rows) {
            size_t r = (size_t)OUT - r0 < rows ? (size_t)OUT - r0 : rows;
            FY_TRY(g->take(g->ctx, w_off + r0 * IN, r * IN, &p));
            FY_TRY(fy_cu_matmul_backward_weight(lt, p, NULL, dout, inp, N, IN, OUT, (int)r0,
                                                (int)r, stream));
            FY_TRY(g->put(g->ctx, w_off + r0 * IN, r * IN));
        }
        adjacent = 0; /* the bias alone, below */
    }
    if (!has_bias || adjacent)
        return 0;
    FY_TRY(g->take(g->ctx, b_off, (size_t)OUT, &p));
    FY_TRY(fy_cu_matmul_backward_bias(p, dout, N, OUT, OUT, stream));
    return g->put(g->ctx, b_off, (size_t)OUT);
}
