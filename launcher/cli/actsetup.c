/* The activation plan of a train or profile command (launcher/cli/actsetup.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/ipc/desc.h"
#include "common/base/log.h"
#include "launcher/plan/steprates.h"
#include "launcher/cli/actsetup.h"
#include "launcher/cli/profile.h"
#include "launcher/step/progress.h"

/* Room for swapped internals beside the pool's other regions: what --cpu-mem leaves, or without
 * it half the machine's memory less that pool; and on the store, what its filesystem has free
 * less 1 GiB and less `reserved` (the checkpoints' scratch extent, where they go there). */
static void swap_room(const struct fy_options *o, uint64_t pool_bytes, uint64_t reserved,
                      uint64_t *host, uint64_t *ssd)
{
    uint64_t cap = o->cpu_mem;
    if (cap == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        cap = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 0;
    }
    /* the saved region is 2 MiB aligned in the pool */
    *host = cap > pool_bytes + (2u << 20) ? cap - pool_bytes - (2u << 20) : 0;
    char first[PATH_MAX];
    snprintf(first, sizeof first, "%s", o->ssd);
    char *comma = strchr(first, ',');
    if (comma != NULL)
        *comma = '\0';
    struct statvfs fs;
    uint64_t avail = statvfs(first, &fs) == 0 ? (uint64_t)fs.f_bavail * fs.f_frsize : 0;
    *ssd = avail > (1ull << 30) + reserved ? avail - (1ull << 30) - reserved : 0;
}

/* RUN/step_rates.json: the rates of a past session's steps (launcher/plan/steprates.h). */
void fy_actsetup_step_rates_path(const struct fy_options *o, char *path, size_t len)
{
    snprintf(path, len, "%s/step_rates.json", o->run_dir);
}

/* "N minutes ago" and so on, for the record's age. */
static void record_age(const struct fy_steprates *d, char *age, size_t len)
{
    double age_s = difftime(time(NULL), (time_t)d->written);
    if (age_s < 2 * 3600)
        snprintf(age, len, "%.0f minutes ago", age_s < 0 ? 0 : age_s / 60);
    else if (age_s < 2 * 86400)
        snprintf(age, len, "%.0f hours ago", age_s / 3600);
    else
        snprintf(age, len, "%.0f days ago", age_s / 86400);
}

/* The SSD's rates of the record where it is this store's: FY_STEPRATES_SSD where taken, else 0. */
static int take_ssd_rates(const struct fy_options *o, const struct fy_steprates *d,
                          const char *path, const char *age, struct fy_plan_rates *rates,
                          const char *instead)
{
    if (o->ssd == NULL)
        return 0;
    if (strcmp(d->ssd, o->ssd) != 0) {
        fy_info("plan: %s holds the rates of the store at %s, not this run's %s: the plan's SSD "
                "rates are %s",
                path, d->ssd, o->ssd, instead);
        return 0;
    }
    double rd = fy_steprates_read_Bps(d), wr = fy_steprates_write_Bps(d);
    if (!(rd > 0) && !(wr > 0))
        return 0;
    char r[32], w[32];
    fy_info("plan: SSD rates as the last session's %llu step%s ran at (steps %llu to %llu, batch "
            "%d, --act-plan %s, %s; %s): read %s, write %s GB/s, in place of %s (read %.2f, "
            "write %.2f): a short sample misjudges a disk under training traffic (--step-rates "
            "profile plans without the record)",
            (unsigned long long)d->steps, d->steps == 1 ? "" : "s",
            (unsigned long long)d->first_step, (unsigned long long)d->last_step, d->batch,
            d->act_plan, age, path, fy_steprates_gbps(rd, "as before", r, sizeof r),
            fy_steprates_gbps(wr, "as before", w, sizeof w), instead, rates->ssd_read * 1e-9,
            rates->ssd_write * 1e-9);
    if (rd > 0)
        rates->ssd_read = rd;
    if (wr > 0)
        rates->ssd_write = wr;
    return FY_STEPRATES_SSD;
}

/* AdamW's rate of the record where it holds for this run's state format: FY_STEPRATES_OPT where
 * taken, else 0. */
static int take_opt_rate(const struct fy_steprates *d, const char *path, const char *age,
                         int optim_state, struct fy_plan_rates *rates, const char *instead)
{
    double rate = fy_steprates_opt_params(d);
    if (!(rate > 0))
        return 0;
    const char *format = fy_optim_state_name(optim_state);
    if (strcmp(d->optim_state, format) != 0) {
        fy_info("plan: %s holds AdamW's rate with %s optimizer state, not this run's %s: the "
                "plan's AdamW is %s",
                path, d->optim_state, format, instead);
        return 0;
    }
    fy_info("plan: AdamW at %.2f G parameters/s as the opt worker ran in the last session's %llu "
            "step%s (busy %.3g s a step against the %.3g s planned at %.2f; %s; %s), in place of "
            "AdamW alone as %s has it (%.2f): beside the copies and the disk's transfers it "
            "shares host memory (--step-rates profile plans without the record)",
            rate * 1e-9, (unsigned long long)d->steps, d->steps == 1 ? "" : "s",
            d->opt_busy_s / (double)d->steps, d->opt_plan_step_s, d->opt_plan_params * 1e-9, age,
            path, instead, rates->opt_params * 1e-9);
    rates->opt_in_steps = rate;
    return FY_STEPRATES_OPT;
}

int fy_actsetup_step_rates(const struct fy_options *o, int optim_state, struct fy_plan_rates *rates,
                           const char *instead)
{
    if (o->step_rates_profile || o->run_dir == NULL)
        return 0;
    char path[PATH_MAX], why[256], age[48];
    fy_actsetup_step_rates_path(o, path, sizeof path);
    struct fy_steprates d;
    int rc = fy_steprates_load(path, &d, why, sizeof why);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0) {
        fy_warn("%s: %s: the plan's SSD and AdamW rates are %s (a training session's steps will "
                "replace the record)",
                path, why, instead);
        return 0;
    }
    record_age(&d, age, sizeof age);
    return take_ssd_rates(o, &d, path, age, rates, instead) |
           take_opt_rate(&d, path, age, optim_state, rates, instead);
}

/* The room for auto: what the pool and the store leave beside the kept state, the streaming
 * regions and the checkpoints as planned so far. */
static void auto_room(const struct fy_actsetup *a, const struct fy_plan_in *in,
                      const struct fy_plan *p, uint64_t *host, uint64_t *ssd)
{
    struct fy_plan_place least = p->place; /* the gradient slots as the residency took them */
    memset(&least.swap, 0, sizeof least.swap);
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n;
    fy_plan_regions(&in->shape, &least, regions, &n);
    uint64_t inputs_bytes =
        p->place.block_inputs_slots ? fy_plan_block_inputs_store_bytes(&in->shape) : 0;
    swap_room(a->o, fy_pool_layout_size(regions, n), inputs_bytes, host, ssd);
}

/* The block profiled (restarted as in training where a worker fails, with train's restarts), the
 * SSD rates taken from the last session's steps where --step-rates says, and for auto the room.
 * 0, or -errno where the plan must not go on (interrupted, a worker that failed, a run directory
 * in use); a profile that failed otherwise is said, and the plan goes on without it. */
static int profile_block(struct fy_actsetup *a, const struct fy_plan_in *in,
                         const struct fy_plan *p)
{
    const struct fy_options *o = a->o;
    struct fy_actplace_in *ain = &a->in;
    struct fy_sup_fault fault;
    int rc;
    for (;;) {
        double t0 = fy_monotonic_ns() * 1e-9;
        rc = fy_profile_run(o, in->shape.c, in->shape.act_dtype, &a->prof, &ain->rates, &fault);
        if (a->restarts == NULL || !fy_restart_after(a->restarts, rc, 0, &fault, t0))
            break;
        fy_progress_restart();
    }
    /* interrupted, a worker that failed, a run directory in use, options refused (the command
     * refuses them too): said, and no plan */
    if (rc == -EINTR || rc == -ECHILD || rc == -ETIMEDOUT || rc == -EBUSY || rc == -FY_EUSAGE)
        return rc;
    if (rc < 0 && ain->mode == FY_ACTPLAN_AUTO) /* loudly, and on with what needs no profile */
        fy_warn("--act-plan auto: profiling a block failed (above): planning without it, the "
                "gpu worker keeps the internals of what fits and nothing is swapped");
    else if (rc < 0)
        fy_warn("--act-plan %s: profiling a block failed (above): the step is not predicted",
                o->act_plan);
    ain->prof = rc == 0 ? &a->prof : NULL;
    if (rc == 0) {
        int took =
            fy_actsetup_step_rates(o, ain->c->optim_state, &ain->rates, "the profile's sample");
        ain->ssd_rates_from_steps = (took & FY_STEPRATES_SSD) != 0;
        ain->opt_rate_from_steps = (took & FY_STEPRATES_OPT) != 0;
    }
    if (ain->mode == FY_ACTPLAN_AUTO)
        auto_room(a, in, p, &ain->host_bytes, &ain->ssd_bytes);
    return 0;
}

/* fy_plan_make's activation step (fy_actsetup_acts). */
static int place_acts(void *ctx, const struct fy_plan_in *in, struct fy_plan *p)
{
    struct fy_actsetup *a = ctx;
    const struct fy_options *o = a->o;
    const struct fy_model_config *model = in->shape.c;
    a->in = fy_actplace_in_of_plan(in, p);
    a->in.resident = p->resident;
    a->in.weight_dtype = in->shape.weight_dtype;
    a->in.rates = fy_plan_reference_rates;
    FY_TRY(fy_plan_rates_select(&a->in.rates, model->optim_state, "the reference machine"));
    /* every mode is profiled: auto plans from it, the forced ones are predicted from it */
    const struct fy_arch *arch = fy_model_arch(model);
    if (arch->swaps_internals && !o->inprocess) {
        FY_TRY(profile_block(a, in, p));
        /* one pass's gradients held in the GPU arena come before the kept internals */
        uint64_t hold = p->place.grad_hold == FY_HOLD_GPU ? fy_plan_hold_bytes(model) : 0;
        if (a->in.prof != NULL)
            a->prof.gpu_free = a->prof.gpu_free > hold ? a->prof.gpu_free - hold : 0;
    } else if (in->act_mode == FY_ACTPLAN_AUTO && !arch->swaps_internals) {
        fy_info("--act-plan auto: a %s model's blocks are neither profiled nor swapped: %s",
                arch->label,
                strcmp(in->backend, "cuda") == 0
                    ? "the gpu worker keeps the internals of the top blocks that fit the GPU and "
                      "recomputes the others in their backward"
                    : "the CPU backend keeps no block's internals, every backward recomputes them");
    }
    FY_TRY(fy_actplace_plan(&a->in, &a->run));
    fy_actplace_log(&a->run, &a->in);
    p->place.swap = a->run.swap;
    return 0;
}

struct fy_plan_acts fy_actsetup_acts(struct fy_actsetup *a)
{
    return (struct fy_plan_acts){.place = place_acts, .ctx = a};
}

void fy_actsetup_release(struct fy_actsetup *a) { fy_actplace_release(&a->run); }

/* The plan for people and tools: RUN/act_plan.json, replaced whole. */
int fy_actsetup_save(const struct fy_actsetup *a)
{
    const struct fy_options *o = a->o;
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/act_plan.json", o->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    FY_REQUIRE(f != NULL, -errno, "cannot create %s: %s", tmp, strerror(errno));
    int rc = fy_actplace_write_json(&a->run, &a->in, f);
    if (fclose(f) != 0 && rc == 0) {
        rc = -errno;
        fy_error("writing %s: %s", tmp, strerror(-rc));
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -errno;
        fy_error("cannot rename %s to %s: %s", tmp, path, strerror(-rc));
    }
    return rc;
}
