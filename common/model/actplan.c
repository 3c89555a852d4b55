/* Activation placement for GPT training: kind sizes, the recompute dependency walk, the per-phase
 * cost model and the planner (forced modes and the ranked-prefix scan of auto). See actplan.h. */
#include "common/model/actplan.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/log.h"

static const char *const kind_names[FY_ACT_KINDS] = {"ckpt", "ln1",   "qkv", "attn",
                                                      "resid", "ln2", "fc",  "gelu"};
static const char *const place_names[FY_ACT_PLACES] = {"gpu", "host", "ssd", "recompute"};
static const char *const mode_names[] = {"auto", "recompute", "host", "ssd"};
static const char *const res_names[FY_RES_COUNT] = {"gpu", "h2d", "d2h", "pcie", "ssd", "opt",
                                                     "mem"};

/* The forward op producing each kind: its inputs (kinds, -1 ends) and whether the backward reads
 * its output. Ops are listed in forward order, so consumers come after their inputs. */
static const struct {
    int in[2];
    int bwd_reads;
} op_table[FY_ACT_KINDS] = {
    [FY_ACT_CKPT] = {{-1, -1}, 1},
    [FY_ACT_LN1] = {{FY_ACT_CKPT, -1}, 1},
    [FY_ACT_QKV] = {{FY_ACT_LN1, -1}, 1},
    [FY_ACT_ATTN] = {{FY_ACT_QKV, -1}, 1},
    [FY_ACT_RESID] = {{FY_ACT_ATTN, FY_ACT_CKPT}, 1},
    [FY_ACT_LN2] = {{FY_ACT_RESID, -1}, 1},
    [FY_ACT_FC] = {{FY_ACT_LN2, -1}, 1},
    [FY_ACT_GELU] = {{FY_ACT_FC, -1}, 1},
};

const char *fy_actplan_kind_name(int kind)
{
    return kind >= 0 && kind < FY_ACT_KINDS ? kind_names[kind] : "unknown";
}

const char *fy_actplan_place_name(int place)
{
    return place >= 0 && place < FY_ACT_PLACES ? place_names[place] : "unknown";
}

const char *fy_actplan_mode_name(int mode)
{
    return mode >= 0 && mode <= FY_ACTPLAN_SSD ? mode_names[mode] : "unknown";
}

const char *fy_actplan_res_name(int res)
{
    return res >= 0 && res < FY_RES_COUNT ? res_names[res] : "unknown";
}

int fy_actplan_mode_parse(const char *text, enum fy_actplan_mode *out)
{
    for (int m = 0; text != NULL && m <= FY_ACTPLAN_SSD; m++)
        if (strcmp(text, mode_names[m]) == 0) {
            *out = (enum fy_actplan_mode)m;
            return 0;
        }
    fy_error("--act-plan %s: expected auto, recompute, host or ssd", text ? text : "(null)");
    return -EINVAL;
}

int fy_actplan_kind_swappable(int kind)
{
    return kind == FY_ACT_QKV || kind == FY_ACT_ATTN || kind == FY_ACT_RESID || kind == FY_ACT_FC ||
           kind == FY_ACT_GELU;
}

int fy_actplan_allowed(int kind, int place)
{
    if (kind < 0 || kind >= FY_ACT_KINDS || place < 0 || place >= FY_ACT_PLACES)
        return 0;
    if (kind == FY_ACT_CKPT)
        return place != FY_ACT_RECOMPUTE;
    if (kind == FY_ACT_LN1 || kind == FY_ACT_LN2)
        return place == FY_ACT_RECOMPUTE;
    return 1;
}

int fy_actplan_sizes_gpt(const struct fy_model_config *c, int B, int T, int elem_bytes,
                         struct fy_actplan_sizes *out)
{
    FY_REQUIRE(c != NULL && c->n_embd > 0 && c->n_head > 0, -EINVAL,
               "activation sizes: no model configuration");
    FY_REQUIRE(B > 0 && T > 0, -EINVAL, "activation sizes: batch %d x sequence %d is not positive",
               B, T);
    FY_REQUIRE(elem_bytes == 2 || elem_bytes == 4, -EINVAL,
               "activation sizes: element size %d bytes: expected 2 (bf16) or 4 (f32)", elem_bytes);
    uint64_t N = (uint64_t)B * (uint64_t)T, C = c->n_embd, e = (uint64_t)elem_bytes, f = 4;
    uint64_t NC = N * C * e;
    out->bytes[FY_ACT_CKPT] = NC;
    out->bytes[FY_ACT_LN1] = NC + 2 * N * f;
    out->bytes[FY_ACT_QKV] = 3 * NC;
    out->bytes[FY_ACT_ATTN] = NC + N * c->n_head * f; /* atty, and logsumexp per row and head */
    out->bytes[FY_ACT_RESID] = NC;
    out->bytes[FY_ACT_LN2] = NC + 2 * N * f;
    out->bytes[FY_ACT_FC] = 4 * NC;
    out->bytes[FY_ACT_GELU] = 4 * NC;
    return 0;
}

int fy_actplan_sizes_backend(const struct fy_model_config *c, int B, int T, const char *backend,
                             struct fy_actplan_sizes *out)
{
    int cpu = backend != NULL && strcmp(backend, "cpu") == 0;
    FY_REQUIRE(cpu || (backend != NULL && strcmp(backend, "cuda") == 0), -EINVAL,
               "activation sizes: backend %s: expected cpu or cuda", backend ? backend : "(none)");
    FY_TRY(fy_actplan_sizes_gpt(c, B, T, cpu ? 4 : 2, out));
    if (cpu) /* atty, then the softmax probabilities */
        out->bytes[FY_ACT_ATTN] = (uint64_t)B * T * c->n_embd * 4 +
                                  (uint64_t)B * c->n_head * (uint64_t)T * (uint64_t)T * 4;
    return 0;
}

int fy_actplan_region_of(const struct fy_actplan_sizes *s, unsigned mask,
                         struct fy_actplan_region *out)
{
    FY_REQUIRE((mask & ~FY_ACT_SWAPPABLE) == 0, -EINVAL,
               "saved region: kinds 0x%x include some that are never swapped (0x%x)", mask,
               mask & ~FY_ACT_SWAPPABLE);
    memset(out, 0, sizeof *out);
    uint64_t at = 0;
    for (int k = 0; k < FY_ACT_KINDS; k++)
        if (mask & FY_ACT_BIT(k)) {
            out->offset[k] = at;
            at += (s->bytes[k] + 4095) / 4096 * 4096;
        }
    out->bytes = at;
    return 0;
}

unsigned fy_actplan_mask(const unsigned char *place, int layer, int where)
{
    unsigned mask = 0;
    for (int k = 0; place != NULL && k < FY_ACT_KINDS; k++)
        if (fy_actplan_kind_swappable(k) && place[layer * FY_ACT_KINDS + k] == where)
            mask |= FY_ACT_BIT(k);
    return mask;
}

static int time_ok(double t) { return isfinite(t) && t >= 0; }
static int rate_ok(double r) { return !isnan(r) && r > 0; }

int fy_actplan_profile_check(const struct fy_actplan_profile *p)
{
    FY_REQUIRE(p != NULL && p->n_layer > 0 && p->layer != NULL, -EINVAL,
               "activation profile: no layers (n_layer %d)", p ? p->n_layer : 0);
    const struct {
        const char *name;
        double v;
    } rates[] = {{"PCIe host-to-device", p->h2d_Bps},  {"PCIe device-to-host", p->d2h_Bps},
                 {"PCIe both ways", p->duplex_Bps},    {"SSD read", p->ssd_read_Bps},
                 {"SSD write", p->ssd_write_Bps}};
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
        FY_REQUIRE(rate_ok(rates[i].v), -EINVAL,
                   "activation profile: %s bandwidth %g B/s: must be positive", rates[i].name,
                   rates[i].v);
    FY_REQUIRE(p->mem_Bps == 0 || rate_ok(p->mem_Bps), -EINVAL,
               "activation profile: host memory bandwidth %g B/s: must be positive, or 0 (not "
               "modelled)", p->mem_Bps);
    FY_REQUIRE(time_ok(p->fwd.gpu_s) && time_ok(p->fwd.opt_s) && time_ok(p->bwd.gpu_s) &&
                   time_ok(p->bwd.opt_s),
               -EINVAL, "activation profile: a GPU or optimizer time outside the blocks is not a "
                        "finite non-negative number");
    for (int l = 0; l < p->n_layer; l++) {
        const struct fy_actplan_layer_prof *lp = &p->layer[l];
        int ok = time_ok(lp->fwd_s) && time_ok(lp->bwd_s);
        for (int k = 0; k < FY_ACT_KINDS; k++)
            ok = ok && time_ok(lp->recompute_s[k]);
        FY_REQUIRE(ok, -EINVAL,
                   "activation profile: layer %d: a forward, backward or recompute time is not a "
                   "finite non-negative number",
                   l);
    }
    return 0;
}

double fy_actplan_recompute_s(const struct fy_actplan_layer_prof *lp, const unsigned char *kept)
{
    unsigned char run[FY_ACT_KINDS] = {0};
    double t = 0;
    /* Reverse forward order: every consumer's decision is known before its inputs'. */
    for (int k = FY_ACT_KINDS - 1; k > FY_ACT_CKPT; k--) {
        int need = op_table[k].bwd_reads;
        for (int c = k + 1; c < FY_ACT_KINDS && !need; c++)
            need = run[c] && (op_table[c].in[0] == k || op_table[c].in[1] == k);
        run[k] = need && !kept[k];
        if (run[k])
            t += lp->recompute_s[k];
    }
    return t;
}

static double xfer(uint64_t bytes, double rate) { return bytes == 0 ? 0 : (double)bytes / rate; }

static void phase_max(struct fy_actplan_phase *ph)
{
    ph->s = 0;
    ph->bound = FY_RES_GPU;
    for (int r = 0; r < FY_RES_COUNT; r++)
        if (ph->res_s[r] > ph->s) {
            ph->s = ph->res_s[r];
            ph->bound = r;
        }
}

/* The cost model from totals: A bytes off the GPU (host or SSD), S of them on the SSD, R seconds of
 * recomputation, sum_fwd and sum_bwd the blocks' compute. Leaves out->bytes alone. */
static void model(const struct fy_actplan_profile *p, double sum_fwd, double sum_bwd, uint64_t A,
                  uint64_t S, double R, struct fy_actplan_pred *out)
{
    const struct fy_actplan_other *o = &p->fwd;
    struct fy_actplan_phase *f = &out->fwd;
    f->res_s[FY_RES_GPU] = sum_fwd + o->gpu_s;
    f->res_s[FY_RES_D2H] = xfer(A + o->d2h, p->d2h_Bps);
    f->res_s[FY_RES_H2D] = xfer(o->h2d, p->h2d_Bps);
    f->res_s[FY_RES_PCIE] = xfer(A + o->d2h + o->h2d, p->duplex_Bps);
    f->res_s[FY_RES_SSD] = xfer(S + o->ssd_write, p->ssd_write_Bps) + xfer(o->ssd_read, p->ssd_read_Bps);
    f->res_s[FY_RES_OPT] = o->opt_s;
    f->res_s[FY_RES_MEM] = p->mem_Bps > 0 ? xfer(A + S + o->mem, p->mem_Bps) : 0;
    phase_max(f);

    o = &p->bwd;
    struct fy_actplan_phase *b = &out->bwd;
    b->res_s[FY_RES_GPU] = sum_bwd + o->gpu_s + R;
    b->res_s[FY_RES_H2D] = xfer(A + o->h2d, p->h2d_Bps);
    b->res_s[FY_RES_D2H] = xfer(o->d2h, p->d2h_Bps);
    b->res_s[FY_RES_PCIE] = xfer(A + o->h2d + o->d2h, p->duplex_Bps);
    b->res_s[FY_RES_SSD] = xfer(S + o->ssd_read, p->ssd_read_Bps) + xfer(o->ssd_write, p->ssd_write_Bps);
    b->res_s[FY_RES_OPT] = o->opt_s;
    b->res_s[FY_RES_MEM] = p->mem_Bps > 0 ? xfer(A + S + o->mem, p->mem_Bps) : 0;
    phase_max(b);

    out->step_s = f->s + b->s;
    out->recompute_s = R;
}

static void sum_blocks(const struct fy_actplan_profile *p, double *fwd, double *bwd)
{
    *fwd = *bwd = 0;
    for (int l = 0; l < p->n_layer; l++) {
        *fwd += p->layer[l].fwd_s;
        *bwd += p->layer[l].bwd_s;
    }
}

int fy_actplan_predict(const struct fy_actplan_profile *p, const struct fy_actplan_sizes *s,
                       const unsigned char *place, struct fy_actplan_pred *out)
{
    FY_TRY(fy_actplan_profile_check(p));
    memset(out, 0, sizeof *out);
    double R = 0;
    for (int l = 0; l < p->n_layer; l++) {
        unsigned char kept[FY_ACT_KINDS];
        for (int k = 0; k < FY_ACT_KINDS; k++) {
            int pl = place[l * FY_ACT_KINDS + k];
            FY_REQUIRE(fy_actplan_allowed(k, pl), -EINVAL,
                       "activation plan: layer %d: %s cannot be placed %s", l,
                       fy_actplan_kind_name(k), fy_actplan_place_name(pl));
            kept[k] = pl != FY_ACT_RECOMPUTE;
            out->bytes[pl] += s->bytes[k];
        }
        R += fy_actplan_recompute_s(&p->layer[l], kept);
    }
    double sf, sb;
    sum_blocks(p, &sf, &sb);
    model(p, sf, sb, out->bytes[FY_ACT_HOST] + out->bytes[FY_ACT_SSD], out->bytes[FY_ACT_SSD], R, out);
    return 0;
}

int fy_actplan_fits(const struct fy_actplan_profile *p, const struct fy_actplan_pred *pred)
{
    return pred->bytes[FY_ACT_GPU] <= p->gpu_bytes && pred->bytes[FY_ACT_HOST] <= p->host_bytes &&
           pred->bytes[FY_ACT_SSD] <= p->ssd_bytes;
}

/* ---- the planner ---- */

static void fmt_cap(uint64_t bytes, char *buf, size_t len)
{
    if (bytes == UINT64_MAX)
        snprintf(buf, len, "unlimited");
    else
        fy_format_size(bytes, buf, len);
}

struct item {
    int layer, kind;
    uint64_t bytes;
    double saved; /* recompute seconds saved when kept (0 for a checkpoint) */
};

static int item_rank(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    /* saved/bytes descending, compared as products to stay exact for equal ratios */
    double lx = x->saved * (double)y->bytes, ly = y->saved * (double)x->bytes;
    if (lx != ly)
        return lx > ly ? -1 : 1;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return x->kind < y->kind ? -1 : x->kind > y->kind;
}

/* Running totals of a placement under construction. */
struct totals {
    uint64_t bytes[FY_ACT_PLACES];
    double R;
};

static int totals_fit(const struct fy_actplan_profile *p, const struct totals *t)
{
    return t->bytes[FY_ACT_GPU] <= p->gpu_bytes && t->bytes[FY_ACT_HOST] <= p->host_bytes &&
           t->bytes[FY_ACT_SSD] <= p->ssd_bytes;
}

/* A plan's score: the predicted step, then (between equal steps) the total work it puts on all
 * resources in both phases, so that idle room (a GPU waiting on the optimizer) is still used to
 * spare recomputation and traffic. */
struct score {
    double step, work;
};

static struct score totals_score(const struct fy_actplan_profile *p, double sf, double sb,
                                 const struct totals *t)
{
    struct fy_actplan_pred pr;
    model(p, sf, sb, t->bytes[FY_ACT_HOST] + t->bytes[FY_ACT_SSD], t->bytes[FY_ACT_SSD], t->R, &pr);
    struct score sc = {pr.step_s, 0};
    for (int r = 0; r < FY_RES_COUNT; r++)
        sc.work += pr.fwd.res_s[r] + pr.bwd.res_s[r];
    return sc;
}

/* a better than b, beyond rounding */
static int score_better(struct score a, struct score b)
{
    if (a.step < b.step * (1 - 1e-12))
        return 1;
    return a.step <= b.step * (1 + 1e-12) && a.work < b.work * (1 - 1e-12);
}

/* Places the items it[order[0..n)], each on the first of GPU, host, SSD with room; 0, or -1 when
 * one fits nowhere. */
static int pack(const struct fy_actplan_profile *p, const struct item *it, const int *order, int n,
                unsigned char *place, struct totals *t)
{
    const uint64_t cap[3] = {p->gpu_bytes, p->host_bytes, p->ssd_bytes};
    for (int o = 0; o < n; o++) {
        const struct item *x = &it[order[o]];
        int where = -1;
        for (int pl = FY_ACT_GPU; pl <= FY_ACT_SSD && where < 0; pl++)
            if (t->bytes[pl] <= cap[pl] && x->bytes <= cap[pl] - t->bytes[pl])
                where = pl;
        if (where < 0)
            return -1;
        t->bytes[where] += x->bytes;
        t->bytes[FY_ACT_RECOMPUTE] -= x->bytes;
        t->R -= x->saved;
        place[x->layer * FY_ACT_KINDS + x->kind] = (unsigned char)where;
    }
    return 0;
}

/* Inserts item i into order[0..n) (largest first, then by index), making it n + 1 long. */
static void order_insert(const struct item *it, int *order, int n, int i)
{
    int at = n;
    while (at > 0 && it[order[at - 1]].bytes < it[i].bytes)
        at--;
    memmove(order + at + 1, order + at, (size_t)(n - at) * sizeof *order);
    order[at] = i;
}

static void all_recompute(int L, const struct fy_actplan_sizes *s, unsigned char *place,
                          struct totals *t)
{
    for (int l = 0; l < L; l++)
        for (int k = 0; k < FY_ACT_KINDS; k++) {
            place[l * FY_ACT_KINDS + k] = FY_ACT_RECOMPUTE;
            t->bytes[FY_ACT_RECOMPUTE] += s->bytes[k];
        }
}

/* Moves one item's bytes (and saving) between placements in t. */
static void totals_move(struct totals *t, const struct item *it, int from, int to)
{
    t->bytes[from] -= it->bytes;
    t->bytes[to] += it->bytes;
    if (from == FY_ACT_RECOMPUTE)
        t->R -= it->saved;
    if (to == FY_ACT_RECOMPUTE)
        t->R += it->saved;
}

/* The auto planner's search: its items, the best placement found so far with its totals and
 * score. */
struct search {
    const struct fy_actplan_profile *p;
    const struct fy_actplan_sizes *s;
    struct item *it;
    int n, nck;    /* items, the first nck of them the checkpoints */
    double R0;     /* the recompute time with nothing kept */
    double sf, sb; /* the blocks' forward and backward time */
    unsigned char *place;
    struct totals bt;
    struct score best;
};

/* The items: the checkpoints first (mandatory), then the candidates that save recompute time,
 * ranked. */
static void search_items(struct search *x)
{
    const struct fy_actplan_profile *p = x->p;
    const struct fy_actplan_sizes *s = x->s;
    int L = p->n_layer;
    struct item *it = x->it;
    double R0 = 0;
    unsigned char none[FY_ACT_KINDS] = {0};
    int n = 0;
    for (int l = 0; l < L; l++) {
        it[n++] = (struct item){l, FY_ACT_CKPT, s->bytes[FY_ACT_CKPT], 0};
        R0 += fy_actplan_recompute_s(&p->layer[l], none);
    }
    int nck = n;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < FY_ACT_KINDS; k++) {
            if (!fy_actplan_kind_swappable(k) || s->bytes[k] == 0)
                continue;
            unsigned char only[FY_ACT_KINDS] = {0};
            only[k] = 1;
            double saved = fy_actplan_recompute_s(&p->layer[l], none) -
                           fy_actplan_recompute_s(&p->layer[l], only);
            if (saved > 0)
                it[n++] = (struct item){l, k, s->bytes[k], saved};
        }
    qsort(it + nck, (size_t)(n - nck), sizeof *it, item_rank);
    x->n = n;
    x->nck = nck;
    x->R0 = R0;
}

/* The best of the ranking's prefixes, each packed largest item first (first-fit decreasing), which
 * fills the GPU and the host closer than the ranking's order would; x->best stays infinite where
 * the checkpoints alone do not fit. order and trial: room for every item, every placement. */
static void search_prefixes(struct search *x, int *order, unsigned char *trial)
{
    const struct fy_actplan_profile *p = x->p;
    int L = p->n_layer, n = x->n, nck = x->nck;
    for (int i = 0; i < nck; i++)
        order[i] = i;
    for (int k = 0; k <= n - nck; k++) {
        if (k > 0)
            order_insert(x->it, order, nck + k - 1, nck + k - 1);
        struct totals t = {{0}, x->R0};
        all_recompute(L, x->s, trial, &t);
        if (pack(p, x->it, order, nck + k, trial, &t) < 0) {
            if (k == 0)
                break; /* the checkpoints alone do not fit */
            continue;
        }
        struct score sc = totals_score(p, x->sf, x->sb, &t);
        if (score_better(sc, x->best)) {
            x->best = sc;
            x->bt = t;
            memcpy(x->place, trial, (size_t)L * FY_ACT_KINDS);
        }
    }
}

/* Moves of single items to another place, each kept where it helps; 1 if one did. */
static int search_moves(struct search *x)
{
    int improved = 0;
    for (int i = 0; i < x->n; i++) {
        const struct item *it = &x->it[i];
        unsigned char *at = &x->place[it->layer * FY_ACT_KINDS + it->kind];
        for (int to = 0; to < FY_ACT_PLACES; to++) {
            if (to == *at || !fy_actplan_allowed(it->kind, to))
                continue;
            struct totals t = x->bt;
            totals_move(&t, it, *at, to);
            if (!totals_fit(x->p, &t))
                continue;
            struct score sc = totals_score(x->p, x->sf, x->sb, &t);
            if (score_better(sc, x->best)) {
                x->best = sc;
                x->bt = t;
                *at = (unsigned char)to;
                improved = 1;
            }
        }
    }
    return improved;
}

/* Exchanges of two items' places, each kept where it helps; 1 if one did. */
static int search_exchanges(struct search *x)
{
    int improved = 0;
    const struct item *it = x->it;
    for (int i = 0; i < x->n; i++)
        for (int j = i + 1; j < x->n; j++) {
            unsigned char *a = &x->place[it[i].layer * FY_ACT_KINDS + it[i].kind];
            unsigned char *b = &x->place[it[j].layer * FY_ACT_KINDS + it[j].kind];
            if (*a == *b || (it[i].bytes == it[j].bytes && it[i].saved == it[j].saved) ||
                !fy_actplan_allowed(it[i].kind, *b) || !fy_actplan_allowed(it[j].kind, *a))
                continue;
            struct totals t = x->bt;
            totals_move(&t, &it[i], *a, *b);
            totals_move(&t, &it[j], *b, *a);
            if (!totals_fit(x->p, &t))
                continue;
            struct score sc = totals_score(x->p, x->sf, x->sb, &t);
            if (score_better(sc, x->best)) {
                x->best = sc;
                x->bt = t;
                unsigned char c = *a;
                *a = *b;
                *b = c;
                improved = 1;
            }
        }
    return improved;
}

static int plan_auto(const struct fy_actplan_profile *p, const struct fy_actplan_sizes *s,
                     unsigned char *place)
{
    int L = p->n_layer, rc = 0;
    struct search x = {
        .p = p, .s = s, .place = place, .bt = {{0}, 0}, .best = {INFINITY, INFINITY}};
    x.it = calloc((size_t)L * FY_ACT_KINDS, sizeof *x.it);
    int *order = calloc((size_t)L * FY_ACT_KINDS, sizeof *order);
    unsigned char *trial = malloc((size_t)L * FY_ACT_KINDS);
    FY_REQUIRE_OUT(rc, x.it != NULL && order != NULL && trial != NULL, -ENOMEM,
                   "activation plan: out of memory for %d layers", L);
    search_items(&x);
    sum_blocks(p, &x.sf, &x.sb);
    search_prefixes(&x, order, trial);
    if (!isfinite(x.best.step)) {
        char ck[32], g[32], h[32], d[32];
        fy_format_size(s->bytes[FY_ACT_CKPT], ck, sizeof ck);
        fmt_cap(p->gpu_bytes, g, sizeof g);
        fmt_cap(p->host_bytes, h, sizeof h);
        fmt_cap(p->ssd_bytes, d, sizeof d);
        fy_error("activation plan auto: the checkpoints (%d layers x %s) do not fit in GPU %s, host "
                 "%s and SSD %s available for activations",
                 L, ck, g, h, d);
        rc = -ENOSPC;
        goto out;
    }
    /* Then single moves, and exchanges of two items' placements, while they help. The items hold
     * every (layer, kind) whose placement matters (the others save nothing kept). */
    for (int pass = 0, improved = 1; improved && pass < 64; pass++) {
        improved = search_moves(&x);
        improved |= search_exchanges(&x);
    }
out:
    free(x.it);
    free(order);
    free(trial);
    return rc;
}

static int plan_forced(const struct fy_actplan_profile *p, const struct fy_actplan_sizes *s,
                       enum fy_actplan_mode mode, unsigned char *place)
{
    int ck = mode == FY_ACTPLAN_SSD ? FY_ACT_SSD : FY_ACT_HOST;
    int sw = mode == FY_ACTPLAN_RECOMPUTE ? FY_ACT_RECOMPUTE : ck;
    for (int l = 0; l < p->n_layer; l++)
        for (int k = 0; k < FY_ACT_KINDS; k++)
            place[l * FY_ACT_KINDS + k] = (unsigned char)(k == FY_ACT_CKPT                ? ck
                                                          : fy_actplan_kind_swappable(k) ? sw
                                                                                         : FY_ACT_RECOMPUTE);
    return 0;
}

int fy_actplan_new(struct fy_actplan **out, const struct fy_actplan_profile *p,
                   const struct fy_actplan_sizes *s, enum fy_actplan_mode mode)
{
    *out = NULL;
    FY_TRY(fy_actplan_profile_check(p));
    FY_REQUIRE(mode >= FY_ACTPLAN_AUTO && mode <= FY_ACTPLAN_SSD, -EINVAL,
               "activation plan: unknown mode %d", (int)mode);
    struct fy_actplan *a = calloc(1, sizeof *a);
    unsigned char *place = malloc((size_t)p->n_layer * FY_ACT_KINDS);
    if (a == NULL || place == NULL) {
        free(a);
        free(place);
        fy_error("activation plan: out of memory for %d layers", p->n_layer);
        return -ENOMEM;
    }
    int rc = mode == FY_ACTPLAN_AUTO ? plan_auto(p, s, place) : plan_forced(p, s, mode, place);
    if (rc == 0)
        rc = fy_actplan_predict(p, s, place, &a->pred);
    if (rc == 0 && !fy_actplan_fits(p, &a->pred)) {
        const char *what[3] = {"GPU memory", "host memory", "SSD room"};
        const uint64_t cap[3] = {p->gpu_bytes, p->host_bytes, p->ssd_bytes};
        int pl = a->pred.bytes[FY_ACT_GPU] > cap[0] ? 0 : a->pred.bytes[FY_ACT_HOST] > cap[1] ? 1 : 2;
        char need[32], have[32];
        fy_format_size(a->pred.bytes[pl], need, sizeof need);
        fmt_cap(cap[pl], have, sizeof have);
        fy_error("activation plan %s: the activations of %d layers need %s (%llu bytes) of %s, "
                 "%s (%llu bytes) available",
                 fy_actplan_mode_name(mode), p->n_layer, need,
                 (unsigned long long)a->pred.bytes[pl], what[pl], have,
                 (unsigned long long)cap[pl]);
        rc = -ENOSPC;
    }
    if (rc < 0) {
        free(place);
        free(a);
        return rc;
    }
    a->mode = mode;
    a->n_layer = p->n_layer;
    a->place = place;
    a->sizes = *s;
    a->prof = *p;
    a->prof.layer = NULL;
    *out = a;
    return 0;
}

void fy_actplan_destroy(struct fy_actplan **p)
{
    if (p == NULL || *p == NULL)
        return;
    free((*p)->place);
    free(*p);
    *p = NULL;
}

/* ---- reporting ---- */

static void fmt_time(double s, char *buf, size_t len)
{
    if (s < 1)
        snprintf(buf, len, "%.1f ms", s * 1e3);
    else
        snprintf(buf, len, "%.3f s", s);
}

/* Appends to buf at *at, never past len. */
__attribute__((format(printf, 4, 5))) static void put(char *buf, size_t len, size_t *at,
                                                      const char *fmt, ...)
{
    if (*at >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    if (n > 0)
        *at = *at + (size_t)n < len ? *at + (size_t)n : len;
}

static void put_phase(char *buf, size_t len, size_t *at, const char *name,
                      const struct fy_actplan_phase *ph)
{
    char t[32];
    fmt_time(ph->s, t, sizeof t);
    put(buf, len, at, "%s %s (%s-bound;", name, t, fy_actplan_res_name(ph->bound));
    for (int r = 0; r < FY_RES_COUNT; r++) {
        fmt_time(ph->res_s[r], t, sizeof t);
        put(buf, len, at, " %s %s", fy_actplan_res_name(r), t);
    }
    put(buf, len, at, ")");
}

void fy_actplan_describe(const struct fy_actplan *p, char *buf, size_t len)
{
    size_t at = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    char b[FY_ACT_PLACES][32], t[32];
    for (int pl = 0; pl < FY_ACT_PLACES; pl++)
        fy_format_size(p->pred.bytes[pl], b[pl], sizeof b[pl]);
    fmt_time(p->pred.recompute_s, t, sizeof t);
    put(buf, len, &at, "activations (%s): gpu %s, host %s, ssd %s, recomputed %s (%s)\n",
        fy_actplan_mode_name(p->mode), b[FY_ACT_GPU], b[FY_ACT_HOST], b[FY_ACT_SSD],
        b[FY_ACT_RECOMPUTE], t);
    put(buf, len, &at, "  layers on gpu/host/ssd/recompute:");
    for (int k = 0; k < FY_ACT_KINDS; k++) {
        if (k != FY_ACT_CKPT && !fy_actplan_kind_swappable(k))
            continue;
        int cnt[FY_ACT_PLACES] = {0};
        for (int l = 0; l < p->n_layer; l++)
            cnt[fy_actplan_at(p, l, k)]++;
        put(buf, len, &at, " %s %d/%d/%d/%d", fy_actplan_kind_name(k), cnt[0], cnt[1], cnt[2], cnt[3]);
    }
    fmt_time(p->pred.step_s, t, sizeof t);
    put(buf, len, &at, "\n  predicted step %s = ", t);
    put_phase(buf, len, &at, "forward", &p->pred.fwd);
    put(buf, len, &at, " + ");
    put_phase(buf, len, &at, "backward", &p->pred.bwd);
}

static cJSON *phase_json(cJSON *parent, const char *name, const struct fy_actplan_phase *ph)
{
    cJSON *o = cJSON_AddObjectToObject(parent, name);
    if (o == NULL || !cJSON_AddNumberToObject(o, "s", ph->s) ||
        !cJSON_AddStringToObject(o, "bound", fy_actplan_res_name(ph->bound)))
        return NULL;
    for (int r = 0; r < FY_RES_COUNT; r++)
        if (!cJSON_AddNumberToObject(o, fy_actplan_res_name(r), ph->res_s[r]))
            return NULL;
    return o;
}

static int other_json(cJSON *parent, const char *name, const struct fy_actplan_other *o)
{
    cJSON *j = cJSON_AddObjectToObject(parent, name);
    return j != NULL && cJSON_AddNumberToObject(j, "h2d_bytes", (double)o->h2d) &&
           cJSON_AddNumberToObject(j, "d2h_bytes", (double)o->d2h) &&
           cJSON_AddNumberToObject(j, "ssd_read_bytes", (double)o->ssd_read) &&
           cJSON_AddNumberToObject(j, "ssd_write_bytes", (double)o->ssd_write) &&
           cJSON_AddNumberToObject(j, "gpu_s", o->gpu_s) &&
           cJSON_AddNumberToObject(j, "opt_s", o->opt_s);
}

static cJSON *plan_json(const struct fy_actplan *p)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL && cJSON_AddStringToObject(root, "format", "fuyou-actplan") &&
             cJSON_AddNumberToObject(root, "version", 1) &&
             cJSON_AddStringToObject(root, "mode", fy_actplan_mode_name(p->mode)) &&
             cJSON_AddNumberToObject(root, "n_layer", p->n_layer);
    cJSON *sz = ok ? cJSON_AddObjectToObject(root, "layer_bytes") : NULL;
    ok = sz != NULL;
    for (int k = 0; ok && k < FY_ACT_KINDS; k++)
        ok = cJSON_AddNumberToObject(sz, fy_actplan_kind_name(k), (double)p->sizes.bytes[k]) != NULL;
    const struct fy_actplan_profile *f = &p->prof;
    cJSON *pr = ok ? cJSON_AddObjectToObject(root, "profile") : NULL;
    ok = pr != NULL && cJSON_AddNumberToObject(pr, "h2d_Bps", f->h2d_Bps) &&
         cJSON_AddNumberToObject(pr, "d2h_Bps", f->d2h_Bps) &&
         cJSON_AddNumberToObject(pr, "duplex_Bps", f->duplex_Bps) &&
         cJSON_AddNumberToObject(pr, "ssd_read_Bps", f->ssd_read_Bps) &&
         cJSON_AddNumberToObject(pr, "ssd_write_Bps", f->ssd_write_Bps) &&
         cJSON_AddNumberToObject(pr, "gpu_bytes", (double)f->gpu_bytes) &&
         cJSON_AddNumberToObject(pr, "host_bytes", (double)f->host_bytes) &&
         cJSON_AddNumberToObject(pr, "ssd_bytes", (double)f->ssd_bytes) &&
         other_json(pr, "forward_other", &f->fwd) && other_json(pr, "backward_other", &f->bwd);
    cJSON *pd = ok ? cJSON_AddObjectToObject(root, "predicted") : NULL;
    ok = pd != NULL && cJSON_AddNumberToObject(pd, "step_s", p->pred.step_s) &&
         cJSON_AddNumberToObject(pd, "recompute_s", p->pred.recompute_s) &&
         phase_json(pd, "forward", &p->pred.fwd) && phase_json(pd, "backward", &p->pred.bwd);
    cJSON *by = ok ? cJSON_AddObjectToObject(pd, "bytes") : NULL;
    ok = by != NULL;
    for (int pl = 0; ok && pl < FY_ACT_PLACES; pl++)
        ok = cJSON_AddNumberToObject(by, fy_actplan_place_name(pl), (double)p->pred.bytes[pl]) != NULL;
    cJSON *layers = ok ? cJSON_AddArrayToObject(root, "layers") : NULL;
    ok = layers != NULL;
    for (int l = 0; ok && l < p->n_layer; l++) {
        cJSON *o = cJSON_CreateObject();
        ok = o != NULL && cJSON_AddItemToArray(layers, o);
        for (int k = 0; ok && k < FY_ACT_KINDS; k++)
            ok = cJSON_AddStringToObject(o, fy_actplan_kind_name(k),
                                         fy_actplan_place_name(fy_actplan_at(p, l, k))) != NULL;
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

int fy_actplan_write_json(const struct fy_actplan *p, FILE *f)
{
    cJSON *root = plan_json(p);
    char *text = root != NULL ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    FY_REQUIRE(text != NULL, -ENOMEM, "activation plan: out of memory writing JSON");
    errno = 0;
    int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0;
    int err = errno;
    free(text);
    FY_REQUIRE(!bad, err > 0 ? -err : -EIO, "activation plan: writing JSON: %s",
               strerror(err > 0 ? err : EIO));
    return 0;
}
