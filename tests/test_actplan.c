/* Tests of common/model/actplan: kind sizes, the recompute dependency walk, the cost model against
 * numbers worked out by hand, the planner's obvious answers on synthetic profiles, its budgets and
 * its dominance over the forced modes on random profiles, its distance from a brute-force optimum
 * on two layers, errors, and the summary and JSON outputs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "common/model/actplan.h"
#include "common/base/log.h"
#include "tests/testutil.h"

#define MAXL 16
#define K FY_ACT_KINDS
static const int swappable[] = {FY_ACT_QKV, FY_ACT_ATTN, FY_ACT_RESID, FY_ACT_FC, FY_ACT_GELU};
#define NSW 5

static void assert_near(double got, double want, double tol)
{
    if (!(fabs(got - want) <= tol)) {
        fprintf(stderr, "got %.12g, want %.12g (tolerance %g)\n", got, want, tol);
        fail();
    }
}

/* fy_actplan_new with stderr silenced: the random tests expect many refusals, each logged. */
static int quiet_new(struct fy_actplan **out, const struct fy_actplan_profile *p,
                     const struct fy_actplan_sizes *s, enum fy_actplan_mode mode)
{
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    assert_true(saved >= 0 && null >= 0);
    dup2(null, 2);
    close(null);
    int rc = fy_actplan_new(out, p, s, mode);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    return rc;
}

/* A profile over a caller's layer table with every figure set to something harmless. */
static void base_profile(struct fy_actplan_profile *p, struct fy_actplan_layer_prof *lp, int L)
{
    memset(p, 0, sizeof *p);
    p->n_layer = L;
    p->layer = lp;
    p->h2d_Bps = p->d2h_Bps = p->duplex_Bps = p->ssd_read_Bps = p->ssd_write_Bps = 1e9;
    p->ssd_bytes = UINT64_MAX;
    for (int l = 0; l < L; l++) {
        memset(&lp[l], 0, sizeof lp[l]);
        lp[l].fwd_s = 1.0;
        lp[l].bwd_s = 2.0;
        lp[l].recompute_s[FY_ACT_LN1] = lp[l].recompute_s[FY_ACT_LN2] = 0.01;
        lp[l].recompute_s[FY_ACT_QKV] = 0.15;
        lp[l].recompute_s[FY_ACT_ATTN] = 0.3;
        lp[l].recompute_s[FY_ACT_RESID] = 0.05;
        lp[l].recompute_s[FY_ACT_FC] = 0.2;
        lp[l].recompute_s[FY_ACT_GELU] = 0.02;
    }
}

static void gpt_sizes(struct fy_actplan_sizes *s)
{
    struct fy_model_config c = {.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab = 256, .ctx = 64};
    assert_int_equal(fy_actplan_sizes_gpt(&c, 4, 64, 2, s), 0);
}

static uint64_t sum_bytes(const struct fy_actplan_sizes *s, int with_ckpt, int swap)
{
    uint64_t b = with_ckpt ? s->bytes[FY_ACT_CKPT] : 0;
    for (int i = 0; swap && i < NSW; i++)
        b += s->bytes[swappable[i]];
    return b;
}

static void test_names_parse(void **state)
{
    enum fy_actplan_mode m;
    const char *names[] = {"auto", "recompute", "host", "ssd"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(fy_actplan_mode_parse(names[i], &m), 0);
        assert_int_equal((int)m, i);
        assert_string_equal(fy_actplan_mode_name(i), names[i]);
    }
    assert_int_equal(fy_actplan_mode_parse("gpu", &m), -EINVAL);
    assert_int_equal(fy_actplan_mode_parse(NULL, &m), -EINVAL);
    assert_string_equal(fy_actplan_kind_name(FY_ACT_GELU), "gelu");
    assert_string_equal(fy_actplan_place_name(FY_ACT_RECOMPUTE), "recompute");
    assert_string_equal(fy_actplan_res_name(FY_RES_PCIE), "pcie");
    /* the checkpoint is never recomputed, the LayerNorms always are, the rest take anything */
    for (int pl = 0; pl < FY_ACT_PLACES; pl++) {
        assert_int_equal(fy_actplan_allowed(FY_ACT_CKPT, pl), pl != FY_ACT_RECOMPUTE);
        assert_int_equal(fy_actplan_allowed(FY_ACT_LN1, pl), pl == FY_ACT_RECOMPUTE);
        assert_int_equal(fy_actplan_allowed(FY_ACT_LN2, pl), pl == FY_ACT_RECOMPUTE);
        for (int i = 0; i < NSW; i++)
            assert_true(fy_actplan_allowed(swappable[i], pl));
    }
    int nsw = 0;
    for (int k = 0; k < K; k++)
        nsw += fy_actplan_kind_swappable(k);
    assert_int_equal(nsw, NSW);
}

static void test_sizes(void **state)
{
    struct fy_model_config c = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab = 256, .ctx = 64};
    struct fy_actplan_sizes s;
    assert_int_equal(fy_actplan_sizes_gpt(&c, 2, 8, 2, &s), 0);
    /* N = 16 rows: a [N][C] bf16 tensor is 2048 bytes, a row statistic 64, the lse 16*4*4 = 256 */
    assert_int_equal(s.bytes[FY_ACT_CKPT], 2048);
    assert_int_equal(s.bytes[FY_ACT_LN1], 2048 + 128);
    assert_int_equal(s.bytes[FY_ACT_QKV], 6144);
    assert_int_equal(s.bytes[FY_ACT_ATTN], 2048 + 256);
    assert_int_equal(s.bytes[FY_ACT_RESID], 2048);
    assert_int_equal(s.bytes[FY_ACT_LN2], 2048 + 128);
    assert_int_equal(s.bytes[FY_ACT_FC], 8192);
    assert_int_equal(s.bytes[FY_ACT_GELU], 8192);
    assert_int_equal(fy_actplan_sizes_gpt(&c, 2, 8, 4, &s), 0);
    assert_int_equal(s.bytes[FY_ACT_FC], 16384);
    assert_int_equal(s.bytes[FY_ACT_ATTN], 4096 + 256); /* the statistics stay f32 */
    assert_int_equal(fy_actplan_sizes_gpt(&c, 2, 8, 3, &s), -EINVAL);
    assert_int_equal(fy_actplan_sizes_gpt(&c, 0, 8, 2, &s), -EINVAL);
}

/* Every subset of kept kinds: the walk equals the LayerNorms plus each unkept swappable kind's own
 * op (times are distinct powers of two, so any mixing shows). */
static void test_recompute_walk(void **state)
{
    struct fy_actplan_layer_prof lp;
    memset(&lp, 0, sizeof lp);
    lp.recompute_s[FY_ACT_CKPT] = 1024; /* never counted: nothing produces the checkpoint */
    for (int k = 1; k < K; k++)
        lp.recompute_s[k] = (double)(1u << k);
    for (unsigned mask = 0; mask < (1u << NSW); mask++) {
        for (int ck = 0; ck < 2; ck++) {
            unsigned char kept[K] = {0};
            kept[FY_ACT_CKPT] = (unsigned char)ck;
            double want = lp.recompute_s[FY_ACT_LN1] + lp.recompute_s[FY_ACT_LN2];
            for (int i = 0; i < NSW; i++) {
                kept[swappable[i]] = (mask >> i) & 1;
                if (!kept[swappable[i]])
                    want += lp.recompute_s[swappable[i]];
            }
            assert_near(fy_actplan_recompute_s(&lp, kept), want, 0);
        }
    }
    /* keeping g alone saves GELU only: fc is still needed by the GELU backward */
    unsigned char none[K] = {0}, g[K] = {0};
    g[FY_ACT_GELU] = 1;
    assert_near(fy_actplan_recompute_s(&lp, none) - fy_actplan_recompute_s(&lp, g),
                lp.recompute_s[FY_ACT_GELU], 0);
    /* keeping every swappable kind still reruns the two LayerNorms */
    unsigned char all[K];
    memset(all, 1, sizeof all);
    all[FY_ACT_LN1] = all[FY_ACT_LN2] = 0;
    assert_near(fy_actplan_recompute_s(&lp, all),
                lp.recompute_s[FY_ACT_LN1] + lp.recompute_s[FY_ACT_LN2], 0);
    /* the walk follows inputs: were ln2 kept but nothing else, y1 is still rerun (the LayerNorm's
     * backward reads it), and with it everything before */
    unsigned char ln2[K] = {0};
    ln2[FY_ACT_LN2] = 1;
    assert_near(fy_actplan_recompute_s(&lp, ln2),
                fy_actplan_recompute_s(&lp, none) - lp.recompute_s[FY_ACT_LN2], 0);
}

/* Two layers, two placements, every resource of both phases worked out by hand. */
static void test_cost_by_hand(void **state)
{
    struct fy_actplan_layer_prof lp[2];
    struct fy_actplan_profile p;
    base_profile(&p, lp, 2);
    for (int l = 0; l < 2; l++) {
        lp[l].fwd_s = l ? 1.5 : 1.0;
        lp[l].bwd_s = l ? 2.5 : 2.0;
        double rc[K] = {0, 0.01, 0.3, 0.5, 0.1, 0.01, 0.4, 0.05};
        memcpy(lp[l].recompute_s, rc, sizeof rc);
    }
    p.h2d_Bps = 100, p.d2h_Bps = 200, p.duplex_Bps = 250, p.ssd_read_Bps = 50, p.ssd_write_Bps = 200;
    p.fwd = (struct fy_actplan_other){.h2d = 200, .ssd_read = 50, .gpu_s = 0.5};
    p.bwd = (struct fy_actplan_other){
        .h2d = 100, .d2h = 300, .ssd_read = 100, .ssd_write = 100, .gpu_s = 0.2, .opt_s = 4.0};
    struct fy_actplan_sizes s = {{100, 10, 300, 110, 100, 10, 400, 400}};
    enum { G = FY_ACT_GPU, H = FY_ACT_HOST, D = FY_ACT_SSD, R = FY_ACT_RECOMPUTE };
    /*                         ckpt ln1 qkv attn resid ln2 fc gelu */
    unsigned char place[2 * K] = {H, R, G, D, R, R, H, R, /* layer 0 */
                                  D, R, R, R, G, R, R, D};
    struct fy_actplan_pred pr;
    assert_int_equal(fy_actplan_predict(&p, &s, place, &pr), 0);
    assert_int_equal(pr.bytes[G], 300 + 100);
    assert_int_equal(pr.bytes[H], 100 + 400);
    assert_int_equal(pr.bytes[D], 110 + 100 + 400);
    assert_int_equal(pr.bytes[R], 40 + 100 + 400 + 300 + 110 + 400);
    /* R: layer 0 ln1 + resid + ln2 + gelu = 0.17, layer 1 ln1 + qkv + attn + ln2 + fc = 1.22 */
    assert_near(pr.recompute_s, 1.39, 1e-12);
    /* A = 1110 bytes off the GPU, S = 610 on the SSD */
    assert_near(pr.fwd.res_s[FY_RES_GPU], 1.0 + 1.5 + 0.5, 1e-12);
    assert_near(pr.fwd.res_s[FY_RES_D2H], 1110 / 200.0, 1e-12);
    assert_near(pr.fwd.res_s[FY_RES_H2D], 200 / 100.0, 1e-12);
    assert_near(pr.fwd.res_s[FY_RES_PCIE], (1110 + 200) / 250.0, 1e-12);
    assert_near(pr.fwd.res_s[FY_RES_SSD], 610 / 200.0 + 50 / 50.0, 1e-12);
    assert_near(pr.fwd.res_s[FY_RES_OPT], 0, 0);
    assert_near(pr.fwd.s, 5.55, 1e-12);
    assert_int_equal(pr.fwd.bound, FY_RES_D2H);
    assert_near(pr.bwd.res_s[FY_RES_GPU], 2.0 + 2.5 + 0.2 + 1.39, 1e-12);
    assert_near(pr.bwd.res_s[FY_RES_H2D], (1110 + 100) / 100.0, 1e-12);
    assert_near(pr.bwd.res_s[FY_RES_D2H], 300 / 200.0, 1e-12);
    assert_near(pr.bwd.res_s[FY_RES_PCIE], (1110 + 100 + 300) / 250.0, 1e-12);
    assert_near(pr.bwd.res_s[FY_RES_SSD], (610 + 100) / 50.0 + 100 / 200.0, 1e-12);
    assert_near(pr.bwd.res_s[FY_RES_OPT], 4.0, 0);
    assert_near(pr.bwd.s, 14.7, 1e-12);
    assert_int_equal(pr.bwd.bound, FY_RES_SSD);
    assert_near(pr.step_s, 20.25, 1e-12);
    /* host memory, which every copy and the optimizer share: the bytes off the GPU, the SSD's once
     * more, and the phase's own */
    p.mem_Bps = 100;
    p.fwd.mem = 300;
    p.bwd.mem = 1500;
    assert_int_equal(fy_actplan_predict(&p, &s, place, &pr), 0);
    assert_near(pr.fwd.res_s[FY_RES_MEM], (1110 + 610 + 300) / 100.0, 1e-12);
    assert_int_equal(pr.fwd.bound, FY_RES_MEM);
    assert_near(pr.bwd.res_s[FY_RES_MEM], (1110 + 610 + 1500) / 100.0, 1e-12);
    assert_int_equal(pr.bwd.bound, FY_RES_MEM);
    assert_near(pr.step_s, 20.2 + 32.2, 1e-12);
    assert_string_equal(fy_actplan_res_name(FY_RES_MEM), "mem");
    p.mem_Bps = -1;
    assert_int_equal(fy_actplan_predict(&p, &s, place, &pr), -EINVAL);
    p.mem_Bps = 0; /* not modelled */
    p.fwd.mem = p.bwd.mem = 0;

    /* checkpoints on the GPU, everything else recomputed: compute-bound both ways */
    unsigned char rc[2 * K] = {G, R, R, R, R, R, R, R, G, R, R, R, R, R, R, R};
    assert_int_equal(fy_actplan_predict(&p, &s, rc, &pr), 0);
    assert_near(pr.recompute_s, 2.74, 1e-12);
    assert_near(pr.fwd.s, 3.0, 1e-12);
    assert_int_equal(pr.fwd.bound, FY_RES_GPU);
    assert_near(pr.fwd.res_s[FY_RES_PCIE], 0.8, 1e-12);
    assert_near(pr.fwd.res_s[FY_RES_SSD], 1.0, 1e-12);
    assert_near(pr.bwd.s, 4.7 + 2.74, 1e-12);
    assert_int_equal(pr.bwd.bound, FY_RES_GPU);
    assert_near(pr.bwd.res_s[FY_RES_SSD], 2.5, 1e-12);
    assert_near(pr.bwd.res_s[FY_RES_PCIE], 1.6, 1e-12);
    assert_near(pr.step_s, 10.44, 1e-12);

    /* placements a kind does not allow */
    rc[0] = R;
    assert_int_equal(fy_actplan_predict(&p, &s, rc, &pr), -EINVAL);
    rc[0] = G;
    rc[FY_ACT_LN1] = G;
    assert_int_equal(fy_actplan_predict(&p, &s, rc, &pr), -EINVAL);
}

/* Very large bandwidths, no GPU room, ample host: everything that saves time goes to the host. */
static void test_infinite_bandwidth(void **state)
{
    struct fy_actplan_layer_prof lp[4];
    struct fy_actplan_profile p;
    base_profile(&p, lp, 4);
    p.h2d_Bps = p.d2h_Bps = p.duplex_Bps = p.ssd_read_Bps = p.ssd_write_Bps = INFINITY;
    p.host_bytes = UINT64_MAX;
    lp[2].recompute_s[FY_ACT_RESID] = 0; /* saves nothing: stays recomputed */
    struct fy_actplan_sizes s;
    gpt_sizes(&s);
    struct fy_actplan *a;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(fy_actplan_at(a, l, FY_ACT_CKPT), FY_ACT_HOST);
        for (int i = 0; i < NSW; i++) {
            int want = l == 2 && swappable[i] == FY_ACT_RESID ? FY_ACT_RECOMPUTE : FY_ACT_HOST;
            assert_int_equal(fy_actplan_at(a, l, swappable[i]), want);
        }
    }
    assert_near(a->pred.recompute_s, 4 * 0.02, 1e-12); /* the LayerNorms only */
    assert_int_equal(a->pred.bytes[FY_ACT_GPU], 0);
    assert_int_equal(a->pred.bytes[FY_ACT_SSD], 0);
    assert_int_equal(a->pred.fwd.bound, FY_RES_GPU);
    fy_actplan_destroy(&a);
    assert_null(a);

    /* the same with no host room: everything goes to the (infinitely fast) SSD */
    p.host_bytes = 0;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
    for (int l = 0; l < 4; l++)
        for (int k = 0; k < K; k++)
            if (k == FY_ACT_CKPT || (fy_actplan_kind_swappable(k) && !(l == 2 && k == FY_ACT_RESID)))
                assert_int_equal(fy_actplan_at(a, l, k), FY_ACT_SSD);
    assert_near(a->pred.recompute_s, 4 * 0.02, 1e-12);
    fy_actplan_destroy(&a);
}

/* No host memory and a slow SSD: every swappable kind is recomputed. The checkpoints go where they
 * fit: to the SSD with no GPU room, to the GPU when it holds exactly them. */
static void test_no_host_slow_ssd(void **state)
{
    struct fy_actplan_layer_prof lp[4];
    struct fy_actplan_profile p;
    base_profile(&p, lp, 4);
    p.ssd_read_Bps = p.ssd_write_Bps = 1e3; /* a 32 KiB checkpoint takes 30 s */
    p.host_bytes = 0;
    struct fy_actplan_sizes s;
    gpt_sizes(&s);
    for (int gpu = 0; gpu < 2; gpu++) {
        p.gpu_bytes = gpu ? 4 * s.bytes[FY_ACT_CKPT] : 0;
        struct fy_actplan *a;
        assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
        for (int l = 0; l < 4; l++) {
            assert_int_equal(fy_actplan_at(a, l, FY_ACT_CKPT), gpu ? FY_ACT_GPU : FY_ACT_SSD);
            for (int i = 0; i < NSW; i++)
                assert_int_equal(fy_actplan_at(a, l, swappable[i]), FY_ACT_RECOMPUTE);
        }
        assert_int_equal(a->pred.bytes[FY_ACT_SSD], gpu ? 0 : 4 * s.bytes[FY_ACT_CKPT]);
        assert_near(a->pred.recompute_s, 4 * (0.02 + 0.15 + 0.3 + 0.05 + 0.2 + 0.02), 1e-12);
        char buf[1024];
        fy_actplan_describe(a, buf, sizeof buf);
        printf("# %s\n", buf);
        fy_actplan_destroy(&a);
    }
    /* the forced recompute mode wants the checkpoints on the host: no room */
    struct fy_actplan *a = NULL;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_RECOMPUTE), -ENOSPC);
    assert_null(a);
}

/* Ample GPU memory: everything that saves time is kept on the GPU, nothing moves. */
static void test_ample_gpu(void **state)
{
    struct fy_actplan_layer_prof lp[3];
    struct fy_actplan_profile p;
    base_profile(&p, lp, 3);
    p.gpu_bytes = UINT64_MAX;
    p.host_bytes = UINT64_MAX;
    struct fy_actplan_sizes s;
    gpt_sizes(&s);
    struct fy_actplan *a;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
    for (int l = 0; l < 3; l++)
        for (int k = 0; k < K; k++)
            assert_int_equal(fy_actplan_at(a, l, k),
                             k == FY_ACT_LN1 || k == FY_ACT_LN2 ? FY_ACT_RECOMPUTE : FY_ACT_GPU);
    assert_int_equal(a->pred.bytes[FY_ACT_HOST] + a->pred.bytes[FY_ACT_SSD], 0);
    assert_int_equal(a->pred.bytes[FY_ACT_GPU], 3 * sum_bytes(&s, 1, 1));
    fy_actplan_destroy(&a);
}

/* A GPU budget that holds the checkpoints and exactly the k best candidates: those k, no others.
 * Savings fall by 5x from one rank to the next while sizes differ by at most 4x, so the ranking by
 * saving per byte is the ranking by saving, and each saving exceeds all smaller ones together (so
 * the k best are also the optimum). Host room 0 and an SSD too slow for anything else. */
static void test_gpu_fits_k_best(void **state)
{
    enum { L = 2, NC = L * NSW };
    struct fy_actplan_layer_prof lp[L];
    struct fy_actplan_profile p;
    base_profile(&p, lp, L);
    p.host_bytes = 0;
    p.ssd_read_Bps = p.ssd_write_Bps = 1;
    struct fy_actplan_sizes s;
    gpt_sizes(&s);
    /* a seeded permutation of ranks over (layer, swappable kind) */
    int rank[NC];
    for (int i = 0; i < NC; i++)
        rank[i] = i;
    uint64_t seed = 7;
    for (int i = NC - 1; i > 0; i--) {
        int j = (int)(fy_test_rand(&seed) % (uint64_t)(i + 1));
        int t = rank[i];
        rank[i] = rank[j];
        rank[j] = t;
    }
    for (int i = 0; i < NC; i++)
        lp[i / NSW].recompute_s[swappable[i % NSW]] = pow(5.0, NC - 1 - rank[i]) * 1e-6;
    for (int k = 0; k <= NC; k++) {
        uint64_t room = L * s.bytes[FY_ACT_CKPT];
        for (int i = 0; i < NC; i++)
            if (rank[i] < k)
                room += s.bytes[swappable[i % NSW]];
        p.gpu_bytes = room;
        struct fy_actplan *a;
        assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
        for (int l = 0; l < L; l++)
            assert_int_equal(fy_actplan_at(a, l, FY_ACT_CKPT), FY_ACT_GPU);
        for (int i = 0; i < NC; i++)
            assert_int_equal(fy_actplan_at(a, i / NSW, swappable[i % NSW]),
                             rank[i] < k ? FY_ACT_GPU : FY_ACT_RECOMPUTE);
        assert_int_equal(a->pred.bytes[FY_ACT_GPU], room);
        fy_actplan_destroy(&a);
    }
}

/* ---- random profiles ---- */

static double urand(uint64_t *seed, double lo, double hi)
{
    return lo + (hi - lo) * (double)(fy_test_rand(seed) >> 11) / 9007199254740992.0;
}

/* log-uniform in [lo, hi] */
static double lrand(uint64_t *seed, double lo, double hi)
{
    return exp(urand(seed, log(lo), log(hi)));
}

/* A random profile of L layers for sizes s, budgets from none to everything. */
static void random_profile(uint64_t *seed, struct fy_actplan_profile *p,
                           struct fy_actplan_layer_prof *lp, int L, const struct fy_actplan_sizes *s)
{
    base_profile(p, lp, L);
    uint64_t layer = sum_bytes(s, 1, 1), total = (uint64_t)L * layer;
    double bw = lrand(seed, 1e3, 1e6); /* bytes/s against a layer of ~1e5 bytes, ~1 s compute */
    p->h2d_Bps = bw * urand(seed, 0.5, 1.5);
    p->d2h_Bps = bw * urand(seed, 0.5, 1.5);
    p->duplex_Bps = (p->h2d_Bps + p->d2h_Bps) * urand(seed, 0.5, 1.0);
    p->ssd_read_Bps = bw * lrand(seed, 0.01, 1);
    p->ssd_write_Bps = p->ssd_read_Bps * urand(seed, 0.5, 1.5);
    struct fy_actplan_other *o[2] = {&p->fwd, &p->bwd};
    for (int i = 0; i < 2; i++) {
        o[i]->h2d = (uint64_t)urand(seed, 0, (double)total);
        o[i]->d2h = (uint64_t)urand(seed, 0, (double)total);
        o[i]->ssd_read = (uint64_t)urand(seed, 0, (double)total);
        o[i]->ssd_write = (uint64_t)urand(seed, 0, (double)total);
        o[i]->gpu_s = urand(seed, 0, 1);
        o[i]->opt_s = i ? urand(seed, 0, 3.0 * L) : urand(seed, 0, 0.5);
    }
    for (int l = 0; l < L; l++) {
        lp[l].fwd_s = urand(seed, 0.5, 1.5);
        lp[l].bwd_s = 2 * lp[l].fwd_s * urand(seed, 0.8, 1.2);
        for (int k = 1; k < K; k++)
            lp[l].recompute_s[k] = lp[l].fwd_s * urand(seed, 0, 0.5) * (fy_test_rand(seed) % 8 != 0);
    }
    /* budgets: 0, a fraction, or everything */
    uint64_t *b[2] = {&p->gpu_bytes, &p->host_bytes};
    for (int i = 0; i < 2; i++) {
        unsigned r = (unsigned)(fy_test_rand(seed) % 4);
        *b[i] = r == 0 ? 0 : r == 3 ? UINT64_MAX : (uint64_t)urand(seed, 0, 1.2 * (double)total);
    }
    unsigned r = (unsigned)(fy_test_rand(seed) % 4);
    p->ssd_bytes = r == 0 ? (uint64_t)urand(seed, 0, (double)total) : UINT64_MAX;
}

static void random_sizes(uint64_t *seed, struct fy_actplan_sizes *s)
{
    if (fy_test_rand(seed) % 2) {
        struct fy_model_config c = {.n_layer = 1, .n_head = 1u << (fy_test_rand(seed) % 4),
                                  .n_embd = 64, .vocab = 256, .ctx = 1024};
        c.n_embd = 16u * (1 + (unsigned)(fy_test_rand(seed) % 8));
        int B = 1 + (int)(fy_test_rand(seed) % 4), T = 16 << (fy_test_rand(seed) % 3);
        assert_int_equal(fy_actplan_sizes_gpt(&c, B, T, 2 + 2 * (int)(fy_test_rand(seed) % 2), s), 0);
    } else { /* arbitrary sizes, to exercise the packing */
        for (int k = 0; k < K; k++)
            s->bytes[k] = 1000 + fy_test_rand(seed) % 40000;
    }
}

/* Auto never exceeds a budget, agrees with a fresh prediction of its own placement, and is no
 * slower than any forced mode that fits; a forced mode refused really does not fit. */
static void test_random_budgets(void **state)
{
    uint64_t seed = 20240611;
    int forced_fit = 0, forced_refused = 0, auto_refused = 0;
    for (int iter = 0; iter < 400; iter++) {
        int L = 1 + (int)(fy_test_rand(&seed) % MAXL);
        struct fy_actplan_sizes s;
        random_sizes(&seed, &s);
        struct fy_actplan_layer_prof lp[MAXL];
        struct fy_actplan_profile p;
        random_profile(&seed, &p, lp, L, &s);
        struct fy_actplan *a = NULL;
        int rc = quiet_new(&a, &p, &s, FY_ACTPLAN_AUTO);
        if (rc == -ENOSPC) { /* only when the checkpoints alone cannot be placed */
            auto_refused++;
            uint64_t ck = s.bytes[FY_ACT_CKPT];
            int fits = 1;
            uint64_t g = p.gpu_bytes, h = p.host_bytes, d = p.ssd_bytes;
            for (int l = 0; l < L && fits; l++) {
                if (g >= ck)
                    g -= ck;
                else if (h >= ck)
                    h -= ck;
                else if (d >= ck)
                    d -= ck;
                else
                    fits = 0;
            }
            assert_false(fits);
            continue;
        }
        assert_int_equal(rc, 0);
        assert_true(fy_actplan_fits(&p, &a->pred));
        struct fy_actplan_pred again;
        assert_int_equal(fy_actplan_predict(&p, &s, a->place, &again), 0);
        assert_near(again.step_s, a->pred.step_s, 0);
        for (int m = FY_ACTPLAN_RECOMPUTE; m <= FY_ACTPLAN_SSD; m++) {
            struct fy_actplan *f = NULL;
            rc = quiet_new(&f, &p, &s, (enum fy_actplan_mode)m);
            if (rc == -ENOSPC) {
                forced_refused++;
                continue;
            }
            assert_int_equal(rc, 0);
            forced_fit++;
            assert_true(fy_actplan_fits(&p, &f->pred));
            assert_int_equal(f->pred.bytes[FY_ACT_GPU], 0);
            if (!(a->pred.step_s <= f->pred.step_s * (1 + 1e-12))) {
                fprintf(stderr, "iteration %d: auto %.9g s > %s %.9g s\n", iter, a->pred.step_s,
                        fy_actplan_mode_name(m), f->pred.step_s);
                fail();
            }
            fy_actplan_destroy(&f);
        }
        fy_actplan_destroy(&a);
    }
    printf("# 400 random profiles: auto refused %d (checkpoints fit nowhere), forced modes fit %d, "
           "refused %d\n",
           auto_refused, forced_fit, forced_refused);
    assert_true(forced_fit > 200 && forced_refused > 50); /* both branches were exercised */
}

/* ---- brute force over every placement of two layers ---- */

struct brute {
    const struct fy_actplan_profile *p;
    const struct fy_actplan_sizes *s;
    unsigned char place[2 * K];
    int slot[2 * (1 + NSW)]; /* place indices to enumerate */
    double best;
    long evaluated;
};

static void brute_rec(struct brute *b, int i, uint64_t g, uint64_t h, uint64_t d)
{
    if (g > b->p->gpu_bytes || h > b->p->host_bytes || d > b->p->ssd_bytes)
        return; /* bytes only grow down the tree */
    if (i == 2 * (1 + NSW)) {
        struct fy_actplan_pred pr;
        assert_int_equal(fy_actplan_predict(b->p, b->s, b->place, &pr), 0);
        b->evaluated++;
        if (pr.step_s < b->best)
            b->best = pr.step_s;
        return;
    }
    int at = b->slot[i], k = at % K;
    uint64_t by = b->s->bytes[k];
    for (int pl = 0; pl < FY_ACT_PLACES; pl++) {
        if (!fy_actplan_allowed(k, pl))
            continue;
        b->place[at] = (unsigned char)pl;
        brute_rec(b, i + 1, g + (pl == FY_ACT_GPU ? by : 0), h + (pl == FY_ACT_HOST ? by : 0),
                  d + (pl == FY_ACT_SSD ? by : 0));
    }
}

static double brute_force(const struct fy_actplan_profile *p, const struct fy_actplan_sizes *s,
                          long *evaluated)
{
    struct brute b = {.p = p, .s = s, .best = INFINITY};
    int n = 0;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < K; k++) {
            b.place[l * K + k] = FY_ACT_RECOMPUTE;
            if (k == FY_ACT_CKPT || fy_actplan_kind_swappable(k))
                b.slot[n++] = l * K + k;
        }
    brute_rec(&b, 0, 0, 0, 0);
    *evaluated = b.evaluated;
    return b.best;
}

/* The bound stated in actplan.h. */
static double stated_bound(const struct fy_actplan_profile *p, const struct fy_actplan_sizes *s)
{
    double bmax = (double)s->bytes[FY_ACT_CKPT], smax = 0;
    for (int l = 0; l < p->n_layer; l++)
        for (int i = 0; i < NSW; i++) {
            double sv = p->layer[l].recompute_s[swappable[i]];
            if (sv > 0) {
                smax = fmax(smax, sv);
                bmax = fmax(bmax, (double)s->bytes[swappable[i]]);
            }
        }
    double f = fmax(fmax(bmax / p->d2h_Bps, bmax / p->duplex_Bps), 2 * bmax / p->ssd_write_Bps);
    double b = fmax(fmax(smax, bmax / p->h2d_Bps), fmax(bmax / p->duplex_Bps, 2 * bmax / p->ssd_read_Bps));
    if (p->mem_Bps > 0) {
        f = fmax(f, 3 * bmax / p->mem_Bps);
        b = fmax(b, 3 * bmax / p->mem_Bps);
    }
    return f + b;
}

static void test_brute_force(void **state)
{
    uint64_t seed = 99;
    int exact = 0, n = 0;
    double worst = 0, worst_bound = 0;
    long evaluated = 0;
    clock_t t0 = clock();
    for (int iter = 0; iter < 16; iter++) {
        struct fy_actplan_sizes s;
        random_sizes(&seed, &s);
        struct fy_actplan_layer_prof lp[2];
        struct fy_actplan_profile p;
        random_profile(&seed, &p, lp, 2, &s);
        p.ssd_bytes = UINT64_MAX; /* the bound assumes unlimited SSD room */
        if (iter % 2) { /* host memory too, from a seed of its own (the others' draws unchanged) */
            uint64_t mseed = 7 + (uint64_t)iter;
            p.mem_Bps = (p.h2d_Bps + p.d2h_Bps) * urand(&mseed, 0.5, 3);
            p.fwd.mem = (uint64_t)urand(&mseed, 0, 2.0 * (double)sum_bytes(&s, 1, 1));
            p.bwd.mem = (uint64_t)urand(&mseed, 0, 6.0 * (double)sum_bytes(&s, 1, 1));
        }
        /* budgets that bind: a fraction of the two layers' bytes */
        uint64_t total = 2 * sum_bytes(&s, 1, 1);
        p.gpu_bytes = iter % 5 == 0 ? 0 : (uint64_t)urand(&seed, 0, 0.7 * (double)total);
        p.host_bytes = iter % 7 == 0 ? 0 : (uint64_t)urand(&seed, 0, 0.7 * (double)total);
        struct fy_actplan *a;
        assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
        long ev;
        double opt = brute_force(&p, &s, &ev);
        evaluated += ev;
        double gap = a->pred.step_s - opt, bound = stated_bound(&p, &s);
        assert_true(gap >= -1e-12 * opt); /* nothing beats the optimum */
        if (!(gap <= bound + 1e-12 * opt)) {
            char buf[2048];
            fy_actplan_describe(a, buf, sizeof buf);
            fprintf(stderr, "iteration %d: auto %.9g s, optimum %.9g s, bound %.9g s\n%s\n", iter,
                    a->pred.step_s, opt, bound, buf);
            fail();
        }
        n++;
        exact += gap <= 1e-9 * opt;
        if (gap / opt > worst) {
            worst = gap / opt;
            worst_bound = bound / opt;
        }
        fy_actplan_destroy(&a);
    }
    printf("# brute force, 2 layers: %d profiles, %ld placements evaluated in %.1f s; auto optimal in "
           "%d, worst gap %.3f%% of the step (its bound %.1f%%)\n",
           n, evaluated, (double)(clock() - t0) / CLOCKS_PER_SEC, exact, 100 * worst,
           100 * worst_bound);
    assert_true(exact >= n * 3 / 4); /* the bound is loose; say so if the planner drifts toward it */
}

/* A GPT-3-style 1.3B layer (C 2048, 16 heads, B 16 x T 1024, bf16) with figures of the reference
 * H200 machine (DESIGN.md 6: 460 TFLOP/s, PCIe 54/55/90 GB/s, disk 2.3/2.4 GB/s), state resident
 * in host memory, 24 GB of GPU less 12 for weights and workspace, 24 GB of pool for activations:
 * printed for every mode, auto no slower than any, and 96 such layers planned in well under a
 * second. Not a measurement: an example of the planner at full size. */
static void test_full_size(void **state)
{
    enum { LMAX = 96 };
    static struct fy_actplan_layer_prof lp[LMAX];
    struct fy_model_config c = {.n_layer = 24, .n_head = 16, .n_embd = 2048, .vocab = 50257, .ctx = 1024};
    struct fy_actplan_sizes s;
    assert_int_equal(fy_actplan_sizes_gpt(&c, 16, 1024, 2, &s), 0);
    double N = 16 * 1024.0, C = 2048, T = 1024, F = 460e12;
    for (int l = 0; l < LMAX; l++) {
        memset(&lp[l], 0, sizeof lp[l]);
        lp[l].fwd_s = (24 * N * C * C + 2 * N * T * C) / F;
        lp[l].bwd_s = 2 * lp[l].fwd_s;
        lp[l].recompute_s[FY_ACT_LN1] = lp[l].recompute_s[FY_ACT_LN2] = 4 * N * C / 3e12;
        lp[l].recompute_s[FY_ACT_QKV] = 6 * N * C * C / F;
        lp[l].recompute_s[FY_ACT_ATTN] = 2 * N * T * C / 130e12;
        lp[l].recompute_s[FY_ACT_RESID] = 2 * N * C * C / F;
        lp[l].recompute_s[FY_ACT_FC] = 8 * N * C * C / F;
        lp[l].recompute_s[FY_ACT_GELU] = 16 * N * C / 3e12;
    }
    struct fy_actplan_profile p = {
        .n_layer = 24, .layer = lp, .h2d_Bps = 54e9, .d2h_Bps = 55e9, .duplex_Bps = 90e9,
        .ssd_read_Bps = 2.3e9, .ssd_write_Bps = 2.4e9,
        .fwd = {.h2d = 24 * 100000000ull, .gpu_s = 0.01},
        .bwd = {.h2d = 24 * 100000000ull, .d2h = 24 * 200000000ull, .gpu_s = 0.02, .opt_s = 1.2},
        .gpu_bytes = 12ull << 30, .host_bytes = 24ull << 30, .ssd_bytes = UINT64_MAX};
    struct fy_actplan *a, *f;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
    char buf[2048];
    fy_actplan_describe(a, buf, sizeof buf);
    printf("# %s\n", buf);
    for (int m = FY_ACTPLAN_RECOMPUTE; m <= FY_ACTPLAN_SSD; m++) {
        assert_int_equal(fy_actplan_new(&f, &p, &s, (enum fy_actplan_mode)m), 0);
        fy_actplan_describe(f, buf, sizeof buf);
        printf("# %s\n", buf);
        assert_true(a->pred.step_s <= f->pred.step_s);
        fy_actplan_destroy(&f);
    }
    fy_actplan_destroy(&a);
    p.n_layer = LMAX;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("# %d layers planned in %.1f ms\n", LMAX, ms);
    assert_true(ms < 1000);
    fy_actplan_destroy(&a);
}

/* ---- errors and outputs ---- */

static void test_errors(void **state)
{
    struct fy_actplan_layer_prof lp[2];
    struct fy_actplan_profile p;
    base_profile(&p, lp, 2);
    struct fy_actplan_sizes s;
    gpt_sizes(&s);
    struct fy_actplan *a = NULL;
    /* nothing anywhere: even the checkpoints do not fit */
    p.ssd_bytes = 0;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), -ENOSPC);
    assert_null(a);
    /* forced host with room for all but one byte */
    p.ssd_bytes = UINT64_MAX;
    p.host_bytes = 2 * sum_bytes(&s, 1, 1) - 1;
    p.gpu_bytes = UINT64_MAX; /* forced modes do not use it */
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_HOST), -ENOSPC);
    p.host_bytes++;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_HOST), 0);
    assert_int_equal(a->pred.bytes[FY_ACT_HOST], p.host_bytes);
    fy_actplan_destroy(&a);
    /* forced ssd with limited SSD room */
    p.ssd_bytes = 2 * sum_bytes(&s, 1, 1) - 1;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_SSD), -ENOSPC);
    /* forced recompute: the checkpoints on the host */
    p.host_bytes = 2 * s.bytes[FY_ACT_CKPT];
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_RECOMPUTE), 0);
    assert_int_equal(a->pred.bytes[FY_ACT_HOST], p.host_bytes);
    assert_int_equal(a->pred.bytes[FY_ACT_GPU] + a->pred.bytes[FY_ACT_SSD], 0);
    fy_actplan_destroy(&a);
    p.host_bytes--;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_RECOMPUTE), -ENOSPC);
    /* malformed profiles */
    p.host_bytes = UINT64_MAX;
    lp[1].recompute_s[FY_ACT_FC] = -1;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), -EINVAL);
    lp[1].recompute_s[FY_ACT_FC] = NAN;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), -EINVAL);
    lp[1].recompute_s[FY_ACT_FC] = 0.1;
    p.ssd_read_Bps = 0;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), -EINVAL);
    p.ssd_read_Bps = 1e9;
    p.bwd.opt_s = INFINITY;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), -EINVAL);
    p.bwd.opt_s = 0;
    p.n_layer = 0;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), -EINVAL);
    p.n_layer = 2;
    assert_int_equal(fy_actplan_new(&a, &p, &s, (enum fy_actplan_mode)7), -EINVAL);
    assert_null(a);
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
    fy_actplan_destroy(&a);
    fy_actplan_destroy(&a);
    fy_actplan_destroy(NULL);
}

static void test_describe_json(void **state)
{
    struct fy_actplan_layer_prof lp[3];
    struct fy_actplan_profile p;
    base_profile(&p, lp, 3);
    struct fy_actplan_sizes s;
    gpt_sizes(&s);
    /* the checkpoints on the host, room on the GPU for the attention output of one layer, a slow
     * SSD: the rest is recomputed */
    p.gpu_bytes = s.bytes[FY_ACT_ATTN];
    p.host_bytes = 3 * s.bytes[FY_ACT_CKPT];
    p.h2d_Bps = p.d2h_Bps = 1e6;
    p.duplex_Bps = 1.8e6;
    p.ssd_read_Bps = p.ssd_write_Bps = 1e3;
    struct fy_actplan *a;
    assert_int_equal(fy_actplan_new(&a, &p, &s, FY_ACTPLAN_AUTO), 0);
    char buf[2048];
    fy_actplan_describe(a, buf, sizeof buf);
    printf("# %s\n", buf);
    assert_non_null(strstr(buf, "activations (auto)"));
    assert_non_null(strstr(buf, "predicted step"));
    assert_non_null(strstr(buf, "-bound"));
    assert_non_null(strstr(buf, "ckpt 0/3/0/0"));
    assert_non_null(strstr(buf, "attn 1/0/0/2"));
    assert_non_null(strstr(buf, "fc 0/0/0/3"));
    char small[16];
    fy_actplan_describe(a, small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);

    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(fy_actplan_write_json(a, f), 0);
    long len = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)len + 1);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "mode")->valuestring, "auto");
    assert_int_equal(cJSON_GetObjectItem(root, "n_layer")->valueint, 3);
    const cJSON *pred = cJSON_GetObjectItem(root, "predicted");
    assert_near(cJSON_GetObjectItem(pred, "step_s")->valuedouble, a->pred.step_s, 1e-12 * a->pred.step_s);
    const cJSON *bwd = cJSON_GetObjectItem(pred, "backward");
    assert_string_equal(cJSON_GetObjectItem(bwd, "bound")->valuestring,
                        fy_actplan_res_name(a->pred.bwd.bound));
    assert_near(cJSON_GetObjectItem(cJSON_GetObjectItem(pred, "bytes"), "gpu")->valuedouble,
                (double)a->pred.bytes[FY_ACT_GPU], 0);
    const cJSON *layers = cJSON_GetObjectItem(root, "layers");
    assert_int_equal(cJSON_GetArraySize(layers), 3);
    for (int l = 0; l < 3; l++)
        for (int k = 0; k < K; k++)
            assert_string_equal(
                cJSON_GetObjectItem(cJSON_GetArrayItem(layers, l), fy_actplan_kind_name(k))->valuestring,
                fy_actplan_place_name(fy_actplan_at(a, l, k)));
    assert_near(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "layer_bytes"), "fc")->valuedouble,
                (double)s.bytes[FY_ACT_FC], 0);
    cJSON_Delete(root);
    free(text);
    fy_actplan_destroy(&a);
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_parse),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_recompute_walk),
        cmocka_unit_test(test_cost_by_hand),
        cmocka_unit_test(test_infinite_bandwidth),
        cmocka_unit_test(test_no_host_slow_ssd),
        cmocka_unit_test(test_ample_gpu),
        cmocka_unit_test(test_gpu_fits_k_best),
        cmocka_unit_test(test_random_budgets),
        cmocka_unit_test(test_brute_force),
        cmocka_unit_test(test_full_size),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_describe_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
