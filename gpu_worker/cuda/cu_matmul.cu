/* The matrix products of the CUDA backend (cu_matmul.h) through cuBLASLt: the linear layers
 * y = x W^T + b forward and backward, and the strided-batched products attention needs. bf16
 * operands, fp32 accumulation (CUBLAS_COMPUTE_32F, fp32 alpha/beta), bf16 or fp32 results.
 *
 * Row-major on top of column-major. The project's matrices are row-major; cuBLASLt's are
 * column-major. A row-major R x C matrix with row stride C is, byte for byte, the column-major
 * C x R matrix with leading dimension C, i.e. its transpose. So a row-major product
 * D = op(X) op(Y) is computed as the column-major product D^T = op(Y)^T op(X)^T: the two operands
 * swap places and keep their transpose flags. The mapping of each call (m, n, k are cuBLASLt's: D
 * is m x n column-major, op(A) m x k, op(B) k x n; "A: r x c, ld" is the stored matrix before op):
 *
 *   forward  out[N][OUT] = inp[N][IN] W[OUT][IN]^T (+ bias):  out^T (OUT x N) = W (OUT x IN) inp^T,
 *            W's bytes read column-major being W^T (IN x OUT), hence transa = T
 *            A = W    transa = T, A: IN x OUT, lda = IN     m = OUT
 *            B = inp  transb = N, B: IN x N,   ldb = IN     n = N
 *            D = out  bf16,       D: OUT x N,  ldd = OUT    k = IN
 *            bias: CUBLASLT_EPILOGUE_BIAS adds bias[i] to row i of the column-major D (length m =
 *            OUT), i.e. to column o of the row-major output: exactly + b[o].
 *   dinp     dinp[N][IN] = dout[N][OUT] W[OUT][IN]:  dinp^T (IN x N) = W^T (IN x OUT) dout^T
 *            A = W    transa = N, A: IN x OUT, lda = IN     m = IN
 *            B = dout transb = N, B: OUT x N,  ldb = OUT    n = N
 *            D = dinp bf16,       D: IN x N,   ldd = IN     k = OUT
 *   dW       dW[OUT][IN] += dout^T inp:  dW^T (IN x OUT) = inp^T (IN x N) dout (N x OUT)
 *            A = inp  transa = N, A: IN x N,   lda = IN     m = IN
 *            B = dout transb = T, B: OUT x N,  ldb = OUT    n = OUT
 *            C = D = dW  fp32,    D: IN x OUT, ldd = IN     k = N,  beta = 1
 *   batched  C[M][N] = op(A) op(B), row-major, count of them:  C^T (N x M) = op(B)^T op(A)^T
 *            cuBLASLt A = the caller's B, transa = trans_b; stored N x K (trans_b: K x N)
 *            column-major, ld = N (trans_b: K)                 m = N
 *            cuBLASLt B = the caller's A, transb = trans_a; stored K x M (trans_a: M x K)
 *            column-major, ld = K (trans_a: M)                 n = M
 *            C = D: N x M, ld = N, bf16 or fp32, strided batch  k = K
 *
 * Determinism. An algorithm is chosen once per distinct problem (shape, transposes, leading
 * dimensions, types, epilogue, batch count and strides, alignment class of the pointers) with
 * cublasLtMatmulAlgoGetHeuristic and cached in the fy_cu_lt; every later call with that problem
 * runs the very same algorithm, so results are bitwise reproducible from call to call and run to
 * run on the same GPU model and cuBLAS version. Algorithms that split the k dimension are excluded:
 * the preference CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK is set to CUBLASLT_REDUCTION_SCHEME_NONE
 * (no split-K of any kind, so no inplace/atomic reductions and no separate reduction pass), and each
 * candidate's CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME is read back and must be NONE with
 * CUBLASLT_ALGO_CONFIG_SPLITK_NUM <= 1. The workspace is the caller's (user-owned), so concurrent
 * streams cannot make cuBLASLt pick a different internal workspace. The bias gradient is a kernel
 * of ours with a fixed summation order (no atomics).
 *
 * Alignment. Every pointer (operands, outputs, bias) and every batch stride in bytes should be a
 * multiple of 16 bytes: the alignment preferences are set to the actual alignment of each matrix
 * (pointer and batch stride), capped at 16, and that alignment class is part of the cache key.
 * So any 16-byte-aligned pointers get the same algorithm (results then depend on the shape only);
 * less aligned pointers still work, through slower algorithms chosen for them. Leading dimensions
 * that are multiples of 8 elements (16 bytes) allow the fast (TMA) kernels; other sizes work
 * through slower ones. The workspace should be 256-byte aligned (as cudaMalloc gives).
 *
 * Concurrency. One fy_cu_lt (its cache and its workspace) belongs to one host thread and one
 * stream at a time: calls through it on different streams would share the workspace. */
#include "gpu_worker/cuda/cu_matmul.h"

#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

/* One problem as cuBLASLt sees it (column-major, after the row-major mapping above). */
struct gemm {
    const char *what; /* which operation, for messages */
    cublasOperation_t transa, transb;
    int m, n, k;
    const void *a, *b;
    long long lda, ldb, ldc;
    long long stride_a, stride_b, stride_c; /* elements; used when count > 1 */
    int count;
    cudaDataType_t ctype; /* C and D; A and B are always bf16 */
    void *c;              /* D, and C unless cin is set */
    const void *cin;      /* C when it differs from D (a residual added with beta = 1) */
    float alpha, beta;
    const bf16 *bias; /* CUBLASLT_EPILOGUE_BIAS when not NULL */
    int gelu;         /* GELU (tanh) epilogue writing the pre-activation to aux */
    void *aux;        /* bf16, same shape and leading dimension as D */
};

/* What identifies a cached algorithm. Plain integers only, zeroed before filling (no padding
 * garbage), compared with memcmp. */
struct algo_key {
    int32_t transa, transb, m, n, k, count, ctype, bias, gelu, cin;
    int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
    uint32_t align_a, align_b, align_c, align_bias, align_cin, align_aux;
    uint64_t workspace_bytes;
};

struct algo_entry {
    struct algo_key key;
    cublasLtMatmulAlgo_t algo;
};

struct fy_cu_lt {
    cublasLtHandle_t handle;
    void *workspace;
    size_t workspace_bytes;
    struct algo_entry *cache;
    size_t n_cache, cap_cache;
};

static void gemm_describe(const struct gemm *g, char *buf, size_t size)
{
    snprintf(buf, size,
             "%s: cuBLASLt m=%d n=%d k=%d transa=%c transb=%c lda=%lld ldb=%lld ldc=%lld count=%d "
             "strides %lld/%lld/%lld, C/D %s, alpha %g beta %g, bias %s",
             g->what, g->m, g->n, g->k, g->transa == CUBLAS_OP_T ? 'T' : 'N',
             g->transb == CUBLAS_OP_T ? 'T' : 'N', g->lda, g->ldb, g->ldc, g->count, g->stride_a,
             g->stride_b, g->stride_c, g->ctype == CUDA_R_32F ? "f32" : "bf16", (double)g->alpha,
             (double)g->beta, g->bias ? "yes" : "no");
}

/* Checks a cuBLASLt status: logs the call, the problem, the status string and number (fy_error
 * adds file:line), returns -EIO. `g` may be NULL. */
#define FY_LT(call, g)                                                                             \
    do {                                                                                           \
        cublasStatus_t fy_lt_st_ = (call);                                                         \
        if (fy_lt_st_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            char fy_lt_what_[384] = "cuBLASLt";                                                    \
            if (g)                                                                                 \
                gemm_describe((g), fy_lt_what_, sizeof fy_lt_what_);                               \
            fy_error("%s: %s failed: %s (%s, status %d)", fy_lt_what_, #call,                      \
                     cublasLtGetStatusString(fy_lt_st_), cublasLtGetStatusName(fy_lt_st_),         \
                     (int)fy_lt_st_);                                                              \
            return -EIO;                                                                           \
        }                                                                                          \
    } while (0)

int fy_cu_lt_new(struct fy_cu_lt **out, void *workspace, size_t workspace_bytes)
{
    *out = NULL;
    if (workspace_bytes && !workspace) {
        fy_error("fy_cu_lt_new: %zu workspace bytes but no workspace pointer", workspace_bytes);
        return -EINVAL;
    }
    if ((uintptr_t)workspace % 256)
        fy_warn("fy_cu_lt_new: the cuBLASLt workspace %p is not 256-byte aligned", workspace);
    struct fy_cu_lt *lt = (struct fy_cu_lt *)calloc(1, sizeof *lt);
    if (!lt)
        return -ENOMEM;
    cublasStatus_t st = cublasLtCreate(&lt->handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fy_error("cublasLtCreate failed: %s (%s, status %d)", cublasLtGetStatusString(st),
                 cublasLtGetStatusName(st), (int)st);
        free(lt);
        return -EIO;
    }
    lt->workspace = workspace;
    lt->workspace_bytes = workspace_bytes;
    *out = lt;
    return 0;
}

void fy_cu_lt_destroy(struct fy_cu_lt **ltp)
{
    struct fy_cu_lt *lt = *ltp;
    if (!lt)
        return;
    cublasStatus_t st = cublasLtDestroy(lt->handle);
    if (st != CUBLAS_STATUS_SUCCESS)
        fy_error("cublasLtDestroy failed: %s (status %d)", cublasLtGetStatusString(st), (int)st);
    free(lt->cache);
    free(lt);
    *ltp = NULL;
}

/* Largest power of two, at most 16, dividing both the address and the batch stride in bytes. */
static uint32_t align_class(const void *p, long long stride_bytes, int count)
{
    uint64_t v = (uint64_t)(uintptr_t)p | (count > 1 ? (uint64_t)stride_bytes : 0) | 16u;
    return (uint32_t)(v & (~v + 1)); /* lowest set bit */
}

static size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

static const struct algo_entry *cache_find(const struct fy_cu_lt *lt, const struct algo_key *key)
{
    for (size_t i = 0; i < lt->n_cache; i++)
        if (!memcmp(&lt->cache[i].key, key, sizeof *key))
            return &lt->cache[i];
    return NULL;
}

/* The problem's operation descriptor: transposes, epilogue, bias and GELU's auxiliary output. */
static int gemm_op_desc(const struct gemm *g, cublasLtMatmulDesc_t op)
{
    FY_LT(cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F), g);
    int32_t ta = g->transa, tb = g->transb;
    FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), g);
    FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), g);
    uint32_t epi = g->gelu ? (g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                   : g->bias ? CUBLASLT_EPILOGUE_BIAS
                             : CUBLASLT_EPILOGUE_DEFAULT;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
        FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
              g);
    if (g->bias) {
        int32_t bias_type = CUDA_R_16BF;
        const void *bias = g->bias;
        FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                             sizeof bias_type),
              g);
        FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                             sizeof bias),
              g);
    }
    if (g->gelu) {
        const void *aux = g->aux;
        int64_t ld_aux = g->ldc;
        int32_t aux_type = CUDA_R_16BF;
        FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                             sizeof aux),
              g);
        FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux,
                                             sizeof ld_aux),
              g);
        FY_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                             &aux_type, sizeof aux_type),
              g);
    }
    return 0;
}

/* The layouts of A, B and C (D has C's), with the batch's count and strides. */
static int gemm_layouts(const struct gemm *g, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                        cublasLtMatrixLayout_t lc)
{
    const cudaDataType_t ab = CUDA_R_16BF;
    /* stored shapes of A and B (before op) */
    uint64_t a_rows = g->transa == CUBLAS_OP_N ? g->m : g->k;
    uint64_t a_cols = g->transa == CUBLAS_OP_N ? g->k : g->m;
    uint64_t b_rows = g->transb == CUBLAS_OP_N ? g->k : g->n;
    uint64_t b_cols = g->transb == CUBLAS_OP_N ? g->n : g->k;
    FY_LT(cublasLtMatrixLayoutInit(la, ab, a_rows, a_cols, g->lda), g);
    FY_LT(cublasLtMatrixLayoutInit(lb, ab, b_rows, b_cols, g->ldb), g);
    FY_LT(cublasLtMatrixLayoutInit(lc, g->ctype, (uint64_t)g->m, (uint64_t)g->n, g->ldc), g);
    if (g->count > 1) {
        int32_t count = g->count;
        int64_t sa = g->stride_a, sb = g->stride_b, sc = g->stride_c;
        FY_LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof count),
              g);
        FY_LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof count),
              g);
        FY_LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof count),
              g);
        FY_LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa,
                                               sizeof sa),
              g);
        FY_LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb,
                                               sizeof sb),
              g);
        FY_LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc,
                                               sizeof sc),
              g);
    }
    return 0;
}

/* What the algorithm cache knows a problem by: its shape, epilogue, leading dimensions, strides
 * and operand alignments. */
static void gemm_key(const struct fy_cu_lt *lt, const struct gemm *g, struct algo_key *key)
{
    memset(key, 0, sizeof *key);
    key->transa = g->transa;
    key->transb = g->transb;
    key->m = g->m;
    key->n = g->n;
    key->k = g->k;
    key->count = g->count;
    key->ctype = g->ctype;
    key->bias = g->bias != NULL;
    key->gelu = g->gelu;
    key->cin = g->cin != NULL;
    key->lda = g->lda;
    key->ldb = g->ldb;
    key->ldc = g->ldc;
    if (g->count > 1) {
        key->stride_a = g->stride_a;
        key->stride_b = g->stride_b;
        key->stride_c = g->stride_c;
    }
    key->align_a = align_class(g->a, g->stride_a * 2, g->count);
    key->align_b = align_class(g->b, g->stride_b * 2, g->count);
    key->align_c = align_class(g->c, g->stride_c * (long long)type_size(g->ctype), g->count);
    key->align_bias = g->bias ? align_class(g->bias, 0, 1) : 0;
    key->align_cin = g->cin ? align_class(g->cin, 0, 1) : 0;
    key->align_aux = g->gelu ? align_class(g->aux, 0, 1) : 0;
    key->workspace_bytes = lt->workspace_bytes;
}

/* Chooses the problem's algorithm through cuBLASLt's heuristic and caches it under key. */
static int algo_choose(struct fy_cu_lt *lt, const struct gemm *g, cublasLtMatmulDesc_t op,
                       cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                       cublasLtMatrixLayout_t lc, const struct algo_key *key,
                       cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulPreferenceOpaque_t pref_store;
    cublasLtMatmulPreference_t pref = &pref_store;
    FY_LT(cublasLtMatmulPreferenceInit(pref), g);
    uint64_t ws = lt->workspace_bytes;
    uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE; /* no split-K: see the top comment */
    FY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &ws, sizeof ws),
          g);
    FY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                               &reduction, sizeof reduction),
          g);
    FY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                               &key->align_a, sizeof key->align_a),
          g);
    FY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                               &key->align_b, sizeof key->align_b),
          g);
    uint32_t align_cin = g->cin ? key->align_cin : key->align_c;
    FY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                               &align_cin, sizeof align_cin),
          g);
    FY_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                               &key->align_c, sizeof key->align_c),
          g);

    enum { WANT = 8 };
    cublasLtMatmulHeuristicResult_t res[WANT];
    int got = 0;
    memset(res, 0, sizeof res);
    FY_LT(cublasLtMatmulAlgoGetHeuristic(lt->handle, op, la, lb, lc, lc, pref, WANT, res, &got),
          g);
    int pick = -1;
    /* Results come fastest first; take the first that is valid, fits the workspace and,
     * read back from its configuration, does not split k. */
    for (int i = 0; i < got && pick < 0; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > lt->workspace_bytes)
            continue;
        uint32_t scheme = 0;
        int32_t splitk = 1;
        size_t written = 0;
        FY_LT(cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo,
                                                   CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                   &scheme, sizeof scheme, &written),
              g);
        FY_LT(cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                   &splitk, sizeof splitk, &written),
              g);
        if (scheme != CUBLASLT_REDUCTION_SCHEME_NONE || splitk > 1)
            continue;
        pick = i;
    }
    if (pick < 0) {
        char what[384];
        gemm_describe(g, what, sizeof what);
        fy_error("%s: no deterministic cuBLASLt algorithm (%d candidates; alignment A %u B %u "
                 "C %u bias %u bytes, workspace %zu bytes)",
                 what, got, key->align_a, key->align_b, key->align_c, key->align_bias,
                 lt->workspace_bytes);
        return -EIO;
    }
    *algo = res[pick].algo;
    int32_t id = -1;
    uint32_t tile = 0;
    size_t written = 0;
    FY_LT(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                               &written),
          g);
    FY_LT(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                               sizeof tile, &written),
          g);
    if (lt->n_cache == lt->cap_cache) {
        size_t cap = lt->cap_cache ? 2 * lt->cap_cache : 32;
        struct algo_entry *c =
            (struct algo_entry *)realloc(lt->cache, cap * sizeof *lt->cache);
        if (!c)
            return -ENOMEM;
        lt->cache = c;
        lt->cap_cache = cap;
    }
    lt->cache[lt->n_cache].key = *key;
    lt->cache[lt->n_cache].algo = *algo;
    lt->n_cache++;
    fy_debug("%s m=%d n=%d k=%d count=%d: cuBLASLt algo %d tile %u (candidate %d of %d, "
             "workspace %zu of %zu, alignment A %u B %u C %u bias %u)",
             g->what, g->m, g->n, g->k, g->count, (int)id, (unsigned)tile, pick, got,
             res[pick].workspaceSize, lt->workspace_bytes, key->align_a, key->align_b,
             key->align_c, key->align_bias);
    return 0;
}

/* Runs one problem: builds the descriptors (on the stack: nothing to free), finds or chooses the
 * algorithm, calls cublasLtMatmul on the stream. */
static int lt_gemm(struct fy_cu_lt *lt, const struct gemm *g, cudaStream_t stream)
{
    cublasLtMatmulDescOpaque_t op_store;
    cublasLtMatmulDesc_t op = &op_store;
    FY_TRY(gemm_op_desc(g, op));
    cublasLtMatrixLayoutOpaque_t a_store, b_store, c_store;
    cublasLtMatrixLayout_t la = &a_store, lb = &b_store, lc = &c_store;
    FY_TRY(gemm_layouts(g, la, lb, lc));
    struct algo_key key;
    gemm_key(lt, g, &key);
    const struct algo_entry *hit = cache_find(lt, &key);
    cublasLtMatmulAlgo_t algo;
    if (hit)
        algo = hit->algo;
    else
        FY_TRY(algo_choose(lt, g, op, la, lb, lc, &key, &algo));
    FY_LT(cublasLtMatmul(lt->handle, op, &g->alpha, g->a, la, g->b, lb, &g->beta,
                         g->cin ? g->cin : g->c, lc, g->c, lc, &algo, lt->workspace,
                         lt->workspace_bytes, stream),
          g);
    return 0;
}

/* dbias[o] += sum over n of dout[n][o], in a fixed order: block x covers 32 columns; thread
 * (x, y) sums rows y, y + DB_ROWS, y + 2 DB_ROWS, ... in order; then thread y = 0 adds the
 * DB_ROWS partial sums in order y = 0, 1, ... and adds the total to dbias. The order depends only
 * on N, never on timing (no atomics), so it is bitwise reproducible. */
#define DB_COLS 32
#define DB_ROWS 16

/* Columns 0..cols-1 of dout, whose rows are ld apart (a slice of a wider matrix keeps its sums:
 * each column's order depends on N alone). */
__global__ void dbias_kernel(float *dbias, const bf16 *dout, int N, int cols, int ld)
{
    __shared__ float part[DB_ROWS][DB_COLS];
    int o = blockIdx.x * DB_COLS + threadIdx.x;
    float s = 0.0f;
    if (o < cols)
        for (int n = threadIdx.y; n < N; n += DB_ROWS)
            s += __bfloat162float(dout[(size_t)n * ld + o]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && o < cols) {
        float t = 0.0f;
        for (int y = 0; y < DB_ROWS; y++)
            t += part[y][threadIdx.x];
        dbias[o] += t;
    }
}

static int check_linear(const char *what, const void *out, const void *a, const void *b, int N,
                        int IN, int OUT)
{
    if (!out || !a || !b || N < 0 || IN <= 0 || OUT <= 0) {
        fy_error("%s: bad arguments (N=%d IN=%d OUT=%d, pointers %p %p %p)", what, N, IN, OUT, out,
                 a, b);
        return -EINVAL;
    }
    return 0;
}

int fy_cu_matmul_forward(struct fy_cu_lt *lt, bf16 *out, const bf16 *inp, const bf16 *w,
                         const bf16 *bias, int N, int IN, int OUT, cudaStream_t stream)
{
    return fy_cu_matmul_forward_ex(lt, out, inp, w, bias, NULL, NULL, N, IN, OUT, stream);
}

int fy_cu_matmul_forward_ex(struct fy_cu_lt *lt, bf16 *out, const bf16 *inp, const bf16 *w,
                            const bf16 *bias, const bf16 *residual, bf16 *gelu_pre, int N, int IN,
                            int OUT, cudaStream_t stream)
{
    if (residual && gelu_pre) {
        fy_error("fy_cu_matmul_forward_ex: a residual and a GELU epilogue together are not supported");
        return -EINVAL;
    }
    int rc = check_linear("fy_cu_matmul_forward", out, inp, w, N, IN, OUT);
    if (rc)
        return rc;
    if (N == 0)
        return 0;
    struct gemm g;
    memset(&g, 0, sizeof g);
    g.what = "matmul forward";
    g.transa = CUBLAS_OP_T;
    g.transb = CUBLAS_OP_N;
    g.m = OUT;
    g.n = N;
    g.k = IN;
    g.a = w;
    g.lda = IN;
    g.b = inp;
    g.ldb = IN;
    g.c = out;
    g.ldc = OUT;
    g.ctype = CUDA_R_16BF;
    g.count = 1;
    g.alpha = 1.0f;
    g.beta = residual ? 1.0f : 0.0f;
    g.cin = residual;
    g.bias = bias;
    g.gelu = gelu_pre ? 1 : 0;
    g.aux = gelu_pre;
    return lt_gemm(lt, &g, stream);
}

int fy_cu_matmul_backward_input(struct fy_cu_lt *lt, bf16 *dinp, const bf16 *dout,
                                const bf16 *w, int N, int IN, int OUT, cudaStream_t stream)
{
    FY_TRY(check_linear("fy_cu_matmul_backward_input", dinp, dout, w, N, IN, OUT));
    if (N == 0)
        return 0;
    struct gemm g;
    memset(&g, 0, sizeof g);
    g.what = "matmul backward dinp";
    g.transa = CUBLAS_OP_N;
    g.transb = CUBLAS_OP_N;
    g.m = IN;
    g.n = N;
    g.k = OUT;
    g.a = w;
    g.lda = IN;
    g.b = dout;
    g.ldb = OUT;
    g.c = dinp;
    g.ldc = IN;
    g.ctype = CUDA_R_16BF;
    g.count = 1;
    g.alpha = 1.0f;
    g.beta = 0.0f;
    return lt_gemm(lt, &g, stream);
}

int fy_cu_matmul_backward_weight(struct fy_cu_lt *lt, float *dw, float *dbias, const bf16 *dout,
                                 const bf16 *inp, int N, int IN, int OUT, int row0, int rows,
                                 cudaStream_t stream)
{
    FY_TRY(check_linear("fy_cu_matmul_backward_weight", dw, dout, inp, N, IN, OUT));
    if (row0 < 0 || rows <= 0 || row0 + rows > OUT) {
        fy_error("fy_cu_matmul_backward_weight: rows %d..%d of %d", row0, row0 + rows, OUT);
        return -EINVAL;
    }
    if (N == 0)
        return 0; /* nothing to add to dw and dbias */
    /* rows row0.. of dW take the columns row0.. of dout, whose rows stay OUT apart */
    struct gemm g;
    memset(&g, 0, sizeof g);
    g.what = "matmul backward dw";
    g.transa = CUBLAS_OP_N;
    g.transb = CUBLAS_OP_T;
    g.m = IN;
    g.n = rows;
    g.k = N;
    g.a = inp;
    g.lda = IN;
    g.b = dout + row0;
    g.ldb = OUT;
    g.c = dw;
    g.ldc = IN;
    g.ctype = CUDA_R_32F;
    g.count = 1;
    g.alpha = 1.0f;
    g.beta = 1.0f;
    FY_TRY(lt_gemm(lt, &g, stream));
    return dbias != NULL ? fy_cu_matmul_backward_bias(dbias, dout + row0, N, rows, OUT, stream)
                         : 0;
}

int fy_cu_matmul_backward_bias(float *dbias, const bf16 *dout, int N, int cols, int ld,
                               cudaStream_t stream)
{
    if (!dbias || !dout || N < 0 || cols <= 0 || ld < cols) {
        fy_error("fy_cu_matmul_backward_bias: bad arguments (N=%d cols=%d ld=%d)", N, cols, ld);
        return -EINVAL;
    }
    if (N == 0)
        return 0;
    dim3 block(DB_COLS, DB_ROWS);
    dbias_kernel<<<(unsigned)((cols + DB_COLS - 1) / DB_COLS), block, 0, stream>>>(dbias, dout, N,
                                                                                   cols, ld);
    FY_CUDA_LAUNCHED("dbias_kernel");
    return 0;
}

int fy_cu_matmul_backward(struct fy_cu_lt *lt, bf16 *dinp, float *dw, float *dbias,
                          const bf16 *dout, const bf16 *inp, const bf16 *w, int N, int IN, int OUT,
                          cudaStream_t stream)
{
    FY_TRY(check_linear("fy_cu_matmul_backward", dw, dout, inp, N, IN, OUT));
    if (dinp && !w) {
        fy_error("fy_cu_matmul_backward: dw %p, dinp %p with w %p", (void *)dw, (void *)dinp,
                 (const void *)w);
        return -EINVAL;
    }
    if (N == 0)
        return 0; /* dinp is empty; nothing to add to dw and dbias */
    if (dinp)
        FY_TRY(fy_cu_matmul_backward_input(lt, dinp, dout, w, N, IN, OUT, stream));
    return fy_cu_matmul_backward_weight(lt, dw, dbias, dout, inp, N, IN, OUT, 0, OUT, stream);
}

int fy_cu_matmul_batched(struct fy_cu_lt *lt, void *c, int c_f32, const bf16 *a, const bf16 *b,
                         int M, int N, int K, int trans_a, int trans_b, long long stride_a,
                         long long stride_b, long long stride_c, int count, float alpha,
                         float beta, cudaStream_t stream)
{
    if (!c || !a || !b || M < 0 || N < 0 || K <= 0 || count < 0 || stride_a < 0 || stride_b < 0 ||
        stride_c < 0) {
        fy_error("fy_cu_matmul_batched: bad arguments (M=%d N=%d K=%d count=%d strides %lld %lld "
                 "%lld)",
                 M, N, K, count, stride_a, stride_b, stride_c);
        return -EINVAL;
    }
    if (M == 0 || N == 0 || count == 0)
        return 0;
    struct gemm g;
    memset(&g, 0, sizeof g);
    g.what = "matmul batched";
    /* row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T: swap the operands */
    g.transa = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.transb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.m = N;
    g.n = M;
    g.k = K;
    g.a = b;
    g.lda = trans_b ? K : N; /* B row-major K x N (ld N), or N x K (ld K) when trans_b */
    g.b = a;
    g.ldb = trans_a ? M : K; /* A row-major M x K (ld K), or K x M (ld M) when trans_a */
    g.c = c;
    g.ldc = N;
    g.ctype = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    g.count = count;
    g.stride_a = stride_b;
    g.stride_b = stride_a;
    g.stride_c = stride_c;
    g.alpha = alpha;
    g.beta = beta;
    return lt_gemm(lt, &g, stream);
}
