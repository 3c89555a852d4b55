/* The plan of a training run without running it (fuyou-launch plan), from the same planning
 * functions train uses (launcher/train.h) and the backend's device-memory model. */
#include "dryrun.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "common/check.h"
#include "common/config.h"
#include "common/ckpt.h"
#include "common/dtype.h"
#include "common/optstate.h"
#include "common/pool.h"
#include "gpu_worker/backend.h"
#include "launcher/actrun.h"

/* What a run at batch B would take and do. */
struct shape {
    unsigned char *resident;
    unsigned kept;
    int ckpt_ssd;
    uint64_t pool_bytes;
    struct fy_plan_swap swap; /* --act-plan host or ssd: every block's internals; else none */
    struct fy_plan_prediction p;
};

static int forced_swap(const struct fy_dryrun_in *in) /* --act-plan host or ssd */
{
    return in->act_mode == FY_ACTPLAN_HOST || in->act_mode == FY_ACTPLAN_SSD;
}

/* The internals train's forced host or ssd placement swaps at batch B (none otherwise). */
static int swap_of(const struct fy_dryrun_in *in, const struct fy_gpt_config *c, int B,
                   struct fy_plan_swap *out)
{
    memset(out, 0, sizeof *out);
    if (!forced_swap(in))
        return 0;
    struct fy_actrun_in a = {.c = c, .B = B, .T = in->T, .mode = (enum fy_actplan_mode)in->act_mode,
                             .backend = in->backend,
                             .act_dtype = fy_backend_preferred_act_dtype(in->backend),
                             .clip = in->clip, .act_ahead = in->act_ahead};
    struct fy_actrun r;
    FY_TRY(fy_actrun_plan(&a, &r));
    *out = r.swap;
    fy_actrun_free(&r);
    return 0;
}

/* Device memory at batch B: the working buffers, and the swap sets (one per call in flight) that
 * swapping internals takes; 0 where the backend's memory is not modelled. */
static int gpu_need(const struct fy_dryrun_in *in, const struct fy_gpt_config *c, int B,
                    uint64_t *need, uint64_t *working, uint64_t *set)
{
    if (!fy_backend_gpu_bytes(in->backend, c, B, in->T, working, set))
        return 0;
    *need = *working + (forced_swap(in) ? FY_BACKEND_GPT_QUEUE * *set : 0);
    return 1;
}

static int shape_of(const struct fy_dryrun_in *in, const struct fy_gpt_config *c, int B,
                    uint64_t cpu_mem, struct shape *s)
{
    unsigned units = fy_gpt_unit_count(c);
    free(s->resident);
    s->resident = calloc(units, 1);
    FY_REQUIRE(s->resident != NULL, -ENOMEM, "plan: out of memory");
    int dtype = fy_backend_preferred_act_dtype(in->backend);
    FY_TRY(swap_of(in, c, B, &s->swap));
    const struct fy_plan_swap *swap = forced_swap(in) ? &s->swap : NULL;
    s->ckpt_ssd = in->ckpt_place == 1;
    if (in->ckpt_place == 2) { /* as train's --ckpt-place auto */
        unsigned all = fy_plan_resident(c, B, in->T, dtype, cpu_mem, in->clip,
                                        in->prefetch, 0, swap, in->weight_dtype,
                                        s->resident);
        s->ckpt_ssd = cpu_mem != 0 && all < units;
    }
    unsigned ckpt_slots = s->ckpt_ssd ? fy_plan_spill_slots(in->act_ahead) : 0;
    s->kept = fy_plan_resident(c, B, in->T, dtype, cpu_mem, in->clip, in->prefetch,
                               ckpt_slots, swap, in->weight_dtype, s->resident);
    struct fy_pool_region_spec regions[10];
    unsigned n;
    /* as train's default --grad-slots: as many as the budget holds, up to the most */
    unsigned slots = fy_plan_grad_slots(c, B, in->T, dtype, cpu_mem, in->clip, in->prefetch,
                                        ckpt_slots, swap, s->resident,
                                        FY_PLAN_GRAD_SLOTS_MAX);
    fy_plan_regions(c, B, in->T, dtype, s->resident, in->clip, in->prefetch, slots, ckpt_slots,
                    swap, regions, &n);
    s->pool_bytes = fy_pool_layout_size(regions, n);
    fy_plan_predict(c, B, in->T, dtype, in->clip, s->ckpt_ssd, swap, s->resident, &in->rates,
                    &s->p);
    return 0;
}

/* A size for people, in one of 8 buffers used in turn (a line prints several). */
static const char *size(uint64_t bytes)
{
    static char bufs[8][32];
    static unsigned next;
    char *b = bufs[next++ % 8];
    fy_format_size(bytes, b, sizeof bufs[0]);
    return b;
}

static uint64_t state_bytes(const struct fy_gpt_config *c)
{
    uint64_t total = 0;
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++)
        total += fy_optstate_bytes(c, u);
    return total;
}

/* Free bytes over the store's directories (0 when none is given or readable: not checked). */
static uint64_t ssd_free(const char *list, unsigned *paths)
{
    *paths = 0;
    if (list == NULL)
        return 0;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", list);
    uint64_t total = 0;
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        struct statvfs st;
        if (statvfs(p, &st) == 0) {
            total += (uint64_t)st.f_bavail * st.f_frsize;
            (*paths)++;
        }
    }
    return total;
}

/* The store's bytes: the state's copies, the commit records, and the scratch extents of the
 * internals swapped to it and of the checkpoints placed on it, as train makes them. */
static uint64_t store_bytes(const struct fy_dryrun_in *in, const struct fy_gpt_config *c, int B,
                            const struct shape *s)
{
    int dtype = fy_backend_preferred_act_dtype(in->backend);
    return state_bytes(c) * in->copies + 2 * FY_COMMIT_RECORD_BYTES +
           fy_plan_swap_store_bytes(&s->swap, c->n_layer) +
           (s->ckpt_ssd ? fy_plan_ckpt_store_bytes(c, B, in->T, dtype) : 0);
}

/* Whether batch B fits the GPU (where modelled), the pool's least (no state kept) and the SSD's
 * free space (free > 0: the internals a forced ssd plan swaps there grow with the batch). */
static int batch_fits(const struct fy_dryrun_in *in, int B, uint64_t free_bytes)
{
    uint64_t need, working, set;
    if (in->gpu_mem > 0 && gpu_need(in, &in->model, B, &need, &working, &set) &&
        need > in->gpu_mem)
        return 0;
    struct shape s = {0};
    int fits = shape_of(in, &in->model, B, 0, &s) == 0 &&
               (in->cpu_mem == 0 || s.pool_bytes <= in->cpu_mem) &&
               (free_bytes == 0 || store_bytes(in, &in->model, B, &s) <= free_bytes);
    free(s.resident);
    return fits;
}

static int largest_batch(const struct fy_dryrun_in *in, uint64_t free_bytes)
{
    if (!batch_fits(in, 1, free_bytes))
        return 0;
    int lo = 1, hi = 2;
    while (hi <= 65536 && batch_fits(in, hi, free_bytes)) {
        lo = hi;
        hi *= 2;
    }
    if (hi > 65536)
        return lo;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (batch_fits(in, mid, free_bytes))
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The most blocks at this width whose store (state and swapped internals) fits the SSD's free
 * space (free > 0) and whose least pool fits --cpu-mem; 0 when none is capped. */
static unsigned largest_layers(const struct fy_dryrun_in *in, uint64_t free_bytes)
{
    if (free_bytes == 0 && in->cpu_mem == 0)
        return 0;
    unsigned best = 0;
    for (unsigned L = 1; L <= 4096; L = L < 64 ? L + 1 : L + L / 8) {
        struct fy_gpt_config c = in->model;
        c.n_layer = L;
        struct shape s = {0};
        int fits = shape_of(in, &c, in->B, 0, &s) == 0 &&
                   (in->cpu_mem == 0 || s.pool_bytes <= in->cpu_mem) &&
                   (free_bytes == 0 || store_bytes(in, &c, in->B, &s) <= free_bytes);
        free(s.resident);
        if (!fits)
            break;
        best = L;
    }
    return best;
}

int fy_dryrun_print(FILE *out, const struct fy_dryrun_in *in)
{
    const struct fy_gpt_config *c = &in->model;
    unsigned units = fy_gpt_unit_count(c);
    char described[160];
    fy_gpt_config_describe(c, described, sizeof described);
    double tokens = (double)in->B * in->T;
    double step_flops = tokens * fy_gpt_flops_per_token(c, (unsigned)in->T);
    struct shape s = {0};
    FY_TRY(shape_of(in, c, in->B, in->cpu_mem, &s));
    int fits = 1;
    uint64_t state = state_bytes(c), kept = fy_plan_resident_bytes(c, s.resident);
    fprintf(out, "plan: %s; batch %d x %d tokens; %s backend (%s activations); rates: %s\n",
            described, in->B, in->T, in->backend,
            fy_dtype_name(fy_backend_preferred_act_dtype(in->backend)), in->rates_from);
    uint64_t kept_state = 0;
    for (unsigned u = 0; u < units; u++)
        kept_state += s.resident[u] ? fy_optstate_bytes(c, u) : 0;
    fprintf(out, "plan: optimizer state %s: %u of %u units (%s) stay in the shared pool, the "
            "rest (%s) streams from the SSD store each step; checkpoints %s; weights to the GPU "
            "in bf16 for %u units (copies beside their state), in f32 for the others\n",
            size(state), s.kept, units, size(kept), size(state - kept_state),
            s.ckpt_ssd ? "on the SSD store" : "in the shared pool",
            fy_plan_weight_copies(c, s.resident));
    if (in->cpu_mem > 0 && s.pool_bytes > in->cpu_mem)
        fits = 0;
    if (in->cpu_mem > 0)
        fprintf(out, "plan: shared pool %s of --cpu-mem %s%s\n", size(s.pool_bytes),
                size(in->cpu_mem), s.pool_bytes <= in->cpu_mem ? "" : " (DOES NOT FIT)");
    else
        fprintf(out, "plan: shared pool %s (no --cpu-mem: no state kept in memory; give it to "
                "keep some)\n", size(s.pool_bytes));
    uint64_t need = 0, working = 0, set = 0;
    if (gpu_need(in, c, in->B, &need, &working, &set) && forced_swap(in)) {
        int gpu_fits = in->gpu_mem == 0 || need <= in->gpu_mem;
        fits &= gpu_fits;
        fprintf(out, "plan: GPU: working buffers %s and %d swap sets of %s (one per call in "
                "flight) of --gpu-mem %s%s\n", size(working), FY_BACKEND_GPT_QUEUE, size(set),
                in->gpu_mem ? size(in->gpu_mem) : "(all)", gpu_fits ? "" : " (DOES NOT FIT)");
    } else if (need > 0) {
        int gpu_fits = in->gpu_mem == 0 || working <= in->gpu_mem;
        fits &= gpu_fits;
        uint64_t room = in->gpu_mem > working ? in->gpu_mem - working : 0;
        uint64_t keep = set > 0 ? room / set : 0;
        fprintf(out, "plan: GPU: working buffers %s of --gpu-mem %s%s; a block's internals %s, "
                "so --act-plan auto can keep up to %llu of %u blocks\n",
                size(working), in->gpu_mem ? size(in->gpu_mem) : "(all)",
                gpu_fits ? "" : " (DOES NOT FIT)", size(set),
                (unsigned long long)(keep < c->n_layer ? keep : c->n_layer), c->n_layer);
    } else {
        fprintf(out, "plan: GPU memory: not modelled for the %s backend\n", in->backend);
    }
    if (forced_swap(in))
        fprintf(out, "plan: activations (--act-plan %s): every block's internals swapped, %s in "
                "the shared pool from forward to backward, %s through the SSD store (%u pool "
                "slots of %s)\n", fy_actplan_mode_name(in->act_mode), size(s.swap.host_bytes),
                size(s.swap.ssd_bytes), s.swap.slots, size(s.swap.slot_bytes));
    unsigned paths;
    uint64_t store = store_bytes(in, c, in->B, &s);
    uint64_t free_bytes = ssd_free(in->ssd, &paths);
    const char *with = s.swap.ssd_bytes && s.ckpt_ssd ? ", the swapped internals' scratch and the "
                                                       "checkpoints'"
                       : s.swap.ssd_bytes ? " and the swapped internals' scratch"
                       : s.ckpt_ssd       ? " and the checkpoints' scratch"
                                          : "";
    if (paths > 0) {
        fits &= store <= free_bytes;
        fprintf(out, "plan: SSD store %s (%u cop%s of the state%s) on %u path%s with %s free%s\n",
                size(store), in->copies, in->copies == 1 ? "y" : "ies", with, paths,
                paths == 1 ? "" : "s", size(free_bytes), store <= free_bytes ? "" :
                " (DOES NOT FIT)");
    } else {
        fprintf(out, "plan: SSD store %s (%u cop%s of the state%s; give --ssd to check the free "
                "space)\n", size(store), in->copies, in->copies == 1 ? "y" : "ies", with);
    }
    uint64_t up, down, rd, wr;
    int dtype = fy_backend_preferred_act_dtype(in->backend);
    const struct fy_plan_swap *swap = forced_swap(in) ? &s.swap : NULL;
    fy_plan_pcie_bytes(c, in->B, in->T, dtype, in->clip, swap, s.resident, &up, &down);
    fy_plan_ssd_bytes(c, in->B, in->T, dtype, in->clip, s.ckpt_ssd, swap, s.resident, &rd, &wr);
    fprintf(out, "plan: per step: PCIe %s to the GPU, %s back; SSD %s read, %s written\n",
            size(up), size(down), size(rd), size(wr));
    const struct fy_plan_prediction *p = &s.p;
    fprintf(out, "plan: predicted seconds per step: GPU compute %.6f, PCIe to the GPU %.6f, from "
            "it %.6f, SSD %.6f, optimizer %.6f; bound: %s\n", p->gpu_s, p->h2d_s, p->d2h_s,
            p->ssd_s, p->opt_s, p->bound);
    static const char *const how[] = {
        [FY_ACTPLAN_AUTO] = "blocks recomputed; train's --act-plan auto profiles a block and "
                            "may keep or swap some",
        [FY_ACTPLAN_RECOMPUTE] = "blocks recomputed",
        [FY_ACTPLAN_HOST] = "every block's internals swapped through the pool",
        [FY_ACTPLAN_SSD] = "every block's internals swapped through the SSD store"};
    fprintf(out, "plan: predicted step %.6f s: %.0f tokens/s, %.4g TFLOP/s (%s)\n", p->step_s,
            tokens / p->step_s, step_flops / p->step_s * 1e-12, how[in->act_mode]);
    int maxb = largest_batch(in, free_bytes);
    unsigned maxl = largest_layers(in, free_bytes);
    fprintf(out, "plan: largest batch that fits: %d (at %d tokens; %s)\n", maxb, in->T,
            paths > 0 ? "the GPU, --cpu-mem and the SSD's free space" : "the GPU and --cpu-mem");
    if (maxl > 0)
        fprintf(out, "plan: largest model of this width that fits: %u blocks (%s)\n", maxl,
                paths > 0 ? "the SSD's free space and --cpu-mem" : "--cpu-mem");
    /* what to change: the bound's own lever, and the prediction with it */
    struct shape t = {0};
    if (strcmp(p->bound, "SSD") == 0) {
        fprintf(out, "plan: to go faster: the SSD binds; another SSD path of the same speed: "
                "%.3f s a step", p->ssd_s * (paths ? paths : 1) / ((paths ? paths : 1) + 1.0));
        if (shape_of(in, c, in->B, in->cpu_mem + (16ull << 30), &t) == 0)
            fprintf(out, "; 16 GiB more --cpu-mem keeps %u more units: %.3f s", t.kept - s.kept,
                    t.p.step_s);
        fprintf(out, "\n");
    } else if (strcmp(p->bound, "GPU compute") == 0) {
        fprintf(out, "plan: to go faster: the GPU binds, which is where a step should be: a "
                "larger batch only spreads the fixed transfers further\n");
    } else if (2 * in->B <= maxb && shape_of(in, c, 2 * in->B, in->cpu_mem, &t) == 0) {
        fprintf(out, "plan: to go faster: the %s binds; at batch %d the step does twice the work "
                "in %.3f s (%.4g TFLOP/s)%s\n", p->bound, 2 * in->B, t.p.step_s,
                2 * step_flops / t.p.step_s * 1e-12,
                strcmp(p->bound, "optimizer") == 0 ? "; or give AdamW more cores (--affinity)"
                                                   : "");
    } else {
        fprintf(out, "plan: to go faster: the %s binds, and a larger batch does not fit%s\n",
                p->bound, strcmp(p->bound, "optimizer") == 0 ? ": give AdamW more cores "
                "(--affinity)" : "");
    }
    free(s.resident);
    free(t.resident);
    if (!fits)
        fprintf(out, "plan: this does not fit the budgets above: train would refuse it\n");
    return fits ? 0 : 1;
}
