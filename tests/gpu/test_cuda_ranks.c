/* GPU test of the CUDA backend's ops for several gpu workers (--gpus), on one GPU:
 * - model_loss_count: the head's mean over a count of targets other than its own gives its loss
 *   scaled by own/count (to double rounding: the loss is the rows' f32 losses summed in double and
 *   divided once) and every gradient of a pass (the head's dx, dfinal and dembed, then a block's
 *   backward and the embeddings' from that dx) scaled likewise within bf16 tolerance (the head's
 *   bf16 dlogits are rounded after the scaling, 2^-9 relative a value, through two more bf16
 *   roundings: relative Frobenius error below 2e-2); its own count gives the bytes of the plain
 *   call; the CPU backend's rescaled head agrees within the usual CUDA-vs-CPU tolerance (3e-2);
 *   queued, each head call keeps the count it was made with.
 * - model_rank_id and model_ranks (NCCL, where the build has it): in a group of one rank every
 *   output of a pass is the same bytes as without a group (the sum over one rank, in place), also
 *   after preparing again; joining twice is refused.
 * For GPT-2 (head tied to the embeddings) and a Llama with a head of its own (the head's gradient
 * pieces lie the other way round). Skips, saying why, where the build has no CUDA or the machine no
 * GPU; the group's part skips visibly where the build has no NCCL. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

static const struct fy_model_config gpt2 = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab = 259,
                                            .ctx = 48};
static const int B = 3, T = 37;

/* Floats of each output of a pass. */
struct sizes {
    size_t NC, ne, nb, nf;
};

/* Every output of a pass. */
struct outs {
    float *x, *y, *dy, *dfin, *demb_head, *dx, *dp, *demb;
    double loss;
};

static struct sizes sizes_of(const struct fy_refmodel *m)
{
    return (struct sizes){(size_t)m->B * m->T * m->cfg.n_embd, m->sizes[0], m->sizes[1],
                          m->sizes[m->n_units - 1]};
}

static void outs_new(struct outs *o, const struct sizes *z)
{
    float **p[] = {&o->x, &o->y, &o->dy, &o->dx};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        assert_non_null(*p[i] = malloc(z->NC * 4));
    assert_non_null(o->dfin = malloc(z->nf * 4));
    assert_non_null(o->demb_head = malloc(z->ne * 4));
    assert_non_null(o->demb = malloc(z->ne * 4));
    assert_non_null(o->dp = malloc(z->nb * 4));
    /* poison: whatever a call should write and does not shows */
    memset(o->dfin, 0xff, z->nf * 4);
    memset(o->demb_head, 0xff, z->ne * 4);
    memset(o->dp, 0xff, z->nb * 4);
}

static void outs_free(struct outs *o)
{
    free(o->x);
    free(o->y);
    free(o->dy);
    free(o->dx);
    free(o->dfin);
    free(o->demb_head);
    free(o->demb);
    free(o->dp);
}

/* The embeddings, block 1 forward, the head with gradients, block 1 backward from the head's dx,
 * and the embeddings' backward adding onto the head's dembed: every kind of gradient a call
 * makes. */
static void pass(struct fy_backend *b, const struct fy_refmodel *m, struct outs *o)
{
    struct sizes z = sizes_of(m);
    const float *embed = m->params[0], *block = m->params[1], *fin = m->params[m->n_units - 1];
    assert_int_equal(fy_backend_model_embed_forward(b, embed, m->tokens, NULL, o->x), 0);
    assert_int_equal(fy_backend_model_block_forward(b, 1, block, NULL, o->x, o->y, NULL), 0);
    assert_int_equal(fy_backend_model_head(b, fin, embed, o->y, m->targets, &o->loss, o->dy,
                                           o->dfin, o->demb_head),
                     0);
    assert_int_equal(
        fy_backend_model_block_backward(b, 1, block, NULL, o->x, o->dy, o->dx, o->dp, NULL), 0);
    memcpy(o->demb, o->demb_head, z.ne * 4);
    assert_int_equal(fy_backend_model_embed_backward(b, m->tokens, NULL, o->dx, o->demb), 0);
}

static void outs_same(const struct outs *a, const struct outs *b, const struct sizes *z)
{
    assert_memory_equal(&a->loss, &b->loss, sizeof a->loss);
    assert_memory_equal(a->x, b->x, z->NC * 4);
    assert_memory_equal(a->y, b->y, z->NC * 4);
    assert_memory_equal(a->dy, b->dy, z->NC * 4);
    assert_memory_equal(a->dfin, b->dfin, z->nf * 4);
    assert_memory_equal(a->demb_head, b->demb_head, z->ne * 4);
    assert_memory_equal(a->dx, b->dx, z->NC * 4);
    assert_memory_equal(a->dp, b->dp, z->nb * 4);
    assert_memory_equal(a->demb, b->demb, z->ne * 4);
}

/* Relative Frobenius error of a against ref scaled by f. */
static double scaled_err(const float *a, const float *ref, double f, size_t n, const char *what)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double r = f * ref[i], d = (double)a[i] - r;
        num += d * d;
        den += r * r;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    print_message("  %-16s n=%-8zu relative Frobenius error %.3e\n", what, n, rel);
    return isnan(rel) ? INFINITY : rel;
}

static uint64_t own_targets(const struct fy_refmodel *m)
{
    uint64_t own = 0;
    for (int i = 0; i < m->B * m->T; i++)
        own += m->targets[i] >= 0;
    return own;
}

/* The head alone, into o's head outputs. */
static void head(struct fy_backend *b, const struct fy_refmodel *m, struct outs *o)
{
    assert_int_equal(fy_backend_model_head(b, m->params[m->n_units - 1], m->params[0], o->y,
                                           m->targets, &o->loss, o->dy, o->dfin, o->demb_head),
                     0);
}

static void loss_count_case(const struct fy_model_config *c, const char *name)
{
    struct fy_refmodel m;
    if (fy_refmodel_init(&m, c, B, T, 23) != 0)
        fail_msg("%s: %s", name, m.err);
    struct sizes z = sizes_of(&m);
    struct fy_backend *b = NULL, *cpu = NULL;
    assert_int_equal(fy_backend_open(&b, "cuda", 0), 0);
    assert_int_equal(fy_backend_model_prepare(b, c, B, T), 0);
    struct outs ref, same, got, q1, q2;
    outs_new(&ref, &z);
    outs_new(&same, &z);
    outs_new(&got, &z);
    outs_new(&q1, &z);
    outs_new(&q2, &z);
    pass(b, &m, &ref);

    uint64_t own = own_targets(&m), count = 4 * own + 3;
    double f = (double)own / (double)count;
    print_message("%s: %llu targets of its own, the mean over %llu\n", name,
                  (unsigned long long)own, (unsigned long long)count);
    /* its own count: the plain call's bytes */
    assert_int_equal(fy_backend_model_loss_count(b, own), 0);
    pass(b, &m, &same);
    outs_same(&same, &ref, &z);

    assert_int_equal(fy_backend_model_loss_count(b, count), 0);
    pass(b, &m, &got);
    print_message("  loss %.9f, plain %.9f x own/count = %.9f\n", got.loss, ref.loss, ref.loss * f);
    assert_true(fabs(got.loss - ref.loss * f) <= 1e-9 * fabs(ref.loss * f));
    assert_memory_equal(got.x, ref.x, z.NC * 4);
    assert_memory_equal(got.y, ref.y, z.NC * 4);
    assert_true(scaled_err(got.dy, ref.dy, f, z.NC, "head dx") < 2e-2);
    assert_true(scaled_err(got.dfin, ref.dfin, f, z.nf, "head dfinal") < 2e-2);
    assert_true(scaled_err(got.demb_head, ref.demb_head, f, z.ne, "head dembed") < 2e-2);
    assert_true(scaled_err(got.dx, ref.dx, f, z.NC, "block dx") < 2e-2);
    assert_true(scaled_err(got.dp, ref.dp, f, z.nb, "block dparams") < 2e-2);
    assert_true(scaled_err(got.demb, ref.demb, f, z.ne, "dembed") < 2e-2);

    /* the CPU backend's head, rescaled, on the same input */
    assert_int_equal(fy_backend_open(&cpu, "cpu", 0), 0);
    assert_int_equal(fy_backend_model_prepare(cpu, c, B, T), 0);
    assert_int_equal(fy_backend_model_loss_count(cpu, count), 0);
    struct outs c_out;
    outs_new(&c_out, &z);
    memcpy(c_out.y, ref.y, z.NC * 4);
    head(cpu, &m, &c_out);
    print_message("  loss on the CPU backend %.9f\n", c_out.loss);
    assert_true(fabs(got.loss - c_out.loss) <= 1e-2 * fabs(c_out.loss));
    assert_true(scaled_err(got.dy, c_out.dy, 1, z.NC, "head dx, cpu") < 3e-2);
    assert_true(scaled_err(got.dfin, c_out.dfin, 1, z.nf, "head dfinal, cpu") < 3e-2);
    assert_true(scaled_err(got.demb_head, c_out.demb_head, 1, z.ne, "head dembed, cpu") < 3e-2);
    outs_free(&c_out);
    fy_backend_close(&cpu);

    /* queued: the first head keeps the count it was made with while the second, made after
     * switching back to its own, is in flight */
    memcpy(q1.y, ref.y, z.NC * 4);
    memcpy(q2.y, ref.y, z.NC * 4);
    assert_int_equal(fy_backend_model_set_queued(b, 1), 1);
    head(b, &m, &q1);
    assert_int_equal(fy_backend_model_loss_count(b, 0), 0);
    head(b, &m, &q2);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_int_equal(fy_backend_model_set_queued(b, 0), 0);
    assert_memory_equal(&q1.loss, &got.loss, sizeof q1.loss);
    assert_memory_equal(q1.dy, got.dy, z.NC * 4);
    assert_memory_equal(q1.dfin, got.dfin, z.nf * 4);
    assert_memory_equal(q1.demb_head, got.demb_head, z.ne * 4);
    assert_memory_equal(&q2.loss, &ref.loss, sizeof q2.loss);
    assert_memory_equal(q2.dy, ref.dy, z.NC * 4);
    assert_memory_equal(q2.dfin, ref.dfin, z.nf * 4);
    assert_memory_equal(q2.demb_head, ref.demb_head, z.ne * 4);
    print_message("%s: queued heads keep the count they were made with\n", name);

    outs_free(&ref);
    outs_free(&same);
    outs_free(&got);
    outs_free(&q1);
    outs_free(&q2);
    fy_backend_close(&b);
    fy_refmodel_free(&m);
}

static void test_loss_count(void **state)
{
    loss_count_case(&gpt2, "GPT-2");
    struct fy_model_config untied = fy_refmodel_llama_small(0);
    loss_count_case(&untied, "Llama, untied head");
}

static void one_rank_case(const struct fy_model_config *c, const char *name)
{
    struct fy_refmodel m;
    if (fy_refmodel_init(&m, c, B, T, 29) != 0)
        fail_msg("%s: %s", name, m.err);
    struct sizes z = sizes_of(&m);
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cuda", 0), 0);
    assert_int_equal(fy_backend_model_prepare(b, c, B, T), 0);
    struct outs ref, got, again;
    outs_new(&ref, &z);
    outs_new(&got, &z);
    outs_new(&again, &z);
    pass(b, &m, &ref);

    unsigned char id[512];
    int len = fy_backend_model_rank_id(b, id, sizeof id);
    assert_true(len > 0 && (size_t)len <= sizeof id);
    assert_int_equal(fy_backend_model_ranks(b, 0, 1, id, (size_t)len), 0);
    pass(b, &m, &got);
    outs_same(&got, &ref, &z);
    /* the group goes with the backend to the next preparation's model */
    assert_int_equal(fy_backend_model_prepare(b, c, B, T), 0);
    pass(b, &m, &again);
    outs_same(&again, &ref, &z);
    assert_true(fy_backend_model_ranks(b, 0, 1, id, (size_t)len) < 0);
    print_message("%s: a group of one rank (id of %d bytes) gives the same bytes as none\n", name,
                  len);

    outs_free(&ref);
    outs_free(&got);
    outs_free(&again);
    fy_backend_close(&b); /* leaves the group */
    fy_refmodel_free(&m);
}

static void test_one_rank_group(void **state)
{
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cuda", 0), 0);
    int sums = fy_backend_model_sums_ranks(b);
    fy_backend_close(&b);
    if (!sums) {
        print_message("SKIPPED: this build's CUDA backend has no NCCL (make check-deps says how "
                      "to get it): the group of one rank is not checked\n");
        skip();
    }
    one_rank_case(&gpt2, "GPT-2");
    struct fy_model_config untied = fy_refmodel_llama_small(0);
    one_rank_case(&untied, "Llama, untied head");
}

int main(void)
{
    if (!fy_backend_cuda_built()) {
        printf("test_cuda_ranks: SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    struct fy_backend *probe = NULL;
    if (fy_backend_open(&probe, "cuda", 0) < 0) {
        printf("test_cuda_ranks: SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    fy_backend_close(&probe);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_count),
        cmocka_unit_test(test_one_rank_group),
    };
    return cmocka_run_group_tests_name("cuda backend, several gpu workers", tests, NULL, NULL);
}
