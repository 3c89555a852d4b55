/* fuyou-launch train (and resume, which runs a run's train command again: cmd_resume.c): the run's
 * model trained through the workers from the store's last commit (launcher/step/train.h), the
 * placement planned first (state, checkpoints, the blocks' internals, pool regions) and said; a
 * worker that fails is restarted from the last commit (launcher/run/restart.h). The data and its
 * batches: launcher/cmd/traindata.h; the command's record for resume: launcher/cmd/trainargs.h. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/model/actplan.h"
#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/fsutil.h"
#include "common/base/log.h"
#include "common/data/sampler.h"
#include "common/formats/tokfile.h"
#include "gpu_worker/backend.h"
#include "launcher/cmd/cmd.h"
#include "launcher/cmd/traindata.h"
#include "launcher/cmd/trainargs.h"
#include "launcher/step/commit.h"
#include "launcher/plan/steprates.h"
#include "launcher/run/inproc.h"
#include "launcher/step/metrics.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/plan_describe.h"
#include "launcher/cli/actsetup.h"
#include "launcher/step/progress.h"
#include "launcher/run/restart.h"
#include "launcher/cli/runconf.h"
#include "launcher/run/session.h"
#include "launcher/step/train.h"

/* Set by the supervisor on the first SIGINT or SIGTERM of a training run. */
static volatile int train_stop;

/* The SSD's and AdamW's rates in this session's steps, for the next session's plan (--step-rates
 * auto): kept where the steps after the first moved anything on the SSD or the plan predicted
 * the opt worker's time; a record that cannot be written is said, and the run goes on (the next
 * plan uses its profile). */
static void save_steps_seen(const struct fy_options *o, const struct fy_steprates *d)
{
    double adamw = fy_steprates_opt_params(d);
    if (d->steps == 0 || (d->read_bytes == 0 && d->write_bytes == 0 && !(adamw > 0)))
        return;
    char path[PATH_MAX], r[32], w[32], a[32], p[32];
    fy_actsetup_step_rates_path(o, path, sizeof path);
    if (fy_steprates_save(path, d) < 0) {
        fy_warn("the rates of this session's steps were not kept (above): the next session plans "
                "from its profile");
        return;
    }
    fy_info("the SSD ran at read %s, write %s GB/s and AdamW at %s G parameters/s (the plan's: "
            "%s) in this session's %llu step%s after the first (kept in %s for the next "
            "session's plan)",
            fy_steprates_gbps(fy_steprates_read_Bps(d), "-", r, sizeof r),
            fy_steprates_gbps(fy_steprates_write_Bps(d), "-", w, sizeof w),
            fy_steprates_gbps(adamw, "-", a, sizeof a),
            fy_steprates_gbps(d->opt_plan_params, "-", p, sizeof p), (unsigned long long)d->steps,
            d->steps == 1 ? "" : "s", path);
}

/* Whether any launch of the workers began the steps (for the line of a stop). */
static int train_stepped;
/* Whether the steps' own line of a stop was said (train_steps). */
static int train_stop_said;

/* A train command's plan and state, from the model to the last step; train_free frees it whatever
 * happened. */
struct train_run {
    struct fy_config *mc, *cfg; /* RUN/model.conf; the workers' configuration */
    struct fy_model_config model;
    struct fy_tokfile *data;
    struct fy_sampler *batches; /* the data's batches */
    struct fy_restart restarts;
    struct fy_plan_in plan_in;
    struct fy_plan plan;
    struct fy_actsetup act; /* the plan's activation step */
    int have_probe;         /* plan_in.rates are RUN/machine.json's (fuyou-launch probe) */
    int from_steps; /* FY_STEPRATES_*: those of them from RUN/step_rates.json (the last session) */
    char probed[PATH_MAX + 16];
    struct fy_train_opts to;
    struct fy_steprates steps_seen;
    struct fy_storemeta *meta;
    int args_pending;  /* RUN/train.args.pending is this command's (written, or resumed) */
    int args_promoted; /* ... and became RUN/train.args */
};

static void train_free(struct train_run *t)
{
    free(t->meta);
    fy_actsetup_release(&t->act);
    fy_plan_release(&t->plan);
    fy_sampler_destroy(&t->batches);
    fy_tokfile_destroy(&t->data);
    free(t->mc);
    free(t->cfg);
    free(t);
}

/* One launch of the workers for training: the store's current commit (a restart goes back to it;
 * the metrics of later steps are dropped, as they will be trained again), the steps up to
 * --steps, and the export. *fault says which worker failed and how; *stepping whether training
 * had begun (the commit was opened). The train command becomes the run's RUN/train.args once the
 * workers are up and the store is short of --steps: the command trains. */
/* The executor of a launch: the workers started, or with --inprocess the same handlers in this
 * process over a store in memory, initialised from the run's seed. */
static int start_executor(struct fy_options *o, struct train_run *t, struct fy_session *s,
                          int ready_timeout_ms, struct fy_inproc **inproc, struct fy_exec *x)
{
    static const char *const workers[] = {"gpu", "io", "opt"};
    if (!o->inprocess) {
        int rc = fy_session_start(s, t->cfg, workers, 3, ready_timeout_ms);
        *x = fy_session_exec(s);
        if (rc == 0) /* Ctrl-C or SIGTERM: stop at the next step boundary, committed */
            fy_sup_set_stop_flag(s->sup, &train_stop);
        return rc;
    }
    if (fy_config_get(t->mc, "hf") != NULL) {
        fy_error("train --inprocess starts from the run's seeded initialisation in memory, and %s "
                 "holds an imported Hugging Face model: drop --inprocess to train it through the "
                 "workers",
                 o->run_dir);
        return -FY_EUSAGE;
    }
    if (o->gpus > 1) {
        fy_error("train --inprocess runs one CPU backend inside the launcher: drop --gpus %llu or "
                 "--inprocess",
                 (unsigned long long)o->gpus);
        return -FY_EUSAGE;
    }
    FY_TRY(fy_inproc_new(inproc, s->pool, t->cfg, s->aff.opt));
    *x = fy_inproc_exec(*inproc);
    uint64_t seed;
    FY_TRY(fy_config_get_u64(t->mc, "seed", 1, 0, &seed));
    return fy_train_init_store(x, s->pool, &t->model, seed, 2, o->timeout_s * 1000);
}

/* The trained step exported (--export), its file's missing directories made first and removed
 * again where it is not written. */
static int export_trained(const struct fy_options *o, const struct fy_exec *x, struct fy_pool *pool,
                          struct fy_storemeta *meta)
{
    struct fy_made_dirs made;
    int rc;
    FY_TRY_OUT(rc, fy_mkdirs_for(o->export_path, "the directory of the export", &made));
    FY_TRY_OUT(rc,
               fy_train_export(x, pool, meta, o->export_path, o->overwrite, o->timeout_s * 1000));
    fy_info("exported step %llu to %s", (unsigned long long)meta->step, o->export_path);
    return 0;
out:
    fy_made_dirs_undo(&made, NULL, 0);
    return rc;
}

static int train_attempt(struct fy_options *o, struct train_run *t, int attempt,
                         struct fy_sup_fault *fault, int *stepping)
{
    *stepping = 0;
    double t0 = fy_monotonic_ns() * 1e-9;
    struct fy_storemeta *meta = t->meta;
    struct fy_session s;
    struct fy_session_opts so = fy_runconf_session(o);
    struct fy_inproc *inproc = NULL;
    struct fy_exec x = {0};
    FILE *trace = NULL;
    struct fy_made_dirs made; /* an output's missing directories, removed if it is not written */
    int rc;
    FY_TRY_OUT(rc, fy_session_open(&s, &so, t->plan.regions, t->plan.n_regions, "training"));
    FY_TRY_OUT(rc, start_executor(o, t, &s, so.ready_timeout_ms, &inproc, &x));
    FY_TRY_OUT(rc, fy_train_read_meta(&x, s.pool, o->ssd, meta, o->timeout_s * 1000));
    FY_TRY_OUT(rc, fy_runconf_check_store(meta, &t->model, o->ssd));
    if (o->train_args_extended && !t->args_promoted && meta->step < o->steps) {
        /* a resume that trains with options of its own: the record becomes this command, so a
         * later resume (after a crash, say) goes on with them, --steps extended among them */
        int written = 0;
        FY_TRY_OUT(rc, fy_trainargs_save(o->run_dir, o->train_argc, o->train_argv, &written));
        t->args_pending |= written;
    }
    if (t->args_pending && !t->args_promoted && meta->step < o->steps) {
        FY_TRY_OUT(rc, fy_trainargs_promote(o->run_dir));
        t->args_promoted = 1;
    }
    if (o->trace != NULL) {
        FY_TRY_OUT(rc, fy_mkdirs_for(o->trace, "the directory of the trace file", &made));
        if ((trace = fopen(o->trace, "w")) == NULL) {
            rc = -errno;
            fy_error("cannot create the trace file %s: %s", o->trace, strerror(-rc));
            fy_made_dirs_undo(&made, NULL, 0);
            goto out;
        }
    }
    t->to.trace = trace;
    if (attempt > 0)
        fy_info("restarted in %.2f s: the workers are up again, the store's last commit is "
                "step %llu",
                fy_monotonic_ns() * 1e-9 - t0, (unsigned long long)meta->step);
    *stepping = train_stepped = 1;
    rc = fy_train_run(&x, s.pool, meta, t->batches, &t->to);
    t->to.trace = NULL;
    if (rc < 0)
        goto out;
    if (!train_stop && o->export_path != NULL)
        FY_TRY_OUT(rc, export_trained(o, &x, s.pool, meta));
out:
    if (rc == -ENOSPC || rc == -EDQUOT || rc == -EFBIG)
        fy_error("the SSD store (%s) is full: training stopped; the last commit, step %llu, is "
                 "intact; free space there (or add an SSD path), then continue with fuyou-launch "
                 "resume %s",
                 o->ssd, (unsigned long long)meta->step, o->run_dir);
    if (trace != NULL && fclose(trace) != 0)
        fy_warn("writing the trace file %s failed: %s", o->trace, strerror(errno));
    fy_inproc_destroy(&inproc);
    rc = fy_session_close(&s, rc);
    *fault = s.fault;
    return rc;
}

/* Training writes its log, metrics, commits and (in RUN/store) the store in the run directory:
 * one it cannot write is refused before anything starts. */
static int check_run_dir_writable(const char *run_dir)
{
    struct statvfs fs;
    int e = statvfs(run_dir, &fs) != 0          ? errno
            : (fs.f_flag & ST_RDONLY) != 0      ? EROFS
            : access(run_dir, W_OK | X_OK) != 0 ? errno
                                                : 0;
    if (e == 0)
        return 0;
    fy_error("run directory %s cannot be written (%s): training writes its log, metrics and "
             "commits there; copy it somewhere writable (cp -a) and train or resume the copy",
             run_dir, strerror(e));
    return -e;
}

/* The run's model and data, the backend settled, and the workers' configuration. */
static int train_setup(struct fy_options *o, struct train_run *t)
{
    t->mc = calloc(1, sizeof *t->mc);
    t->cfg = calloc(1, sizeof *t->cfg);
    if (t->mc == NULL || t->cfg == NULL)
        return -ENOMEM;
    FY_TRY(fy_runconf_load(o, t->mc, &t->model));
    /* before anything reads them: the plan takes the clipping */
    char said[PATH_MAX + 1024];
    fy_runconf_train_defaults(o, t->mc, said, sizeof said);
    fy_info("train: %s", said);
    fy_runconf_cpu_mem(o, said, sizeof said);
    fy_info("train: %s", said);
    if (o->optim_state >= 0 && o->optim_state != t->model.optim_state) {
        fy_error("train --optim-state %s: the run keeps %s optimizer state (init --optim-state "
                 "%s), and a store's format is not converted: drop --optim-state, or start a run "
                 "in %s from this one's weights (export --to-hf, then init --from-hf "
                 "--optim-state %s: Adam's moments start again from zero)",
                 fy_optim_state_name(o->optim_state), fy_optim_state_name(t->model.optim_state),
                 fy_optim_state_name(t->model.optim_state), fy_optim_state_name(o->optim_state),
                 fy_optim_state_name(o->optim_state));
        return -FY_EUSAGE;
    }
    FY_TRY(check_run_dir_writable(o->run_dir));
    if (o->train_args_from == FY_TRAIN_ARGS_GIVEN) /* before anything starts */
        FY_TRY(fy_trainargs_save(o->run_dir, o->train_argc, o->train_argv, &t->args_pending));
    t->args_pending |= o->train_args_from == FY_TRAIN_ARGS_PENDING;
    FY_USAGE(o->seq <= t->model.ctx, "train: --seq %llu exceeds the model's context of %u tokens",
             (unsigned long long)o->seq, t->model.ctx);
    FY_TRY(fy_traindata_open(o, &t->model, &t->data, &t->batches));
    /* "auto" is settled here, not in the gpu worker: the activations' dtype in the pool follows the
     * backend (bf16 where the device computes in bf16: the same bits, half the bytes) */
    const char *asked = o->backend;
    FY_USAGE(!o->inprocess || strcmp(asked, "cuda") != 0,
             "train --inprocess runs the CPU backend inside the launcher: drop --backend cuda, or "
             "drop --inprocess to train on the GPU through the workers");
    o->backend = o->inprocess ? "cpu" : fy_backend_resolve(o->backend);
    if (!o->inprocess && strcmp(asked, "auto") == 0 && strcmp(o->backend, "cpu") == 0)
        fy_warn("--backend auto: %s: using the CPU backend (slow; for tests and laptops)",
                fy_backend_cuda_built() ? "no CUDA device is visible"
                                        : "this build has no CUDA backend (nvcc was not found)");
    /* the arena's budget, before the plan checks what it holds */
    fy_runconf_gpu_mem(o, said, sizeof said);
    if (said[0])
        fy_info("train: %s", said);
    FY_TRY(fy_runconf_plan_in(o, &t->model, o->backend, &t->plan_in));
    return fy_runconf_train(o, &t->model, t->plan_in.shape.act_dtype, t->cfg);
}

/* The train line: the model, the batch, the schedule and the data. */
static void train_describe(const struct fy_options *o, const struct train_run *t)
{
    char described[160];
    fy_model_config_describe(&t->model, described, sizeof described);
    char clip[96] = "";
    if (o->clip_grad_norm > 0)
        snprintf(clip, sizeof clip, ", gradient norm clipped to %g", o->clip_grad_norm);
    fy_info("train: %s; batch %llu x %llu tokens, steps to %llu, lr %g (warmup %llu, %s to %g), "
            "weight decay %g, betas %g/%g, eps %g%s; %s schedule, weights read %llu unit%s ahead; "
            "data %s (%llu training, %llu held-out tokens)%s",
            described, (unsigned long long)o->batch, (unsigned long long)o->seq,
            (unsigned long long)o->steps, o->lr, (unsigned long long)o->warmup,
            fy_train_lr_schedule_name(o->lr_schedule), o->lr * o->min_lr_ratio, o->weight_decay,
            o->beta1, o->beta2, o->adam_eps, clip, o->overlap ? "overlapped" : "serial",
            (unsigned long long)o->prefetch, o->prefetch == 1 ? "" : "s", o->data,
            (unsigned long long)fy_tokfile_split_tokens(t->data, FY_TOKFILE_TRAIN),
            (unsigned long long)fy_tokfile_split_tokens(t->data, FY_TOKFILE_EVAL),
            o->inprocess ? "; in one process, state in memory" : "");
    fy_traindata_describe(o, t->data, t->batches);
}

/* The rates the plan predicts with: RUN/machine.json's where fuyou-launch probe measured this
 * machine, else the reference machine's; AdamW's with the run's optimizer state format. */
static int train_rates(const struct fy_options *o, struct train_run *t)
{
    snprintf(t->probed, sizeof t->probed, "%s/machine.json", o->run_dir);
    t->have_probe =
        access(t->probed, R_OK) == 0 && fy_plan_rates_load(t->probed, &t->plan_in.rates) == 0;
    FY_TRY(fy_plan_rates_select(&t->plan_in.rates, t->model.optim_state,
                                t->have_probe ? t->probed : "the reference machine"));
    /* Where no block is profiled (the activation plan predicts from its profile, and takes the
     * record there), the SSD rates of the run's last session on this store, as `plan` takes them */
    if (!fy_model_arch(&t->model)->swaps_internals || o->inprocess)
        t->from_steps =
            fy_actsetup_step_rates(o, t->model.optim_state, &t->plan_in.rates,
                                   t->have_probe ? "machine.json's" : "the reference machine's");
    return 0;
}

/* The plan (launcher/plan/plan.h) with the activation plan as its activation step: forced swapping
 * (--act-plan host or ssd) puts the internals in the pool first and the state's residency after;
 * auto profiles and plans in the room that state and streaming leave. The activation plan goes to
 * the workers' configuration and RUN/act_plan.json. */
static int train_plan(const struct fy_options *o, struct train_run *t)
{
    FY_TRY(train_rates(o, t));
    t->plan_in.say = 1;
    t->act = (struct fy_actsetup){.o = o, .restarts = &t->restarts};
    struct fy_plan_acts acts = fy_actsetup_acts(&t->act);
    FY_TRY(fy_plan_check_gpu(&t->plan_in, NULL)); /* before the activation step's profile */
    FY_TRY(fy_plan_make(&t->plan_in, &acts, &t->plan));
    FY_TRY(fy_plan_check_gpu(&t->plan_in, &t->plan));
    t->act.in.clip_hold = t->plan.place.grad_hold; /* forced modes were placed before it */
    t->act.in.state_pieces = t->plan.place.state_pieces;
    if (t->plan_in.act_mode != FY_ACTPLAN_AUTO) /* with the residency just planned */
        FY_TRY(fy_actplace_predict(&t->act.in, &t->act.run));
    const struct fy_actplace *act = &t->act.run;
    FY_TRY(fy_config_setf(t->cfg, "train.act_keep", "%d",
                          act->keep < 0 ? (int)t->model.n_layer : act->keep));
    FY_TRY(fy_config_setf(t->cfg, "train.act_swap", "%d", act->swap_sets));
    /* one pass's gradients held in the GPU arena, a buffer per block */
    FY_TRY(fy_config_setf(t->cfg, "train.grad_hold", "%u",
                          t->plan.place.grad_hold == FY_HOLD_GPU ? t->model.n_layer : 0));
    return fy_actsetup_save(&t->act);
}

/* The plan's lines on what stays in the pool and what moves over the SSD and PCIe each step. */
static void train_log_traffic(const struct fy_options *o, const struct train_run *t)
{
    const struct fy_plan *p = &t->plan;
    unsigned kept = p->kept, units = fy_model_unit_count(&t->model);
    char kept_size[32], rd[32], wr[32], up[32], down[32];
    fy_format_size(p->resident_bytes, kept_size, sizeof kept_size);
    fy_format_size(p->traffic.ssd_read, rd, sizeof rd);
    fy_format_size(p->traffic.ssd_write, wr, sizeof wr);
    fy_format_size(p->traffic.to_gpu, up, sizeof up);
    fy_format_size(p->traffic.from_gpu, down, sizeof down);
    fy_info("plan: optimizer state of %u of %u units (%s) stays in the shared pool across steps; "
            "%s streams from the SSD store each step (reads %s, writes %s per step)%s; PCIe per "
            "step: at most %s to the GPU (less where a unit's output stays on the GPU for the "
            "next), %s back",
            kept, units, kept_size, kept == units ? "nothing" : "the rest", rd, wr,
            o->cpu_mem ? "" : " (give --cpu-mem to keep state in memory)", up, down);
    char clipping[768];
    fy_plan_state_describe(&t->plan_in, p, clipping, sizeof clipping);
    if (clipping[0])
        fy_info("plan: %s", clipping);
    fy_plan_clip_describe(&t->plan_in, p, clipping, sizeof clipping);
    if (clipping[0])
        fy_info("plan: %s", clipping);
    char weights[320];
    fy_plan_weights_describe(&t->plan_in.shape, p, weights, sizeof weights);
    if (t->plan_in.shape.weight_dtype == FY_DTYPE_BF16)
        fy_info("plan: %s", weights);
    else
        fy_info("plan: %s (--weights-dtype %s)", weights,
                o->weights_dtype ? "f32" : "auto, on the CPU backend");
}

/* The plan's predicted step, said: from the activation plan's profile where it has one, else at
 * the rates of RUN/machine.json (fuyou-launch probe) or the reference machine's. Returns the
 * seconds a step is predicted to take, 0 where nothing is predicted (the CPU backend's compute). */
static double train_log_prediction(const struct fy_options *o, const struct train_run *t)
{
    const struct fy_plan_rates *rates = &t->plan_in.rates;
    const struct fy_plan_prediction *p = &t->plan.predicted;
    char at[PATH_MAX + 96];
    char steps[96] = "";
    if (t->from_steps)
        snprintf(steps, sizeof steps, "; %s as this run's last session's steps ran",
                 fy_steprates_taken(t->from_steps));
    if (t->have_probe) /* fuyou-launch probe measured this machine */
        snprintf(at, sizeof at, "predicted per step at this machine's rates (%s%s", t->probed,
                 steps);
    else
        snprintf(at, sizeof at,
                 "predicted per step at the rates measured on the reference "
                 "machine (one H200%s",
                 steps);
    double step_flops =
        (double)o->batch * (double)o->seq * fy_model_flops_per_token(&t->model, (unsigned)o->seq);
    double predicted_s = t->act.run.predicted_s;
    if (predicted_s > 0) /* measured here: the reference machine's figures would mislead */
        fy_info("plan: per step, as the activation plan above predicts from this machine's "
                "profile: %.3f s (%.3g TFLOP/s)",
                predicted_s, step_flops / predicted_s * 1e-12);
    else if (strcmp(o->backend, "cpu") == 0 && !t->have_probe) /* not the H200's compute */
        fy_info("plan: %s: SSD %.1f/%.1f GB/s, AdamW %.1f G parameters/s): SSD %.3f s, optimizer "
                "%.3f s; compute not predicted on the CPU backend",
                at, rates->ssd_read * 1e-9, rates->ssd_write * 1e-9,
                fy_plan_rates_opt_worker(rates) * 1e-9, p->ssd_s, p->opt_s);
    else
        fy_info("plan: %s: %.0f TFLOP/s with blocks recomputed, PCIe %.0f/%.0f GB/s, SSD "
                "%.1f/%.1f GB/s, AdamW %.1f G parameters/s; yours may differ): GPU compute %.3f s, "
                "PCIe to the GPU at most %.3f s, from it %.3f s, SSD %.3f s, optimizer %.3f s%s; "
                "bound %.3f s by the %s (%.0f TFLOP/s)",
                at, rates->gpu_flops * 1e-12, rates->h2d * 1e-9, rates->d2h * 1e-9,
                rates->ssd_read * 1e-9, rates->ssd_write * 1e-9,
                fy_plan_rates_opt_worker(rates) * 1e-9, p->gpu_s, p->h2d_s, p->d2h_s, p->ssd_s,
                p->opt_s, p->convert_s > 0 ? " (with its conversions of weights for the GPU)" : "",
                p->step_s, p->bound, step_flops / p->step_s * 1e-12);
    return predicted_s > 0 ? predicted_s : strcmp(o->backend, "cpu") != 0 ? p->step_s : 0;
}

/* The options of the steps from the plan, said: the gradient slots that fit, and a stuck worker's
 * deadline from `predicted_s` unless --timeout gave it. */
static void train_layout(const struct fy_options *o, struct train_run *t, double predicted_s)
{
    const struct fy_plan *p = &t->plan;
    unsigned grad_slots = p->place.grad_slots;
    fy_info("plan: %u block gradients in the pool at once (--grad-slots %llu): the optimizer can "
            "fall %u blocks behind the backward and finish while the next forward runs",
            grad_slots, (unsigned long long)o->grad_slots, grad_slots - 1);
    const struct fy_actplace *act = &t->act.run;
    const struct fy_actplace_in *act_in = &t->act.in;
    t->to =
        (struct fy_train_opts){.steps = o->steps,
                               .batch = (int)o->batch,
                               .seq = (int)o->seq,
                               .ranks = (int)o->gpus,
                               .lr = o->lr,
                               .warmup = o->warmup,
                               .min_lr_ratio = o->min_lr_ratio,
                               .schedule = (enum fy_lr_schedule)o->lr_schedule,
                               .seed = o->seed,
                               .epoch_steps = fy_sampler_epoch_steps(t->batches),
                               .epochs = o->epochs_set ? o->epochs : 0,
                               .documents = fy_sampler_packing(t->batches) == FY_PACKING_DOCUMENTS,
                               .eval_every = o->eval_every,
                               .eval_batches = o->eval_batches,
                               .checkpoint_every = o->checkpoint_every,
                               .timeout_ms = o->timeout_s * 1000,
                               .overlap = o->overlap,
                               .resident = p->resident,
                               .clip_grad_norm = o->clip_grad_norm,
                               .grad_hold_gpu = p->place.grad_hold == FY_HOLD_GPU,
                               .block_inputs_ssd = p->place.block_inputs_slots != 0,
                               .act_ahead = (unsigned)o->act_ahead,
                               .state_pieces = p->place.state_pieces,
                               .act_dtype = t->plan_in.shape.act_dtype,
                               .act_place = act->place,
                               .weight_dtype = t->plan_in.shape.weight_dtype,
                               .saved_sizes = act->sizes,
                               .stop = &train_stop,
                               .plan_step_s = act->predicted_s,
                               .plan_ssd_read = act_in->rates.ssd_read,
                               .plan_ssd_write = act_in->rates.ssd_write,
                               .plan_opt_params = fy_plan_rates_opt_worker(&act_in->rates),
                               .plan_opt_s = act->opt_s,
                               .plan_ssd_from_steps = act_in->ssd_rates_from_steps,
                               .plan_opt_from_steps = act_in->opt_rate_from_steps};
    fy_steprates_begin(&t->steps_seen, o->ssd, (int)o->batch, o->act_plan);
    fy_steprates_plan_opt(&t->steps_seen, fy_optim_state_name(t->model.optim_state),
                          fy_plan_rates_opt_worker(&act_in->rates), act->opt_s);
    t->to.steps_seen = &t->steps_seen;
    if (!o->timeout_set) { /* a stuck worker is one that takes far longer than the plan says */
        if (predicted_s > 0) {
            double deadline = 20 * predicted_s < 60 ? 60 : 20 * predicted_s;
            t->to.timeout_ms = deadline > 3600 ? 3600 * 1000 : (int)(deadline * 1000);
        }
        fy_info("plan: a request not answered within %d s counts as a stuck worker (%s; "
                "--timeout to set it)",
                t->to.timeout_ms / 1000,
                predicted_s > 0 ? "20 predicted steps, at least a minute" : "the default");
    }
}

/* The steps: launches of the workers until --steps is reached, the run is stopped, or a worker
 * fails more often than --max-restarts allows. */
static int train_steps(struct fy_options *o, struct train_run *t)
{
    t->meta = calloc(1, sizeof *t->meta);
    struct fy_metrics *metrics = NULL; /* kept across restarts: lines wait there for room */
    int rc = -ENOMEM;
    if (t->meta == NULL)
        goto out;
    FY_TRY_OUT(rc, fy_metrics_open(&metrics, o->run_dir));
    t->to.metrics = metrics;
    /* A worker that dies or hangs costs the steps since the last commit, not the run: the
     * workers start again and the run goes on from that commit, up to --max-restarts times an
     * hour (fy_restart_after). */
    for (int attempt = 0;; attempt++) {
        double t0 = fy_monotonic_ns() * 1e-9;
        struct fy_sup_fault fault;
        int stepping;
        rc = train_attempt(o, t, attempt, &fault, &stepping);
        if (!fy_restart_after(&t->restarts, rc, stepping, &fault, t0))
            break;
        fy_progress_restart();
    }
out:
    fy_progress_end();
    save_steps_seen(o, &t->steps_seen);
    if (rc == 0 && train_stop) {
        fy_warn("stopped after step %llu, which is committed: fuyou-launch resume %s continues "
                "from there (nothing exported)",
                (unsigned long long)t->meta->step, o->run_dir);
        train_stop_said = 1;
        rc = -EINTR;
    }
    int lost = fy_metrics_close(&metrics, t->meta != NULL ? t->meta->step : 0);
    return rc ? rc : lost;
}

/* The train command line, for the log: its arguments joined by spaces. */
static void describe_command(const struct fy_options *o, char *out, size_t len)
{
    out[0] = 0;
    for (int i = 0; i < o->train_argc; i++) {
        size_t at = strlen(out);
        snprintf(out + at, len - at, " %s", o->train_argv[i]);
    }
}

int fy_cmd_train(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "train"));
    if (o->train_args_from == FY_TRAIN_ARGS_PENDING) {
        char command[4096], recorded[PATH_MAX];
        describe_command(o, command, sizeof command);
        snprintf(recorded, sizeof recorded, "%s/%s", o->run_dir, FY_TRAINARGS);
        fy_info("resume: %s/%s holds the train command of a launch stopped before its steps "
                "began (a signal or a crash at start-up): resuming it%s%s%s: fuyou-launch train%s",
                o->run_dir, FY_TRAINARGS_PENDING, access(recorded, F_OK) == 0 ? " (not " : "",
                access(recorded, F_OK) == 0 ? recorded : "",
                access(recorded, F_OK) == 0 ? ", the last command that trained)" : "", command);
    }
    FY_TRY(fy_options_require(o->data, "--data", "train"));
    if (o->steps_set && o->epochs_set && o->train_args_from == FY_TRAIN_ARGS_GIVEN) {
        fy_error("train: give --steps or --epochs, not both: --epochs N trains N passes over the "
                 "training documents, --steps N to step N");
        return -FY_EUSAGE;
    }
    if (o->steps_set && o->epochs_set) { /* resume: the one given last, after the recorded */
        fy_info("resume: %s given after the run's %s: it counts",
                o->epochs_last ? "--epochs" : "--steps", o->epochs_last ? "--steps" : "--epochs");
        o->steps_set = !o->epochs_last;
        o->epochs_set = o->epochs_last;
    }
    if (!o->steps_set)
        o->steps = 200; /* --epochs sets it once the data's epoch is known */
    FY_USAGE(o->batch >= 1 && o->batch <= 65536 && o->seq >= 1,
             "train: --batch %llu --seq %llu: need a batch of 1 to 65536 sequences and a positive "
             "sequence length",
             (unsigned long long)o->batch, (unsigned long long)o->seq);
    struct train_run *t = calloc(1, sizeof *t);
    if (t == NULL)
        return -ENOMEM;
    fy_restart_init(&t->restarts, o->max_restarts, o->run_dir, &train_stop);
    int rc;
    FY_TRY_OUT(rc, train_setup(o, t));
    train_describe(o, t);
    FY_TRY_OUT(rc, train_plan(o, t));
    train_log_traffic(o, t);
    train_layout(o, t, train_log_prediction(o, t));
    rc = train_steps(o, t);
out:
    fy_trainargs_settle(o, t->args_pending, t->args_promoted, rc);
    train_free(t);
    return rc;
}

void fy_cmd_train_stopped(const struct fy_options *o, const char *removed)
{
    (void)removed; /* train makes no run directory */
    if (train_stop_said)
        return; /* the steps said where they stopped */
    char committed[64] = "the store's last commit could not be read (above)";
    struct fy_storemeta *m = malloc(sizeof *m);
    if (o->ssd != NULL && m != NULL && fy_commit_peek(o->ssd, m) == 0)
        snprintf(committed, sizeof committed, "step %llu is committed",
                 (unsigned long long)m->step);
    free(m);
    if (train_stepped) /* a second signal in a step, or one while the workers restarted */
        fy_warn("stopped by signal: %s (the steps after it are trained again): fuyou-launch "
                "resume %s continues from there",
                committed, o->run_dir);
    else
        fy_warn("stopped by signal before training began: %s: fuyou-launch resume %s runs this "
                "train command from there",
                committed, o->run_dir);
}
