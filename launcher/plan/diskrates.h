/* The rates the SSD store ran at in a session's training steps (the bytes the io worker moved over
 * its busy seconds, each way), kept in the run directory (RUN/ssd_rates.json) for the next
 * session's plan. A 256 MiB sample at the start of a run measures a burst; a virtual or shared disk
 * runs a training step's long mixed traffic at other rates, and drifts: the steps' own rates
 * predict the next steps better than a short sample can. */
#ifndef FY_DISKRATES_H
#define FY_DISKRATES_H

#include <stddef.h>
#include <stdint.h>

#define FY_DISKRATES_VERSION 1

struct fy_diskrates {
    uint64_t read_bytes, write_bytes; /* over the steps counted */
    double read_s, write_s;           /* the io worker's busy seconds for them, each way */
    uint64_t steps, first_step, last_step;
    int batch;         /* of the session that measured them */
    char act_plan[16]; /* its --act-plan */
    char ssd[1024];    /* the store's paths (--ssd): rates hold for that disk only */
    int64_t written;   /* Unix time of the record */
};

/* Starts an empty record for a session over the store at `ssd` (truncated to fit). */
void fy_diskrates_begin(struct fy_diskrates *d, const char *ssd, int batch, const char *act_plan);
/* Counts one step's bytes and busy seconds, each way. */
void fy_diskrates_add(struct fy_diskrates *d, uint64_t step, uint64_t read_bytes, double read_s,
                      uint64_t write_bytes, double write_s);
/* Bytes/s each way; 0 where the steps moved nothing that way. */
double fy_diskrates_read_Bps(const struct fy_diskrates *d);
double fy_diskrates_write_Bps(const struct fy_diskrates *d);
/* bytes over seconds; 0 where either is none */
double fy_diskrates_rate(uint64_t bytes, double seconds);
/* A rate for people: "R.RR" (GB/s) in buf, or `none` where Bps is not above 0. */
const char *fy_diskrates_gbps(double Bps, const char *none, char *buf, size_t len);

/* Replaces the record at `path` (temporary file, fsync, rename); -errno, said. */
int fy_diskrates_save(const char *path, const struct fy_diskrates *d);
/* Reads a record: 0; -ENOENT where there is none (nothing said); -EINVAL where it is not one this
 * version reads or its figures are not rates, with the reason in `why` (nothing logged: a bad
 * record is a reason to measure again, which the caller says). */
int fy_diskrates_load(const char *path, struct fy_diskrates *d, char *why, size_t why_len);

#endif
