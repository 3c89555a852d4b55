/* The plan of a training run without running it (fuyou-launch plan), made by the planner train
 * uses (launcher/plan/plan.h) with the forced activation placements computed here, not profiled. */
#include "launcher/plan/forecast.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/dtype.h"
#include "common/model/optstate.h"
#include "common/ipc/pool.h"
#include "gpu_worker/backend.h"
#include "launcher/plan/actplace.h"
#include "launcher/plan/plan_describe.h"

static int forced(const struct fy_forecast_in *in) /* --act-plan host or ssd */
{
    return in->plan.act_mode == FY_ACTPLAN_HOST || in->plan.act_mode == FY_ACTPLAN_SSD;
}

/* The plan's activation step without the workers: the internals that train's forced host or ssd
 * placement swaps (auto and recompute are planned with the blocks recomputed). */
static int forced_swap(void *ctx, const struct fy_plan_in *in, struct fy_plan *p)
{
    (void)ctx;
    if (in->act_mode != FY_ACTPLAN_HOST && in->act_mode != FY_ACTPLAN_SSD)
        return 0;
    struct fy_actplace_in a = fy_actplace_in_of_plan(in, p);
    struct fy_actplace r;
    FY_TRY(fy_actplace_plan(&a, &r));
    p->place.swap = r.swap;
    fy_actplace_release(&r);
    return 0;
}

/* The plan for model c at batch B under cpu_mem (the searches vary them), with `least` the least
 * pool that holds no unit's state (fy_plan_in.floor_only); p freed first. */
static int plan_at_least(const struct fy_forecast_in *in, const struct fy_model_config *c, int B,
                         uint64_t cpu_mem, int least, struct fy_plan *p)
{
    struct fy_plan_in at = in->plan;
    at.shape.c = c;
    at.shape.B = B;
    at.cpu_mem = cpu_mem;
    at.floor_only = least;
    const struct fy_plan_acts acts = {.place = forced_swap};
    fy_plan_release(p);
    return fy_plan_make(&at, &acts, p);
}

static int plan_at(const struct fy_forecast_in *in, const struct fy_model_config *c, int B,
                   uint64_t cpu_mem, struct fy_plan *p)
{
    return plan_at_least(in, c, B, cpu_mem, 0, p);
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

/* The optimizer state's bytes, of every unit or (resident not NULL) of the kept ones. */
static uint64_t state_bytes(const struct fy_model_config *c, const unsigned char *resident)
{
    uint64_t total = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        total += resident == NULL || resident[u] ? fy_optstate_bytes(c, u) : 0;
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

/* Whether model c at batch B fits the GPU (where modelled), the pool's least (no state kept)
 * under --cpu-mem and the SSD's free space (free > 0: the internals a forced ssd plan swaps there
 * grow with the batch). */
static int fits_at(const struct fy_forecast_in *in, const struct fy_model_config *c, int B,
                   uint64_t free_bytes)
{
    struct fy_plan p = {0}; /* planned under --cpu-mem: the least pool (state in pieces, fewer
                               gradient slots) where it has no room for more */
    int fits = plan_at_least(in, c, B, in->plan.cpu_mem, 1, &p) == 0 && p.fits_gpu && p.fits_cpu &&
               (free_bytes == 0 || p.store_bytes <= free_bytes);
    fy_plan_release(&p);
    return fits;
}

/* The largest batch that fits, a multiple of the gpu workers (each computes B / ranks): searched
 * over each one's sequences. */
static int largest_batch(const struct fy_forecast_in *in, uint64_t free_bytes)
{
    int n = fy_plan_ranks(&in->plan.shape), most = 65536 / n;
    if (!fits_at(in, &in->model, n, free_bytes))
        return 0;
    int lo = 1, hi = 2;
    while (hi <= most && fits_at(in, &in->model, hi * n, free_bytes)) {
        lo = hi;
        hi *= 2;
    }
    if (hi > most)
        return lo * n;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (fits_at(in, &in->model, mid * n, free_bytes))
            lo = mid;
        else
            hi = mid;
    }
    return lo * n;
}

/* The most blocks at this width whose store (state and swapped internals) fits the SSD's free
 * space (free > 0) and whose least pool fits --cpu-mem; 0 when none is capped. */
static unsigned largest_layers(const struct fy_forecast_in *in, uint64_t free_bytes)
{
    if (free_bytes == 0 && in->plan.cpu_mem == 0)
        return 0;
    unsigned best = 0;
    for (unsigned L = 1; L <= 4096; L = L < 64 ? L + 1 : L + L / 8) {
        struct fy_model_config c = in->model;
        c.n_layer = L;
        /* the GPU is not the search's: a deeper model's working buffers are the same */
        struct fy_forecast_in wide = *in;
        wide.plan.gpu_mem = 0;
        if (!fits_at(&wide, &c, in->plan.shape.B, free_bytes))
            break;
        best = L;
    }
    return best;
}

/* The GPU line: the arena's working buffers (and a forced plan's swap sets) against --gpu-mem. */
static void print_gpu(FILE *out, const struct fy_forecast_in *in, const struct fy_plan *p)
{
    const struct fy_model_config *c = &in->model;
    const char *budget = in->plan.gpu_mem ? size(in->plan.gpu_mem) : "0 (sized to them)";
    const char *over = p->fits_gpu ? "" : " (DOES NOT FIT)";
    if (!p->gpu_modelled) {
        fprintf(out, "plan: GPU memory: not modelled for the %s backend\n", in->plan.backend);
        return;
    }
    /* one-pass clipping's gradients held in the arena (in gpu_need) */
    uint64_t hold =
        in->plan.shape.clip && p->place.grad_hold == FY_HOLD_GPU ? fy_plan_hold_bytes(c) : 0;
    char held[96] = "", each[96] = "GPU";
    if (hold > 0)
        snprintf(held, sizeof held, ", the blocks' gradients %s (one-pass clipping)", size(hold));
    int ranks = fy_plan_ranks(&in->plan.shape);
    if (ranks > 1)
        snprintf(each, sizeof each, "GPU (each of %d, for its %d sequences)", ranks,
                 fy_plan_rank_batch(&in->plan.shape));
    if (forced(in)) {
        fprintf(out,
                "plan: %s: working buffers %s%s and %d swap sets of %s (one per call in "
                "flight) of --gpu-mem %s%s\n",
                each, size(p->gpu_working), held, FY_BACKEND_QUEUE, size(p->gpu_set), budget, over);
    } else {
        uint64_t gpu_mem = in->plan.gpu_mem;
        uint64_t room = gpu_mem > p->gpu_working + hold ? gpu_mem - p->gpu_working - hold : 0;
        uint64_t keep = p->gpu_set > 0 ? room / p->gpu_set : 0;
        fprintf(out,
                "plan: %s: working buffers %s%s of --gpu-mem %s%s; a block's internals %s, "
                "so --act-plan auto can keep up to %llu of %u blocks\n",
                each, size(p->gpu_working), held, budget, over, size(p->gpu_set),
                (unsigned long long)(keep < c->n_layer ? keep : c->n_layer), c->n_layer);
    }
}

/* Where the state, the checkpoints and the internals live, and the pool, the GPU and the store
 * against their budgets; 1 where each fits. */
static int print_budgets(FILE *out, const struct fy_forecast_in *in, const struct fy_plan *p,
                         uint64_t free_bytes, unsigned paths)
{
    const struct fy_model_config *c = &in->model;
    uint64_t state = state_bytes(c, NULL), cpu_mem = in->plan.cpu_mem;
    char weights[320];
    fy_plan_weights_describe(&in->plan.shape, p, weights, sizeof weights);
    fprintf(out,
            "plan: optimizer state %s: %u of %u units (%s) stay in the shared pool, the "
            "rest (%s) streams from the SSD store each step; checkpoints %s; %s\n",
            size(state), p->kept, fy_model_unit_count(c), size(p->resident_bytes),
            size(state - state_bytes(c, p->resident)),
            p->place.block_inputs_slots ? "on the SSD store" : "in the shared pool", weights);
    if (cpu_mem > 0)
        fprintf(out, "plan: shared pool %s of --cpu-mem %s%s\n", size(p->pool_bytes), size(cpu_mem),
                p->fits_cpu ? "" : " (DOES NOT FIT)");
    else
        fprintf(out,
                "plan: shared pool %s (no --cpu-mem: no state kept in memory; give it to "
                "keep some)\n",
                size(p->pool_bytes));
    if (cpu_mem > 0 && !p->fits_cpu && in->plan.shape.clip) {
        /* the state in pieces with one gradient slot is an unclipped floor: say where it fits */
        struct fy_forecast_in unclipped = *in;
        unclipped.plan.shape.clip = 0;
        unclipped.plan.clip_max = 0;
        struct fy_plan u = {0};
        if (plan_at_least(&unclipped, c, in->plan.shape.B, cpu_mem, 1, &u) == 0 && u.fits_cpu)
            fprintf(out,
                    "plan: unclipped (--clip-grad-norm 0) the shared pool needs %s at least, "
                    "which --cpu-mem %s holds (clipping needs %s: a second block gradient slot)\n",
                    size(u.pool_bytes), size(cpu_mem), size(p->pool_bytes));
        fy_plan_release(&u);
    }
    char pieces[768];
    fy_plan_state_describe(&in->plan, p, pieces, sizeof pieces);
    if (pieces[0])
        fprintf(out, "plan: %s\n", pieces);
    char regions[1024] = "";
    for (unsigned i = 0; i < p->n_regions; i++)
        snprintf(regions + strlen(regions), sizeof regions - strlen(regions), "%s%s %s",
                 i ? ", " : "", p->regions[i].name, size(p->regions[i].bytes));
    fprintf(out, "plan: shared pool regions: %s\n", regions);
    print_gpu(out, in, p);
    const struct fy_plan_swap *swap = &p->place.swap;
    if (forced(in))
        fprintf(out,
                "plan: activations (--act-plan %s): every block's internals swapped, %s in "
                "the shared pool from forward to backward, %s through the SSD store (%u pool "
                "slots of %s)\n",
                fy_actplan_mode_name(in->plan.act_mode), size(swap->host_bytes),
                size(swap->ssd_bytes), swap->slots, size(swap->slot_bytes));
    unsigned copies = in->plan.state_copies;
    const char *with = swap->ssd_bytes && p->place.block_inputs_slots
                           ? ", the swapped internals' scratch and the checkpoints'"
                       : swap->ssd_bytes             ? " and the swapped internals' scratch"
                       : p->place.block_inputs_slots ? " and the checkpoints' scratch"
                                                     : "";
    int store_fits = paths == 0 || p->store_bytes <= free_bytes;
    if (paths > 0)
        fprintf(out, "plan: SSD store %s (%u cop%s of the state%s) on %u path%s with %s free%s\n",
                size(p->store_bytes), copies, copies == 1 ? "y" : "ies", with, paths,
                paths == 1 ? "" : "s", size(free_bytes), store_fits ? "" : " (DOES NOT FIT)");
    else
        fprintf(out,
                "plan: SSD store %s (%u cop%s of the state%s; give --ssd to check the free "
                "space)\n",
                size(p->store_bytes), copies, copies == 1 ? "y" : "ies", with);
    return p->fits_cpu && p->fits_gpu && store_fits;
}

/* What to change to go faster: the bound's own lever, and the prediction with it. */
static void print_advice(FILE *out, const struct fy_forecast_in *in, const struct fy_plan *p,
                         unsigned paths, int maxb)
{
    const struct fy_plan_prediction *pr = &p->predicted;
    int B = in->plan.shape.B;
    double step_flops = (double)B * in->plan.shape.T *
                        fy_model_flops_per_token(&in->model, (unsigned)in->plan.shape.T);
    int optimizer = strcmp(pr->bound, "optimizer") == 0;
    struct fy_plan t = {0};
    if (strcmp(pr->bound, "SSD") == 0) {
        fprintf(out,
                "plan: to go faster: the SSD binds; another SSD path of the same speed: "
                "%.3f s a step",
                pr->ssd_s * (paths ? paths : 1) / ((paths ? paths : 1) + 1.0));
        if (plan_at(in, &in->model, B, in->plan.cpu_mem + (16ull << 30), &t) == 0)
            fprintf(out, "; 16 GiB more --cpu-mem keeps %u more units: %.3f s", t.kept - p->kept,
                    t.predicted.step_s);
        fprintf(out, "\n");
    } else if (strcmp(pr->bound, "GPU compute") == 0) {
        fprintf(out, "plan: to go faster: the GPU binds, which is where a step should be: a "
                     "larger batch only spreads the fixed transfers further\n");
    } else if (2 * B <= maxb && plan_at(in, &in->model, 2 * B, in->plan.cpu_mem, &t) == 0) {
        fprintf(out,
                "plan: to go faster: the %s binds; at batch %d the step does twice the work "
                "in %.3f s (%.4g TFLOP/s)%s\n",
                pr->bound, 2 * B, t.predicted.step_s, 2 * step_flops / t.predicted.step_s * 1e-12,
                optimizer ? "; or give AdamW more cores (--affinity)" : "");
    } else {
        fprintf(out, "plan: to go faster: the %s binds, and a larger batch does not fit%s\n",
                pr->bound, optimizer ? ": give AdamW more cores (--affinity)" : "");
    }
    fy_plan_release(&t);
}

/* With several gpu workers: each one's share, the weights' and the gradients' paths with their
 * bytes and times, and the predicted step against one GPU's at the same batch. */
static void print_gpus(FILE *out, const struct fy_forecast_in *in, const struct fy_plan *p)
{
    const struct fy_plan_shape *shape = &in->plan.shape;
    const struct fy_plan_rates *r = &in->plan.rates;
    int ranks = fy_plan_ranks(shape);
    if (ranks == 1)
        return;
    const struct fy_plan_prediction *pr = &p->predicted;
    uint64_t grads = fy_plan_grad_bytes(shape, &p->place);
    char reduce[320];
    if (p->place.reduce == FY_REDUCE_NVLINK)
        snprintf(reduce, sizeof reduce,
                 "gradients (%s a step) reduced over NVLink to GPU 0, %s "
                 "over each link of the ring, %.6f s at %.0f GB/s%s, and sent to the shared pool "
                 "over GPU 0's link alone",
                 size(grads), size(p->traffic.nvlink), pr->nvlink_s, r->nvlink * 1e-9,
                 r->nvlink == fy_plan_reference_rates.nvlink ? " (a reference rate, not measured)"
                                                             : "");
    else
        snprintf(reduce, sizeof reduce,
                 "gradients (%s a step) sent by every gpu worker and added "
                 "into the shared pool in rank order (the %s backend has no NVLink reduce)",
                 size(grads), in->plan.backend);
    fprintf(out,
            "plan: GPUs: %d (--gpus), each computing %d of the %d sequences of a step; weights "
            "to each GPU over its own PCIe link (a broadcast over NVLink: not built); %s; host "
            "memory %s a step for every link's copies, %.6f s at %.0f GB/s%s\n",
            ranks, fy_plan_rank_batch(shape), shape->B, reduce, size(p->traffic.host_mem),
            pr->host_mem_s, r->host_mem * 1e-9,
            r->host_mem == fy_plan_reference_rates.host_mem ? " (the reference machine's)" : "");
    struct fy_forecast_in one = *in;
    one.plan.shape.ranks = 1;
    struct fy_plan single = {0};
    double tokens = (double)shape->B * shape->T;
    if (plan_at(&one, &in->model, shape->B, in->plan.cpu_mem, &single) == 0)
        fprintf(out,
                "plan: with %d GPUs: predicted step %.6f s, %.0f tokens/s; one GPU at batch "
                "%d: %.6f s, %.0f tokens/s%s (%.2fx)\n",
                ranks, pr->step_s, tokens / pr->step_s, shape->B, single.predicted.step_s,
                tokens / single.predicted.step_s,
                single.fits_gpu ? "" : ", beyond one GPU's --gpu-mem",
                single.predicted.step_s / pr->step_s);
    fy_plan_release(&single);
}

int fy_forecast_print(FILE *out, const struct fy_forecast_in *in)
{
    const struct fy_model_config *c = &in->model;
    const struct fy_plan_shape *shape = &in->plan.shape;
    char described[160];
    fy_model_config_describe(c, described, sizeof described);
    double tokens = (double)shape->B * shape->T;
    double step_flops = tokens * fy_model_flops_per_token(c, (unsigned)shape->T);
    struct fy_plan p = {0};
    int rc = plan_at(in, c, shape->B, in->plan.cpu_mem, &p);
    if (rc < 0) {
        fy_plan_release(&p);
        return rc;
    }
    fprintf(out, "plan: %s; batch %d x %d tokens; %s backend (%s activations); rates: %s\n",
            described, shape->B, shape->T, in->plan.backend, fy_dtype_name(shape->act_dtype),
            in->rates_from);
    unsigned paths;
    uint64_t free_bytes = ssd_free(in->ssd, &paths);
    int fits = print_budgets(out, in, &p, free_bytes, paths);
    const struct fy_plan_traffic *tr = &p.traffic;
    int ranks = fy_plan_ranks(shape);
    const char *link = ranks > 1 ? " (GPU 0's link, the busiest)" : "";
    fprintf(out, "plan: per step: PCIe%s %s to the GPU, %s back; SSD %s read, %s written\n", link,
            size(tr->to_gpu), size(tr->from_gpu), size(tr->ssd_read), size(tr->ssd_write));
    const struct fy_plan_prediction *pr = &p.predicted;
    char more[128] = "";
    if (ranks > 1 && p.place.reduce == FY_REDUCE_NVLINK)
        snprintf(more, sizeof more, ", NVLink %.6f, host memory %.6f", pr->nvlink_s,
                 pr->host_mem_s);
    else if (ranks > 1)
        snprintf(more, sizeof more, ", host memory %.6f", pr->host_mem_s);
    char converts[96] = "";
    if (pr->convert_s > 0)
        snprintf(converts, sizeof converts, " (%.6f of it converting weights for the GPU)",
                 pr->convert_s);
    fprintf(out,
            "plan: predicted seconds per step: GPU compute %.6f, PCIe to the GPU %.6f, from "
            "it %.6f, SSD %.6f, optimizer %.6f%s%s; bound: %s\n",
            pr->gpu_s, pr->h2d_s, pr->d2h_s, pr->ssd_s, pr->opt_s, converts, more, pr->bound);
    char clipping[768];
    fy_plan_clip_describe(&in->plan, &p, clipping, sizeof clipping);
    if (clipping[0])
        fprintf(out, "plan: %s\n", clipping);
    static const char *const how[] = {
        [FY_ACTPLAN_AUTO] = "blocks recomputed; train's --act-plan auto profiles a block and "
                            "may keep or swap some",
        [FY_ACTPLAN_RECOMPUTE] = "blocks recomputed",
        [FY_ACTPLAN_HOST] = "every block's internals swapped through the pool",
        [FY_ACTPLAN_SSD] = "every block's internals swapped through the SSD store"};
    fprintf(out, "plan: predicted step %.6f s: %.0f tokens/s, %.4g TFLOP/s (%s)\n", pr->step_s,
            tokens / pr->step_s, step_flops / pr->step_s * 1e-12, how[in->plan.act_mode]);
    print_gpus(out, in, &p);
    int maxb = largest_batch(in, free_bytes);
    unsigned maxl = largest_layers(in, free_bytes);
    fprintf(out, "plan: largest batch that fits: %d (at %d tokens; %s)\n", maxb, shape->T,
            paths > 0 ? "the GPU, --cpu-mem and the SSD's free space" : "the GPU and --cpu-mem");
    if (maxl > 0)
        fprintf(out, "plan: largest model of this width that fits: %u blocks (%s)\n", maxl,
                paths > 0 ? "the SSD's free space and --cpu-mem" : "--cpu-mem");
    print_advice(out, in, &p, paths, maxb);
    fy_plan_release(&p);
    if (!fits)
        fprintf(out, "plan: this does not fit the budgets above: train would refuse it\n");
    return fits ? 0 : 1;
}
