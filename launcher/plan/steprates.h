/* The rates a session's training steps ran at, kept in the run directory (RUN/step_rates.json) for
 * the next session's plan: the SSD store's (the bytes the io worker moved over its busy seconds,
 * each way) and AdamW's (the opt worker's busy seconds against the plan's for them). A 256 MiB
 * sample at the start of a run measures a burst; a virtual or shared disk runs a training step's
 * long mixed traffic at other rates, and drifts. The profile times AdamW alone; beside the copies
 * to and from the GPU and the disk's DMA it shares host memory and runs slower. The steps' own
 * rates predict the next steps better than either sample can. */
#ifndef FY_STEPRATES_H
#define FY_STEPRATES_H

#include <stddef.h>
#include <stdint.h>

#define FY_STEPRATES_VERSION 1

/* Which of a record's rates a plan took (launcher/cli/actsetup.h) */
#define FY_STEPRATES_SSD 1
#define FY_STEPRATES_OPT 2

struct fy_steprates {
    uint64_t read_bytes, write_bytes; /* over the steps counted */
    double read_s, write_s;           /* the io worker's busy seconds for them, each way */
    uint64_t steps, first_step, last_step;
    /* AdamW: the plan's rate and its opt worker's seconds a step (AdamW, clipping's sums and the
     * conversions of weights for the GPU, all at that rate: launcher/plan/actplace.h), and the
     * worker's busy seconds over the steps counted; 0 where the session had no such plan */
    double opt_plan_params, opt_plan_step_s, opt_busy_s;
    char optim_state[16]; /* the state's format (fy_optim_state_name) the AdamW rate holds for */
    int batch;            /* of the session that measured them */
    char act_plan[16];    /* its --act-plan */
    char ssd[1024];       /* the store's paths (--ssd): rates hold for that disk only */
    int64_t written;      /* Unix time of the record */
};

/* Starts an empty record for a session over the store at `ssd` (truncated to fit). */
void fy_steprates_begin(struct fy_steprates *d, const char *ssd, int batch, const char *act_plan);
/* The plan's AdamW for the session: its rate (parameters/s) with the state's format `optim_state`
 * (a name), and the opt worker's seconds a step it predicts at that rate. */
void fy_steprates_plan_opt(struct fy_steprates *d, const char *optim_state, double params_per_s,
                           double step_s);
/* Counts one step's bytes and busy seconds, each way, and the opt worker's busy seconds. */
void fy_steprates_add(struct fy_steprates *d, uint64_t step, uint64_t read_bytes, double read_s,
                      uint64_t write_bytes, double write_s, double opt_busy_s);
/* Bytes/s each way; 0 where the steps moved nothing that way. */
double fy_steprates_read_Bps(const struct fy_steprates *d);
double fy_steprates_write_Bps(const struct fy_steprates *d);
/* AdamW's rate in the steps (parameters/s): the plan's scaled by its seconds over the busy ones
 * (the plan's opt time is inversely proportional to the rate); 0 where there was no plan or no
 * busy time. */
double fy_steprates_opt_params(const struct fy_steprates *d);
/* The rates FY_STEPRATES_* `took` names, for people: "the SSD's", "AdamW's", "the SSD's and
 * AdamW's" ("" for none). */
const char *fy_steprates_taken(int took);
/* bytes over seconds; 0 where either is none */
double fy_steprates_rate(uint64_t bytes, double seconds);
/* A rate for people: "R.RR" (GB/s) in buf, or `none` where Bps is not above 0. */
const char *fy_steprates_gbps(double Bps, const char *none, char *buf, size_t len);

/* Replaces the record at `path` (temporary file, fsync, rename); -errno, said. */
int fy_steprates_save(const char *path, const struct fy_steprates *d);
/* Reads a record: 0; -ENOENT where there is none (nothing said); -EINVAL where it is not one this
 * version reads or its figures are not rates, with the reason in `why` (nothing logged: a bad
 * record is a reason to measure again, which the caller says). */
int fy_steprates_load(const char *path, struct fy_steprates *d, char *why, size_t why_len);

#endif
