/* make bench-gpu, our side: forward plus backward of a GPT with every weight resident on the GPU
 * (no host traffic), timed with events, reported as model TFLOP/s =
 * (6*N*B*T + 6*L*B*T^2*width) / time, twice: with every block's internals kept for the backward (as
 * PyTorch keeps them) and with each block recomputed from its input (activation checkpointing, what
 * a tight memory budget needs). With --profile, the time per kernel over one kept-activation step.
 *
 * --packed MIN-MAX: the rows are packed with documents of MIN..MAX tokens (lengths drawn from a
 * fixed seed, a row's leftover shorter than MIN left as padding: single-token documents), each
 * attending only to itself (gpu_worker/backend.h's positions); every timing is then printed for the
 * plain causal rows and for the packed ones side by side, with one block's forward + backward
 * alone, the fill (the documents' tokens over B x T) and packed / causal. The flash attention skips
 * the key blocks the documents' mask leaves empty, so a packed step should take no longer than a
 * causal one (the check: --seq 4096 --packed 256-1024). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#include "common/model/model.h"
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_gpt2_units.h"
#include "gpu_worker/cuda/cu_model.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_gpu: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_),  \
                    __FILE__, __LINE__);                                                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define OK(call)                                                                                   \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "bench_gpu: %s failed (%s:%d)\n", #call, __FILE__, __LINE__);         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static __global__ void fill_uniform(bf16 *p, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (seed + i) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z ^= z >> 31;
        p[i] = __float2bfloat16_rn(scale * ((float)(z >> 40) / 16777216.0f * 2.0f - 1.0f));
    }
}

static __global__ void fill_tokens(int32_t *p, size_t n, uint32_t vocab, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (seed + i) * 0xd1b54a32d192ed03ull;
        z ^= z >> 29;
        p[i] = (int32_t)(z % vocab);
    }
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes));
    return p;
}

/* The per-op table of one step (fy_cu_gpt2_timings) with each product's achieved rate. */
static void print_profile(const struct fy_cu_gpt2 *g, const struct fy_model_config *c, int B,
                          int T, int modes)
{
    const int L = (int)c->n_layer, C = (int)c->n_embd;
    const size_t N = (size_t)B * T, V = c->vocab;
    const struct fy_cu_gpt2_op *ops;
    int n = fy_cu_gpt2_timings(g, &ops);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += ops[i].ms;
    /* FLOPs per layer of the products, for achieved rates */
    double f_qkv = 2.0 * N * C * 3 * C, f_attn = 2.0 * N * C * C, f_fc = 2.0 * N * C * 4 * C;
    double f_sdpa = 4.0 * B * (double)T * T * C / 2; /* causal: QK^T and PV, half the matrix */
    double F = (modes & 2) ? L : 2.0 * L; /* forward runs: recomputing runs it twice */
    struct { const char *op; double flops; } rates[] = {
        {"matmul qkv fwd", f_qkv * F},
        {"matmul attn-proj fwd", f_attn * F},     {"matmul fc fwd", f_fc * F},
        {"matmul proj fwd", f_fc * F},            {"matmul qkv bwd", 2 * f_qkv * L},
        {"matmul attn-proj bwd", 2 * f_attn * L}, {"matmul fc bwd", 2 * f_fc * L},
        {"matmul proj bwd", 2 * f_fc * L},        {"attention fwd", f_sdpa * F},
        {"attention bwd", 2 * f_sdpa * L},
        {"head (logits, loss, grads)", 6.0 * N * C * V},
    };
    printf("profile of one step (each op bracketed by events; the sum %.1f ms exceeds the "
           "timed step by the serialisation):\n", sum);
    printf("  %-28s %10s %7s %10s\n", "op", "ms/step", "share", "TFLOP/s");
    for (int i = 0; i < n; i++) {
        double tf = 0;
        for (size_t k = 0; k < sizeof rates / sizeof rates[0]; k++)
            if (!strcmp(rates[k].op, ops[i].name))
                tf = rates[k].flops / (ops[i].ms * 1e-3) / 1e12;
        printf("  %-28s %10.2f %6.1f%% ", ops[i].name, ops[i].ms, 100.0 * ops[i].ms / sum);
        if (tf > 0)
            printf("%10.1f\n", tf);
        else
            printf("%10s\n", "-");
    }
}

int main(int argc, char **argv)
{
    struct fy_model_config c = {24, 16, 2048, 50304, 1024};
    int B = 16, T = 1024, iters = 5, warmup = 2, profile = 0, modes = 3; /* bit 1 kept, bit 0 recompute */
    int doc_min = 0, doc_max = 0; /* --packed: documents of doc_min..doc_max tokens */
    const char *name = "custom";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--layers")) c.n_layer = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--embd")) c.n_embd = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--heads")) c.n_head = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--vocab")) c.vocab = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--seq")) T = atoi(v), c.ctx = (uint32_t)T, i++;
        else if (!strcmp(a, "--batch")) B = atoi(v), i++;
        else if (!strcmp(a, "--iters")) iters = atoi(v), i++;
        else if (!strcmp(a, "--name")) name = v, i++;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--packed") && sscanf(v, "%d-%d", &doc_min, &doc_max) == 2 &&
                 doc_min >= 1 && doc_max >= doc_min)
            i++;
        else if (!strcmp(a, "--mode") && !strcmp(v, "kept")) modes = 2, i++;
        else if (!strcmp(a, "--mode") && !strcmp(v, "recompute")) modes = 1, i++;
        else if (!strcmp(a, "--mode") && !strcmp(v, "both")) modes = 3, i++;
        else {
            fprintf(stderr, "usage: bench_gpu [--name S] [--layers L] [--embd C] [--heads H] "
                            "[--vocab V] [--seq T] [--batch B] [--iters N] [--profile] "
                            "[--mode kept|recompute|both] [--packed MIN-MAX]\n");
            return 2;
        }
    }
    OK(fy_model_config_validate(&c));
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("bench_gpu: skipped: no usable CUDA device\n");
        return 0;
    }
    const int L = (int)c.n_layer, C = (int)c.n_embd;
    const size_t N = (size_t)B * T, NC = N * C, V = c.vocab;
    unsigned units = fy_model_unit_count(&c);
    /* resident weights, one bf16 buffer per unit */
    std::vector<bf16 *> w(units);
    for (unsigned u = 0; u < units; u++) {
        size_t n = fy_model_unit_params(&c, u);
        w[u] = (bf16 *)dev_alloc(n * sizeof(bf16));
        fill_uniform<<<1024, 256>>>(w[u], n, 1000 + u, 0.02f);
        CK(cudaGetLastError());
    }
    std::vector<bf16 *> act(L + 1);
    for (int l = 0; l <= L; l++)
        act[l] = (bf16 *)dev_alloc(NC * sizeof(bf16));
    bf16 *dact[2] = {(bf16 *)dev_alloc(NC * sizeof(bf16)), (bf16 *)dev_alloc(NC * sizeof(bf16))};
    float *dblock = (float *)dev_alloc(fy_model_unit_params(&c, 1) * sizeof(float));
    float *dembed = (float *)dev_alloc(fy_model_unit_params(&c, 0) * sizeof(float));
    float *dlnf = (float *)dev_alloc(2 * (size_t)C * sizeof(float));
    float *losses = (float *)dev_alloc(N * sizeof(float));
    int32_t *tokens = (int32_t *)dev_alloc(N * sizeof(int32_t));
    int32_t *targets = (int32_t *)dev_alloc(N * sizeof(int32_t));
    fill_tokens<<<256, 256>>>(tokens, N, c.vocab, 1);
    fill_tokens<<<256, 256>>>(targets, N, c.vocab, 2);
    CK(cudaDeviceSynchronize());
    /* one arena: the units' working buffers and one kept set of internals per block */
    size_t acts_bytes = fy_cu_gpt2_acts_bytes(&c, B, T);
    struct fy_cu_arena arena;
    size_t kept_bytes = (modes & 2) ? (size_t)L * acts_bytes : 0;
    OK(fy_cu_arena_init(&arena, fy_cu_model_arena_bytes(&c, B, T) + kept_bytes));
    struct fy_cu_model *m = NULL;
    OK(fy_cu_model_new(&m, &arena, &c, B, T));
    /* the model's GPT-2 units, driven on the device */
    struct fy_cu_gpt2 *g = (struct fy_cu_gpt2 *)fy_cu_model_units(m, &fy_cu_family_gpt2);
    if (g == NULL)
        return 1;
    std::vector<struct fy_cu_gpt2_acts> kept(L + 1);
    for (int l = 1; (modes & 2) && l <= L; l++)
        OK(fy_cu_gpt2_acts_take(g, &arena, &kept[l]));
    cudaStream_t s = fy_cu_model_stream(m);
    bf16 *wte = w[0], *wpe = w[0] + V * C;

    /* --packed: documents of doc_min..doc_max tokens, packed in order, a leftover shorter than
     * doc_min left as padding; the positions of each (gpu_worker/backend.h) and the fill */
    std::vector<int32_t> pos_host(N);
    size_t trained = 0;
    uint64_t draw = 0x9e3779b97f4a7c15ull;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T;) {
            draw ^= draw << 13, draw ^= draw >> 7, draw ^= draw << 17;
            int len = doc_max ? doc_min + (int)(draw % (uint64_t)(doc_max - doc_min + 1)) : T;
            if (len > T - t)
                len = T - t >= doc_min ? T - t : 1; /* the row's end, or padding */
            for (int p = 0; p < len; p++)
                pos_host[(size_t)b * T + t + p] = p;
            trained += len > 1 || doc_min <= 1 ? (size_t)len : 0;
            t += len;
        }
    int32_t *pos_dev = (int32_t *)dev_alloc(N * sizeof(int32_t));
    CK(cudaMemcpy(pos_dev, pos_host.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));

    auto step = [&](int keep, const int32_t *pos) {
        OK(fy_cu_gpt2_embed_forward(g, wte, wpe, tokens, pos, act[0]));
        for (int l = 1; l <= L; l++)
            OK(fy_cu_gpt2_block_forward(g, w[l], pos, act[l - 1], act[l], keep ? &kept[l] : NULL));
        OK(fy_cu_gpt2_head(g, w[L + 1], wte, act[L], targets, losses, dact[0], dlnf, dembed, 0));
        int cur = 0;
        for (int l = L; l >= 1; l--) {
            OK(fy_cu_gpt2_block_backward(g, w[l], pos, act[l - 1], dact[cur], dact[cur ^ 1], dblock,
                                         keep ? &kept[l] : NULL));
            cur ^= 1;
        }
        OK(fy_cu_gpt2_embed_backward(g, tokens, pos, dact[cur], dembed, dembed + V * C));
    };
    /* one block's forward and backward from its kept internals */
    auto block_step = [&](const int32_t *pos) {
        OK(fy_cu_gpt2_block_forward(g, w[1], pos, act[0], act[1], &kept[1]));
        OK(fy_cu_gpt2_block_backward(g, w[1], pos, act[0], dact[0], dact[1], dblock, &kept[1]));
    };
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* the median of iters timed runs of f after warmup untimed ones */
    auto timed = [&](auto f) {
        for (int i = 0; i < warmup; i++)
            f();
        CK(cudaStreamSynchronize(s));
        std::vector<float> times;
        for (int i = 0; i < iters; i++) {
            CK(cudaEventRecord(e0, s));
            f();
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        return times[times.size() / 2];
    };
    double params = (double)fy_model_total_params(&c);
    double flops = 6.0 * params * B * T + 6.0 * L * (double)B * T * T * C;
    for (int packed = 0; packed <= (doc_max > 0); packed++) {
        const int32_t *pos = packed ? pos_dev : NULL;
        float step_ms[2] = {0, 0};
        for (int keep = 1; keep >= 0; keep--) {
            if (!(modes & (keep ? 2 : 1)))
                continue;
            float ms = timed([&] { step(keep, pos); });
            step_ms[keep] = ms;
            printf("%-7s %-6s L=%d C=%d NH=%u B=%d T=%d V=%zu params=%.3fB  fwd+bwd %.1f ms "
                   "(median of %d)  %.1f TFLOP/s  arena %.1f GiB (%s)%s\n",
                   keep ? "fuyou" : "fuyou-r", name, L, C, c.n_head, B, T, V, params / 1e9, ms,
                   iters, flops / (ms * 1e-3) / 1e12,
                   (double)(keep ? arena.size : arena.size - kept_bytes) / (1 << 30),
                   keep ? "internals kept" : "blocks recomputed in backward",
                   doc_max ? (packed ? ", packed documents" : ", causal rows") : "");
        }
        if (doc_max == 0 || !(modes & 2))
            continue;
        float block_ms = timed([&] { block_step(pos); });
        static float causal_block_ms, causal_step_ms;
        printf("%-7s %-6s one block fwd+bwd %.3f ms (%s%s", "block", name, block_ms,
               packed ? "packed documents" : "causal rows", packed ? "" : ")\n");
        if (packed)
            printf(", documents of %d-%d tokens, fill %.3f; packed / causal: block %.3f, step "
                   "%.3f)\n",
                   doc_min, doc_max, (double)trained / (double)N, block_ms / causal_block_ms,
                   step_ms[1] / causal_step_ms);
        causal_block_ms = block_ms;
        causal_step_ms = step_ms[1];
    }
    if (profile) {
        fy_cu_gpt2_set_timing(g, 1);
        step((modes & 2) != 0, doc_max ? pos_dev : NULL);
        CK(cudaStreamSynchronize(s));
        print_profile(g, &c, B, T, modes);
    }
    fy_cu_model_destroy(&m);
    fy_cu_arena_release(&arena);
    return 0;
}
