/* Tests of the gpu worker's GPT requests (gpu_worker/gptexec.c) on the CPU backend, through a pool
 * of its own: the optional positions part of gpt-embed-fwd, gpt-embed-bwd, gpt-block-fwd and
 * gpt-block-bwd (the interface: FY_KIND_TOKENS, I32, the whole batch's B x T, after the
 * fixed parts and before any saved part). With it, learned positions are looked up at the
 * documents' own positions and each document attends only to itself, the same bits as the
 * backend called with those positions; without it, positions t (the windows of the token stream),
 * the bits of before. Positions that are wrong are refused, saying what is wrong: a part of the
 * wrong size or dtype, a position outside 0..t, a document that does not run 0, 1, 2, ...; and a
 * request with a part too many. Saved internals after the positions part are taken as such. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/actplan.h"
#include "common/base/config.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/model/model.h"
#include "common/ipc/pool.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/cpu/gpt2_cpu.h"
#include "gpu_worker/gptexec.h"
#include "tests/testutil.h"

enum { B = 2, T = 6, C = 8 };
#define NTOK ((size_t)B * T)
#define NACT ((size_t)B * T * C)

/* Two rows of documents (lengths 3, 1, 2 and 4, 1, 1: the last ones padding). */
static const int32_t packed[B * T] = {0, 1, 2, 0, 0, 1, /* */ 0, 1, 2, 3, 0, 0};

struct fixture {
    struct fy_model_config mc;
    struct fy_config cfg;
    struct fy_pool *pool;
    struct fy_backend *backend;
    struct fy_gptexec *exec;
    size_t embed_n, block_n;
    /* offsets in the pool's one region, and where they lie */
    uint64_t base, tok_at, pos_at, embed_at, block_at, x_at, y_at, dy_at, dx_at, dp_at, de_at,
        saved_at;
    struct fy_actplan_region saved;
    int32_t *tok, *pos;
    float *embed, *block, *x, *y, *dy, *dx, *dp, *de;
};

static void *at(struct fixture *f, uint64_t off) { return fy_pool_at(f->pool, off, 1); }

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->mc = (struct fy_model_config){.n_layer = 1, .n_head = 2, .n_embd = C, .vocab = 16, .ctx = 8};
    fy_config_init(&f->cfg);
    assert_int_equal(fy_model_config_to(&f->mc, &f->cfg), 0);
    assert_int_equal(fy_config_setf(&f->cfg, "train.batch", "%d", B), 0);
    assert_int_equal(fy_config_setf(&f->cfg, "train.seq", "%d", T), 0);
    f->embed_n = fy_model_unit_params(&f->mc, 0);
    f->block_n = fy_model_unit_params(&f->mc, 1);
    struct fy_actplan_sizes sizes;
    assert_int_equal(fy_actplan_sizes_backend(&f->mc, B, T, "cpu", &sizes), 0);
    assert_int_equal(
        fy_actplan_region_of(&sizes, FY_ACT_BIT(FY_ACT_QKV) | FY_ACT_BIT(FY_ACT_ATTN), &f->saved),
        0);
    /* every buffer 4 KiB aligned in one region */
    uint64_t sizes_b[] = {NTOK * 4,       NTOK * 4,       f->embed_n * 4, f->block_n * 4,
                          NACT * 4,       NACT * 4,       NACT * 4,       NACT * 4,
                          f->block_n * 4, f->embed_n * 4, f->saved.bytes};
    uint64_t *offs[] = {&f->tok_at, &f->pos_at, &f->embed_at, &f->block_at, &f->x_at,    &f->y_at,
                        &f->dy_at,  &f->dx_at,  &f->dp_at,    &f->de_at,    &f->saved_at};
    uint64_t total = 0;
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        *offs[i] = total;
        total += (sizes_b[i] + 4095) & ~(uint64_t)4095;
    }
    struct fy_pool_region_spec spec = {"gpt", total};
    char name[64];
    snprintf(name, sizeof name, "/fuyou-test-gptexec-%d", (int)getpid());
    assert_int_equal(fy_pool_create(&f->pool, name, &spec, 1, NULL), 0);
    uint64_t bytes;
    assert_int_equal(fy_pool_region(f->pool, "gpt", &f->base, &bytes), 0);
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
        *offs[i] += f->base;
    f->tok = at(f, f->tok_at), f->pos = at(f, f->pos_at);
    f->embed = at(f, f->embed_at), f->block = at(f, f->block_at), f->x = at(f, f->x_at);
    f->y = at(f, f->y_at), f->dy = at(f, f->dy_at), f->dx = at(f, f->dx_at);
    f->dp = at(f, f->dp_at), f->de = at(f, f->de_at);
    uint64_t st = 3;
    for (size_t i = 0; i < NTOK; i++) {
        f->tok[i] = (int32_t)(fy_test_rand(&st) % f->mc.vocab);
        f->pos[i] = packed[i];
    }
    for (size_t i = 0; i < f->embed_n; i++)
        f->embed[i] = fy_test_uniform(&st, -1, 1);
    for (size_t i = 0; i < f->block_n; i++)
        f->block[i] = fy_test_uniform(&st, -0.4f, 0.4f);
    for (size_t i = 0; i < NACT; i++) {
        f->x[i] = fy_test_uniform(&st, -1, 1);
        f->dy[i] = fy_test_uniform(&st, -1, 1);
    }
    assert_int_equal(fy_backend_open(&f->backend, "cpu", 0), 0);
    assert_int_equal(fy_gptexec_new(&f->exec, f->backend, &f->cfg, f->pool), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    fy_gptexec_destroy(&f->exec);
    fy_backend_close(&f->backend);
    fy_pool_destroy(&f->pool);
    free(f);
    return 0;
}

static struct fy_desc part(int op, int kind, int dtype, uint64_t off, uint64_t bytes)
{
    return fy_desc_region(op, kind, dtype, off, bytes,
                          op == FY_OP_GPT_EMBED_FWD || op == FY_OP_GPT_EMBED_BWD ? 0 : 1);
}

static struct fy_desc positions_part(struct fixture *f, int op)
{
    return part(op, FY_KIND_TOKENS, FY_DTYPE_I32, f->pos_at, NTOK * 4);
}

static int handle(struct fixture *f, const struct fy_desc *req, unsigned n)
{
    struct fy_desc reply;
    memset(&reply, 0, sizeof reply);
    return fy_gptexec_handle(f->exec, f->pool, req, n, &reply);
}

/* gpt-embed-fwd, with the positions part when `with` is set. */
static int embed_forward(struct fixture *f, int with)
{
    const int op = FY_OP_GPT_EMBED_FWD;
    struct fy_desc req[4] = {part(op, FY_KIND_TOKENS, FY_DTYPE_I32, f->tok_at, NTOK * 4),
                             part(op, FY_KIND_WEIGHTS, FY_DTYPE_F32, f->embed_at, f->embed_n * 4),
                             part(op, FY_KIND_ACTIVATION, FY_DTYPE_F32, f->x_at, NACT * 4),
                             positions_part(f, op)};
    return handle(f, req, with ? 4 : 3);
}

/* Learned positions at the documents' positions with the part, at t without. */
static void test_embed_positions(void **state)
{
    struct fixture *f = *state;
    const float *wpe = f->embed + (size_t)f->mc.vocab * C;
    for (int with = 0; with < 2; with++) {
        assert_int_equal(embed_forward(f, with), 0);
        for (size_t n = 0; n < NTOK; n++) {
            size_t p = with ? (size_t)packed[n] : n % T;
            for (int i = 0; i < C; i++)
                assert_true(f->x[n * C + i] ==
                            f->embed[(size_t)f->tok[n] * C + i] + wpe[p * C + i]);
        }
    }
    /* the backward adds the positions' gradient at the documents' positions */
    const int op = FY_OP_GPT_EMBED_BWD;
    struct fy_desc req[4] = {part(op, FY_KIND_TOKENS, FY_DTYPE_I32, f->tok_at, NTOK * 4),
                             part(op, FY_KIND_GRAD, FY_DTYPE_F32, f->dy_at, NACT * 4),
                             part(op, FY_KIND_GRAD, FY_DTYPE_F32, f->de_at, f->embed_n * 4),
                             positions_part(f, op)};
    memset(f->de, 0, f->embed_n * 4);
    assert_int_equal(handle(f, req, 4), 0);
    float *want = calloc(f->embed_n, sizeof *want);
    assert_non_null(want);
    fy_cpu_embed_backward(&f->mc, f->tok, packed, f->dy, want, B, T);
    assert_memory_equal(f->de, want, f->embed_n * 4);
    free(want);
}

/* gpt-block-fwd then gpt-block-bwd, with the positions part when `with` is set, and `saved` (0 or
 * 1) saved parts after it. */
static int block_pass(struct fixture *f, int with, int saved)
{
    const int fwd = FY_OP_GPT_BLOCK_FWD, bwd = FY_OP_GPT_BLOCK_BWD;
    struct fy_desc s = part(fwd, FY_KIND_SAVED, FY_DTYPE_NONE, f->saved_at, f->saved.bytes);
    s.arg = FY_ACT_BIT(FY_ACT_QKV) | FY_ACT_BIT(FY_ACT_ATTN);
    struct fy_desc req[7] = {part(fwd, FY_KIND_WEIGHTS, FY_DTYPE_F32, f->block_at, f->block_n * 4),
                             part(fwd, FY_KIND_ACTIVATION, FY_DTYPE_F32, f->x_at, NACT * 4),
                             part(fwd, FY_KIND_ACTIVATION, FY_DTYPE_F32, f->y_at, NACT * 4)};
    unsigned n = 3;
    if (with)
        req[n++] = positions_part(f, fwd);
    if (saved)
        req[n++] = s;
    int rc = handle(f, req, n);
    if (rc != 0)
        return rc;
    struct fy_desc back[7] = {part(bwd, FY_KIND_WEIGHTS, FY_DTYPE_F32, f->block_at, f->block_n * 4),
                              part(bwd, FY_KIND_ACTIVATION, FY_DTYPE_F32, f->x_at, NACT * 4),
                              part(bwd, FY_KIND_GRAD, FY_DTYPE_F32, f->dy_at, NACT * 4),
                              part(bwd, FY_KIND_GRAD, FY_DTYPE_F32, f->dx_at, NACT * 4),
                              part(bwd, FY_KIND_GRAD, FY_DTYPE_F32, f->dp_at, f->block_n * 4)};
    n = 5;
    if (with)
        back[n++] = positions_part(f, bwd);
    if (saved) {
        s.op = bwd;
        back[n++] = s;
    }
    return handle(f, back, n);
}

/* The bits of the CPU family called with the same positions (NULL without the part). */
static void test_block_positions(void **state)
{
    struct fixture *f = *state;
    float *y = malloc(NACT * 4), *dx = malloc(NACT * 4), *dp = malloc(f->block_n * 4);
    float *scratch = malloc(fy_cpu_block_scratch(&f->mc, B, T) * sizeof(float));
    float *y_plain = malloc(NACT * 4);
    assert_true(y && dx && dp && scratch && y_plain);
    for (int with = 0; with < 2; with++) {
        const int32_t *pos = with ? packed : NULL;
        assert_int_equal(block_pass(f, with, 0), 0);
        fy_cpu_block_forward(&f->mc, f->block, pos, f->x, y, scratch, NULL, B, T);
        fy_cpu_block_backward(&f->mc, f->block, pos, f->x, f->dy, dx, dp, scratch, NULL, B, T);
        assert_memory_equal(f->y, y, NACT * 4);
        assert_memory_equal(f->dx, dx, NACT * 4);
        assert_memory_equal(f->dp, dp, f->block_n * 4);
        if (!with)
            memcpy(y_plain, y, NACT * 4);
    }
    assert_memory_not_equal(y, y_plain, NACT * 4); /* the documents do change the block */
    /* with saved internals after the positions: the same bits */
    memset(f->y, 0, NACT * 4);
    memset(f->dx, 0, NACT * 4);
    assert_int_equal(block_pass(f, 1, 1), 0);
    assert_memory_equal(f->y, y, NACT * 4);
    assert_memory_equal(f->dx, dx, NACT * 4);
    /* the windows' positions (t everywhere) give the bits of no positions part */
    for (size_t n = 0; n < NTOK; n++)
        f->pos[n] = (int32_t)(n % T);
    assert_int_equal(block_pass(f, 1, 0), 0);
    assert_memory_equal(f->y, y_plain, NACT * 4);
    free(y), free(dx), free(dp), free(scratch), free(y_plain);
}

/* Wrong positions are refused, saying what is wrong (the lines printed). */
static void test_positions_refused(void **state)
{
    struct fixture *f = *state;
    const int op = FY_OP_GPT_EMBED_FWD;
    struct fy_desc req[5] = {part(op, FY_KIND_TOKENS, FY_DTYPE_I32, f->tok_at, NTOK * 4),
                             part(op, FY_KIND_WEIGHTS, FY_DTYPE_F32, f->embed_at, f->embed_n * 4),
                             part(op, FY_KIND_ACTIVATION, FY_DTYPE_F32, f->x_at, NACT * 4),
                             positions_part(f, op), positions_part(f, op)};
    print_message("refusals expected below: a positions part of one row's bytes, of dtype f32, a "
                  "part too many, a position beyond its token's place, a document skipping a "
                  "position, a negative position\n");
    req[3].bytes = (uint64_t)T * 4;
    assert_int_equal(handle(f, req, 4), -EPROTO);
    req[3] = positions_part(f, op);
    req[3].dtype = FY_DTYPE_F32;
    assert_int_equal(handle(f, req, 4), -EPROTO);
    req[3] = positions_part(f, op);
    assert_int_equal(handle(f, req, 5), -EPROTO);
    f->pos[T + 2] = 3; /* token 2 of row 1 at position 3 */
    assert_int_equal(handle(f, req, 4), -EINVAL);
    f->pos[T + 2] = 2;
    f->pos[2] = 0, f->pos[3] = 2; /* row 0: 0, 1, 0, 2: a document skipping position 1 */
    assert_int_equal(handle(f, req, 4), -EINVAL);
    f->pos[3] = -1;
    assert_int_equal(handle(f, req, 4), -EINVAL);
    f->pos[3] = 0;
    assert_int_equal(handle(f, req, 4), 0); /* 0 1 0 0 0 1: documents of 2, 1, 1, 2 */
    /* the same checks on the other requests (one of them here: the block forward's) */
    f->pos[5] = 5;
    assert_int_equal(block_pass(f, 1, 0), -EINVAL);
    memcpy(f->pos, packed, sizeof packed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_embed_positions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_positions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_positions_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
