/* A training run over an executor (launcher/step/train.h): the steps from the store's last intact
 * commit, each logged (the progress line, metrics.jsonl, the plan check) and committed every
 * --checkpoint-every steps, at the end and at a stop; store initialisation and export. One step's
 * schedule is launcher/step/sched.h's and its parts'. */
#include "launcher/step/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "launcher/plan/steprates.h"
#include "launcher/step/commit.h"
#include "launcher/step/metrics.h"
#include "launcher/step/progress.h"
#include "launcher/step/sched.h"
#include "launcher/step/sched_backward.h"
#include "launcher/step/sched_clip.h"
#include "launcher/step/sched_forward.h"
#include "launcher/step/sched_state.h"
#include "launcher/step/sched_weights.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

struct init_ctx {
    const struct fy_model_config *c;
    uint64_t seed;
};

static int init_unit(void *ctx, unsigned unit, float *master)
{
    const struct init_ctx *i = ctx;
    fy_model_init_unit(i->c, unit, i->seed, master);
    return 0;
}

int fy_train_init_store(const struct fy_exec *x, struct fy_pool *pool,
                        const struct fy_model_config *c, uint64_t seed, unsigned copies,
                        int timeout_ms)
{
    struct fy_sched r;
    const struct fy_plan_shape one = {.c = c, .B = 1, .T = 1, .act_dtype = FY_DTYPE_F32};
    FY_TRY(fy_sched_init(&r, pool, &one, x, timeout_ms));
    struct init_ctx ctx = {c, seed};
    /* the two state slots, one piece's state each */
    const uint64_t bufs[2] = {r.l.state, r.l.state + r.l.state_slot_bytes};
    int rc =
        fy_commit_create(x, pool, r.l.meta, bufs, c, seed, copies, init_unit, &ctx, timeout_ms);
    fy_sched_release(&r);
    return rc;
}

int fy_train_read_meta(const struct fy_exec *x, struct fy_pool *pool, const char *where,
                       struct fy_storemeta *meta, int timeout_ms)
{
    uint64_t off, bytes;
    FY_TRY(fy_pool_region(pool, "meta", &off, &bytes));
    FY_REQUIRE(bytes >= FY_COMMIT_RECORD_BYTES, -EINVAL,
               "shared pool: the meta region of %llu bytes does not hold a commit record",
               (unsigned long long)bytes);
    return fy_commit_read(x, pool, off, where, UINT64_MAX, meta, timeout_ms);
}

/* A step as its log lines say it: what it computed, and the time waited for each worker and each
 * resource's busy time and bytes in it. */
struct step_line {
    uint64_t step;
    double loss, lr;
    struct fy_sampler_fill fill; /* the batch's documents' positions and counted targets */
    double grad_norm; /* < 0: not computed (no clipping: computing it would cost a backward pass) */
    double seconds;
    double wait_s[FY_TICKET_WORKERS], busy[FY_TICKET_BUSY_COUNT];
    uint64_t bytes[FY_TICKET_BUSY_COUNT];
    int have_eval;
    double eval;
};

/* The plan check: one step (the session's second; the first warms up) beside what the activation
 * plan predicted at the start, with the rates the disk ran at in it beside those the plan assumed
 * (the profile's, or a past session's steps'), and the opt worker's busy time beside the plan's
 * (its whole work: AdamW, clipping's sums and the conversions of weights for the GPU, so that a
 * rate of AdamW alone is not set against a time that holds the conversions too), so that a
 * prediction that misses says which resource was misjudged. */
static void log_plan_check(const struct fy_train_opts *o, const struct step_line *s)
{
    char rd[32], wr[32];
    const double *busy = s->busy;
    double read =
        fy_steprates_rate(s->bytes[FY_TICKET_BUSY_SSD_READ], busy[FY_TICKET_BUSY_SSD_READ]);
    double write =
        fy_steprates_rate(s->bytes[FY_TICKET_BUSY_SSD_WRITE], busy[FY_TICKET_BUSY_SSD_WRITE]);
    fy_info("plan check, step %llu: %.3f s against the %.3f s predicted (%+.1f%%); in it the SSD "
            "read %s GB/s and wrote %s (the plan's: %.2f and %.2f, from %s); the opt worker was "
            "busy %.3g s (the plan's: %.3g s, with AdamW at %.2f G parameters/s, from %s)",
            (unsigned long long)s->step, s->seconds, o->plan_step_s,
            100.0 * (o->plan_step_s / s->seconds - 1.0),
            fy_steprates_gbps(read, "-", rd, sizeof rd),
            fy_steprates_gbps(write, "-", wr, sizeof wr), o->plan_ssd_read * 1e-9,
            o->plan_ssd_write * 1e-9,
            o->plan_ssd_from_steps ? "the last session's steps" : "the profile",
            busy[FY_TICKET_BUSY_OPT], o->plan_opt_s, o->plan_opt_params * 1e-9,
            o->plan_opt_from_steps ? "the last session's steps" : "the profile");
}

/* The step's line in the log (and the progress line) and in metrics.jsonl. */
static int log_step(const struct fy_train_opts *o, const struct fy_model_config *c,
                    const struct step_line *s)
{
    const double *busy = s->busy, *wait = s->wait_s;
    double tokens = (double)o->batch * o->seq;
    double tps = tokens / s->seconds;
    double tflops = tps * fy_model_flops_per_token(c, (unsigned)o->seq) / 1e12;
    double fill = (double)s->fill.tokens / tokens;
    /* the epoch as the batches count it: 1-based, and how far into it the step is */
    uint64_t epoch = o->epoch_steps ? (s->step - 1) / o->epoch_steps + 1 : 0;
    char ev[48] = "", gn[64] = "", ep[64] = "", fl[32] = "";
    if (o->epochs > 0)
        snprintf(ep, sizeof ep, " | epoch %llu/%llu", (unsigned long long)epoch,
                 (unsigned long long)o->epochs);
    else if (o->documents)
        snprintf(ep, sizeof ep, " | epoch %llu", (unsigned long long)epoch);
    if (o->documents)
        snprintf(fl, sizeof fl, " | fill %.1f%%", 100.0 * fill);
    if (s->have_eval)
        snprintf(ev, sizeof ev, " | eval %.4f", s->eval);
    if (s->grad_norm >= 0)
        snprintf(gn, sizeof gn, " | grad norm %.4f%s", s->grad_norm,
                 o->clip_grad_norm / (s->grad_norm + 1e-6) < 1.0 ? " (clipped)" : "");
    double gpu_idle = s->seconds > 0 ? 1.0 - busy[FY_TICKET_BUSY_GPU] / s->seconds : 0.0;
    char line[512];
    snprintf(line, sizeof line,
             "step %llu/%llu%s | loss %.4f%s%s | lr %.2e | %.0f tok/s%s | %.4f TFLOP/s | %.0f ms | "
             "busy: gpu %.0f (h2d %.0f, d2h %.0f), ssd read %.0f, ssd write %.0f, opt %.0f ms | "
             "gpu idle %.0f%%",
             (unsigned long long)s->step, (unsigned long long)o->steps, ep, s->loss, ev, gn, s->lr,
             tps, fl, tflops, 1e3 * s->seconds, 1e3 * busy[FY_TICKET_BUSY_GPU],
             1e3 * busy[FY_TICKET_BUSY_H2D], 1e3 * busy[FY_TICKET_BUSY_D2H],
             1e3 * busy[FY_TICKET_BUSY_SSD_READ], 1e3 * busy[FY_TICKET_BUSY_SSD_WRITE],
             1e3 * busy[FY_TICKET_BUSY_OPT], 100.0 * gpu_idle);
    struct fy_progress_step ps = {.step = s->step,
                                  .total = o->steps,
                                  .loss = s->loss,
                                  .epoch = o->epochs > 0 || o->documents ? epoch : 0,
                                  .epochs = o->epochs,
                                  .fill = fill,
                                  .seconds = s->seconds,
                                  .tokens = tokens,
                                  .flops = tokens * fy_model_flops_per_token(c, (unsigned)o->seq),
                                  .gpu_busy_s = busy[FY_TICKET_BUSY_GPU],
                                  .have_eval = s->have_eval,
                                  .eval = s->eval};
    fy_progress_step(&ps, line);
    if (o->metrics == NULL)
        return 0;
    char json[2048];
    int n = snprintf(
        json, sizeof json,
        "{\"step\": %llu, \"loss\": %.9g, \"lr\": %.9g, \"tokens_per_s\": %.1f, \"tflops\": %.6f, "
        "\"step_s\": %.6f, \"wait_io_s\": %.6f, \"wait_gpu_s\": %.6f, \"wait_opt_s\": %.6f, "
        "\"busy_gpu_s\": %.6f, \"busy_ssd_read_s\": %.6f, \"busy_ssd_write_s\": %.6f, "
        "\"busy_opt_s\": %.6f, \"busy_h2d_s\": %.6f, \"busy_d2h_s\": %.6f, "
        "\"busy_gpu_backward_s\": %.6f, \"gpu_idle\": %.4f, "
        "\"ssd_read_bytes\": %llu, \"ssd_write_bytes\": %llu",
        (unsigned long long)s->step, s->loss, s->lr, tps, tflops, s->seconds, wait[FY_TICKET_IO],
        wait[FY_TICKET_GPU], wait[FY_TICKET_OPT], busy[FY_TICKET_BUSY_GPU],
        busy[FY_TICKET_BUSY_SSD_READ], busy[FY_TICKET_BUSY_SSD_WRITE], busy[FY_TICKET_BUSY_OPT],
        busy[FY_TICKET_BUSY_H2D], busy[FY_TICKET_BUSY_D2H], busy[FY_TICKET_BUSY_GPU_BACKWARD],
        gpu_idle, (unsigned long long)s->bytes[FY_TICKET_BUSY_SSD_READ],
        (unsigned long long)s->bytes[FY_TICKET_BUSY_SSD_WRITE]);
    if (s->grad_norm >= 0)
        n += snprintf(json + n, sizeof json - (size_t)n, ", \"grad_norm\": %.9g", s->grad_norm);
    if (s->have_eval)
        n += snprintf(json + n, sizeof json - (size_t)n, ", \"eval_loss\": %.9g", s->eval);
    n += snprintf(json + n, sizeof json - (size_t)n,
                  ", \"fill\": %.6f, \"trained_tokens_per_s\": %.1f, \"epoch\": %.6f", fill,
                  fill * tps,
                  o->epoch_steps ? (double)(s->step - 1) / (double)o->epoch_steps + 1.0 : 0.0);
    snprintf(json + n, sizeof json - (size_t)n, "}");
    return fy_metrics_append(o->metrics, s->step, json);
}

/* Commits the step in meta (its updates done, every streamed unit's written back): the resident
 * state written to the working copy, then a commit record naming that copy once it is durable
 * (fy_commit_write). The committed copy becomes the working one for the steps that follow. */
static int commit(struct fy_sched *r, struct fy_storemeta *meta, uint64_t step)
{
    FY_TRY(fy_sched_resident_transfer(r, FY_OP_IO_WRITE, NULL));
    struct fy_storemeta *next = malloc(sizeof *next);
    FY_REQUIRE(next != NULL, -ENOMEM, "commit: no memory for the record");
    *next = *meta;
    next->step = step;
    next->seq = meta->seq + 1;
    next->copy = r->copies.work;
    int rc = 0;
    for (unsigned u = 0; u < fy_model_unit_count(r->l.c); u++) {
        next->digest[u] = fy_sched_unit_digest(r, u);
        if (r->copies.at[u] != r->copies.work) {
            fy_error("schedule error: unit %u's state of step %llu is not in copy %u to commit", u,
                     (unsigned long long)step, r->copies.work);
            rc = -EPROTO;
        }
    }
    if (rc < 0)
        goto out;
    FY_TRY_OUT(rc, fy_commit_write(r->tk.x, r->pool, r->l.meta, next, r->tk.timeout_ms));
    *meta = *next;
    fy_sched_copies_of_commit(r, meta);
out:
    free(next);
    return rc;
}

/* The state of the committed step in meta read and checked against the record's digests: the
 * resident units' loaded (each read with its pieces' digests, checked against the record's), every
 * other unit's read once. */
static int check_committed(struct fy_sched *r, const struct fy_storemeta *meta,
                           const unsigned char *resident)
{
    double t0 = now_s();
    unsigned bad = 0;
    FY_TRY(fy_sched_resident_transfer(r, FY_OP_IO_READ, meta->digest));
    FY_TRY(fy_commit_verify(r->tk.x, r->pool, meta, r->l.state, resident, r->copies.digest, &bad,
                            r->tk.timeout_ms));
    fy_info("step %llu's state checked against its commit record in %.1f s",
            (unsigned long long)meta->step, now_s() - t0);
    return 0;
}

/* Starts from the committed step in meta: the resident units' state loaded and every other unit's
 * read once, all checked against the record's digests (a torn or corrupted copy is found here,
 * before anything is written over the copy that the previous commit left). Where the step's state
 * is damaged, the previous commit is taken instead when it is intact; meta follows. */
static int open_committed(struct fy_sched *r, struct fy_storemeta *meta,
                          const unsigned char *resident)
{
    unsigned units = fy_model_unit_count(r->l.c);
    uint64_t damaged = 0, damaged_seq = 0;
    for (int attempt = 0;; attempt++) {
        fy_sched_copies_of_commit(r, meta);
        memset(r->copies.at, (int)meta->copy, units);
        int rc = check_committed(r, meta, resident);
        /* no intact commit left: -ENOENT, not the damage itself, which in the steps means
         * "go back to the last commit" (a restart) */
        if (fy_is_damage(rc) && meta->copies == 1) {
            fy_error("step %llu's state no longer matches its commit: this store keeps one copy "
                     "of the state (init --state-copies 1), so a run stopped between commits "
                     "(killed, crashed, a second Ctrl-C) leaves it unusable; initialise it again, "
                     "or from an export",
                     (unsigned long long)meta->step);
            return -ENOENT;
        }
        if (fy_is_damage(rc) && attempt > 0) {
            fy_error("neither commit of the store is intact: the state of step %llu (commit "
                     "record %llu) and that of step %llu (record %llu) do not match their records "
                     "(the units are named above), so nothing was trained: restore the store's "
                     "files from a copy, or start the run again (fuyou-launch init --overwrite, "
                     "--from-hf DIR for a model exported with export --to-hf)",
                     (unsigned long long)damaged, (unsigned long long)(damaged_seq % 2),
                     (unsigned long long)meta->step, (unsigned long long)(meta->seq % 2));
            return -ENOENT;
        }
        if (!fy_is_damage(rc))
            return rc;
        damaged = meta->step;
        damaged_seq = meta->seq;
        FY_TRY(fy_commit_read(r->tk.x, r->pool, r->l.meta, "the store", meta->seq, meta,
                              r->tk.timeout_ms));
        fy_warn("step %llu's state is damaged on the SSD; going back to the commit before it, "
                "step %llu",
                (unsigned long long)damaged, (unsigned long long)meta->step);
    }
}

/* The run's start from the commit in meta, said: the metrics of later steps dropped (they are
 * trained again), each unit's weights that step's. */
static int run_start(struct fy_sched *r, const struct fy_storemeta *meta,
                     const struct fy_train_opts *o)
{
    for (unsigned u = 0; u < fy_model_unit_count(r->l.c); u++)
        r->version[u] = meta->step;
    if (meta->step >= o->steps)
        fy_info("the store is already at step %llu (--steps %llu): nothing to train",
                (unsigned long long)meta->step, (unsigned long long)o->steps);
    if (o->metrics != NULL) { /* what was logged past the commit is trained again */
        int dropped = fy_metrics_rollback(o->metrics, meta->step);
        FY_TRY(dropped < 0 ? dropped : 0);
        if (dropped > 0)
            fy_info("%s: dropped %d line%s of steps after the last commit (step %llu), which are "
                    "trained again",
                    fy_metrics_path(o->metrics), dropped, dropped == 1 ? "" : "s",
                    (unsigned long long)meta->step);
    }
    fy_info("starting at step %llu", (unsigned long long)meta->step);
    return 0;
}

/* One step: trained (*trained set once its updates are sent), evaluated where due, logged, and
 * committed where due. first: the session's first step. */
static int run_step(struct fy_sched *r, struct fy_storemeta *meta, struct fy_sampler *data,
                    const struct fy_train_opts *o, uint64_t step, uint64_t first, int *trained)
{
    struct step_line s = {.step = step, .lr = fy_train_lr(o, step), .grad_norm = -1};
    double t0 = now_s();
    fy_ticket_step(&r->tk, step);
    *trained = 0;
    FY_TRY(fy_sched_load_batch(r, data, FY_TOKFILE_TRAIN, step, &s.fill));
    FY_TRY(fy_sched_forward(r, 1, step, &s.loss));
    r->clip.scale = 0.0;
    if (r->clip.one_pass)
        FY_TRY(fy_sched_clipped_backward(r, step, s.lr, o->clip_grad_norm, &s.grad_norm));
    else if (r->clip.on)
        FY_TRY(fy_sched_clip_scale(r, step, o->clip_grad_norm, &s.grad_norm));
    if (!r->clip.one_pass)
        FY_TRY(fy_sched_backward_and_update(r, step, s.lr));
    *trained = 1;
    int durable = step == o->steps || (o->checkpoint_every && step % o->checkpoint_every == 0);
    int do_eval = step == o->steps || (o->eval_every && step % o->eval_every == 0);
    /* a commit needs the updates still running or deferred done; an evaluation's first forward
     * makes the deferred ones itself, from the state it reads (as a training forward does) */
    if (durable)
        FY_TRY(fy_sched_finish_updates(r));
    s.seconds = now_s() - t0;
    memcpy(s.wait_s, r->tk.wait_s, sizeof s.wait_s);
    memcpy(s.busy, r->tk.busy_s, sizeof s.busy);
    memcpy(s.bytes, r->tk.busy_bytes, sizeof s.bytes);
    s.have_eval = do_eval && o->eval_batches > 0;
    if (s.have_eval)
        FY_TRY(fy_sched_eval_loss(r, data, o->eval_batches, &s.eval));
    /* The step's metrics line goes before its commit: a commit that a crash cuts off after its
     * record is durable still counts, and the line must be there for it (a line past the last
     * commit is dropped when the run goes back). The commit's time is its own. */
    FY_TRY(log_step(o, &meta->model, &s));
    if (o->plan_step_s > 0 && step == first + 1 && s.seconds > 0)
        log_plan_check(o, &s);
    if (o->steps_seen != NULL && step > first)
        fy_steprates_add(o->steps_seen, step, s.bytes[FY_TICKET_BUSY_SSD_READ],
                         s.busy[FY_TICKET_BUSY_SSD_READ], s.bytes[FY_TICKET_BUSY_SSD_WRITE],
                         s.busy[FY_TICKET_BUSY_SSD_WRITE], s.busy[FY_TICKET_BUSY_OPT]);
    if (durable) {
        double c0 = now_s();
        FY_TRY(commit(r, meta, step));
        if (now_s() - c0 > 1.0)
            fy_info("step %llu committed in %.1f s", (unsigned long long)step, now_s() - c0);
    }
    return 0;
}

int fy_train_run(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                 struct fy_sampler *data, const struct fy_train_opts *o)
{
    struct fy_sched r;
    const struct fy_plan_shape shape = {.c = &meta->model,
                                        .B = o->batch,
                                        .T = o->seq,
                                        .act_dtype = o->act_dtype,
                                        .weight_dtype = o->weight_dtype,
                                        .clip = o->clip_grad_norm > 0,
                                        .ranks = o->ranks};
    FY_TRY(fy_sched_init(&r, pool, &shape, x, o->timeout_ms));
    uint64_t done = 0;    /* the last step trained; meta->step is the last committed */
    int metrics_full = 0; /* too many metrics lines wait for room: stopped at a commit */
    int rc;
    FY_TRY_OUT(rc, fy_sched_setup(&r, o));
    FY_TRY_OUT(rc, open_committed(&r, meta, o->resident));
    FY_TRY_OUT(rc, fy_sched_fill_copies(&r));
    FY_TRY_OUT(rc, run_start(&r, meta, o));
    done = meta->step;
    const uint64_t first = meta->step + 1; /* this session's first step */
    for (uint64_t step = first; step <= o->steps; step++) {
        if (o->stop != NULL && *o->stop) {
            fy_warn("stopping at the step boundary before step %llu", (unsigned long long)step);
            break;
        }
        if (o->metrics != NULL && fy_metrics_over_cap(o->metrics)) { /* as a full store */
            metrics_full = 1;
            break;
        }
        int trained;
        FY_TRY_OUT(rc, run_step(&r, meta, data, o, step, first, &trained));
        done = trained ? step : done;
    }
out:;
    /* a stop at a step boundary leaves updates running or deferred */
    int drained = rc == 0 ? fy_sched_finish_updates(&r) : fy_optq_drain(&r.opt);
    rc = rc ? rc : drained;
    if (rc == 0 && done > meta->step) { /* stopped early: the last step committed, as at the end */
        rc = commit(&r, meta, done);
        if (rc == 0)
            fy_info("step %llu committed to the store", (unsigned long long)meta->step);
    }
    if (rc == 0 && metrics_full)
        rc = fy_metrics_stopped(o->metrics, meta->step);
    drained = fy_spill_drain(&r.block_inputs);
    rc = rc ? rc : drained;
    drained = fy_spill_drain(&r.swap.ring);
    rc = rc ? rc : drained;
    fy_ticket_trace_end(&r.tk);
    fy_sched_release(&r);
    return rc;
}

struct export_ctx {
    struct fy_sched *r;
    const struct fy_storemeta *meta;
};

static int export_unit(void *ctx, unsigned unit, float *params)
{
    const struct export_ctx *e = ctx;
    struct fy_sched *r = e->r;
    return fy_commit_read_master(r->tk.x, r->pool, e->meta, unit, r->l.state, params,
                                 r->tk.timeout_ms);
}

int fy_train_export_store(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                          const char *path, int overwrite, int beside, int timeout_ms)
{
    struct fy_sched r;
    const struct fy_plan_shape one = {.c = &meta->model, .B = 1, .T = 1, .act_dtype = FY_DTYPE_F32};
    FY_TRY(fy_sched_init(&r, pool, &one, x, timeout_ms));
    struct fy_commit_export passed = {0};
    /* a run training meanwhile can commit over what is read; damaged state: the commit before */
    int rc = 0;
    for (int moved = 0;; moved++) {
        struct export_ctx ctx = {&r, meta};
        rc = fy_weights_write(path, &meta->model, meta->step, overwrite, export_unit, &ctx);
        if (!fy_is_damage(rc) || moved == FY_TRAIN_EXPORT_RETRIES)
            break;
        rc = fy_commit_export_next(x, pool, r.l.meta, path, beside, &passed, meta, timeout_ms);
        if (rc < 0)
            break;
    }
    fy_sched_release(&r);
    return rc;
}

int fy_train_export(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                    const char *path, int overwrite, int timeout_ms)
{
    return fy_train_export_store(x, pool, meta, path, overwrite, 0, timeout_ms);
}
