/* The SSD store's and AdamW's rates in training steps, counted per session and kept in the run
 * directory as a small JSON record for the next session's plan (launcher/plan/steprates.h). */
#include "launcher/plan/steprates.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"

void fy_steprates_begin(struct fy_steprates *d, const char *ssd, int batch, const char *act_plan)
{
    *d = (struct fy_steprates){.batch = batch};
    snprintf(d->ssd, sizeof d->ssd, "%s", ssd ? ssd : "");
    snprintf(d->act_plan, sizeof d->act_plan, "%s", act_plan ? act_plan : "");
}

void fy_steprates_plan_opt(struct fy_steprates *d, const char *optim_state, double params_per_s,
                           double step_s)
{
    snprintf(d->optim_state, sizeof d->optim_state, "%s", optim_state ? optim_state : "");
    d->opt_plan_params = params_per_s > 0 ? params_per_s : 0;
    d->opt_plan_step_s = step_s > 0 ? step_s : 0;
}

void fy_steprates_add(struct fy_steprates *d, uint64_t step, uint64_t read_bytes, double read_s,
                      uint64_t write_bytes, double write_s, double opt_busy_s)
{
    if (d->steps == 0)
        d->first_step = step;
    d->last_step = step;
    d->steps++;
    d->read_bytes += read_bytes;
    d->write_bytes += write_bytes;
    d->read_s += read_s;
    d->write_s += write_s;
    d->opt_busy_s += opt_busy_s > 0 ? opt_busy_s : 0;
}

const char *fy_steprates_taken(int took)
{
    static const char *const names[] = {"", "the SSD's", "AdamW's", "the SSD's and AdamW's"};
    return names[took & (FY_STEPRATES_SSD | FY_STEPRATES_OPT)];
}

double fy_steprates_rate(uint64_t bytes, double seconds)
{
    return bytes > 0 && seconds > 0 ? (double)bytes / seconds : 0.0;
}

double fy_steprates_read_Bps(const struct fy_steprates *d)
{
    return fy_steprates_rate(d->read_bytes, d->read_s);
}

double fy_steprates_write_Bps(const struct fy_steprates *d)
{
    return fy_steprates_rate(d->write_bytes, d->write_s);
}

double fy_steprates_opt_params(const struct fy_steprates *d)
{
    double planned = d->opt_plan_step_s * (double)d->steps;
    return d->opt_plan_params > 0 && planned > 0 && d->opt_busy_s > 0
               ? d->opt_plan_params * planned / d->opt_busy_s
               : 0.0;
}

const char *fy_steprates_gbps(double Bps, const char *none, char *buf, size_t len)
{
    if (!(Bps > 0))
        return none;
    snprintf(buf, len, "%.2f", Bps * 1e-9);
    return buf;
}

int fy_steprates_save(const char *path, const struct fy_steprates *d)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    /* the byte counts as numbers: a double holds them exactly below 2^53 (8 PiB) */
    const struct {
        const char *key;
        double value;
    } fields[] = {{"version", FY_STEPRATES_VERSION},
                  {"read_Bps", fy_steprates_read_Bps(d)},
                  {"write_Bps", fy_steprates_write_Bps(d)},
                  {"read_bytes", (double)d->read_bytes},
                  {"read_seconds", d->read_s},
                  {"write_bytes", (double)d->write_bytes},
                  {"write_seconds", d->write_s},
                  {"steps", (double)d->steps},
                  {"first_step", (double)d->first_step},
                  {"last_step", (double)d->last_step},
                  {"opt_params_per_s", fy_steprates_opt_params(d)},
                  {"opt_plan_params_per_s", d->opt_plan_params},
                  {"opt_plan_seconds_per_step", d->opt_plan_step_s},
                  {"opt_busy_seconds", d->opt_busy_s},
                  {"batch", d->batch},
                  {"written_unix", (double)(d->written ? d->written : (int64_t)time(NULL))}};
    for (size_t i = 0; ok && i < sizeof fields / sizeof fields[0]; i++)
        ok = cJSON_AddNumberToObject(root, fields[i].key, fields[i].value) != NULL;
    ok = ok && cJSON_AddStringToObject(root, "act_plan", d->act_plan) != NULL &&
         cJSON_AddStringToObject(root, "ssd", d->ssd) != NULL &&
         cJSON_AddStringToObject(root, "optim_state", d->optim_state) != NULL;
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    FY_REQUIRE(text != NULL, -ENOMEM, "out of memory writing the step rates record %s", path);
    int rc = fy_file_write_text(path, text);
    free(text);
    return rc;
}

/* A non-negative number field; 0 or -EINVAL with the reason. */
static int number_field(const cJSON *root, const char *key, double *out, char *why, size_t len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0)) {
        snprintf(why, len, "\"%s\" is not a number >= 0", key);
        return -EINVAL;
    }
    *out = v->valuedouble;
    return 0;
}

int fy_steprates_load(const char *path, struct fy_steprates *d, char *why, size_t why_len)
{
    char buf[4096];
    int read_failed = 0;
    ssize_t got = fy_file_read_text(path, buf, sizeof buf, &read_failed);
    if (got < 0) {
        snprintf(why, why_len, "cannot open it: %s", strerror((int)-got));
        return (int)got;
    }
    if (read_failed) {
        snprintf(why, why_len, "unreadable, or larger than a record");
        return -EINVAL;
    }
    cJSON *root = cJSON_Parse(buf);
    if (root == NULL || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        snprintf(why, why_len, "not a JSON object");
        return -EINVAL;
    }
    double version = 0, rd = 0, wr = 0, rs = 0, ws = 0, steps = 0, first = 0, last = 0, batch = 0,
           when = 0, opt_rate = 0, opt_busy = 0, opt_step = 0;
    int rc = number_field(root, "version", &version, why, why_len);
    if (rc == 0 && version != FY_STEPRATES_VERSION) {
        snprintf(why, why_len, "version %g, this build reads version %d", version,
                 FY_STEPRATES_VERSION);
        rc = -EINVAL;
    }
    const char *keys[] = {"read_bytes",
                          "read_seconds",
                          "write_bytes",
                          "write_seconds",
                          "steps",
                          "first_step",
                          "last_step",
                          "batch",
                          "written_unix",
                          "opt_plan_params_per_s",
                          "opt_plan_seconds_per_step",
                          "opt_busy_seconds"};
    double *fields[] = {&rd,   &rs,    &wr,   &ws,       &steps,    &first,
                        &last, &batch, &when, &opt_rate, &opt_step, &opt_busy};
    for (size_t i = 0; rc == 0 && i < sizeof keys / sizeof keys[0]; i++)
        rc = number_field(root, keys[i], fields[i], why, why_len);
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(root, "act_plan");
    const cJSON *ssd = cJSON_GetObjectItemCaseSensitive(root, "ssd");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(root, "optim_state");
    if (rc == 0 && (!cJSON_IsString(plan) || !cJSON_IsString(ssd) || !cJSON_IsString(state))) {
        snprintf(why, why_len, "\"act_plan\", \"ssd\" or \"optim_state\" is not a string");
        rc = -EINVAL;
    }
    if (rc == 0 && (steps < 1 || (rd > 0) != (rs > 0) || (wr > 0) != (ws > 0))) {
        snprintf(why, why_len,
                 "it counts no step, or bytes without seconds (or seconds without "
                 "bytes)");
        rc = -EINVAL;
    }
    if (rc == 0) {
        fy_steprates_begin(d, ssd->valuestring, (int)batch, plan->valuestring);
        d->read_bytes = (uint64_t)rd;
        d->write_bytes = (uint64_t)wr;
        d->read_s = rs;
        d->write_s = ws;
        d->steps = (uint64_t)steps;
        d->first_step = (uint64_t)first;
        d->last_step = (uint64_t)last;
        d->written = (int64_t)when;
        fy_steprates_plan_opt(d, state->valuestring, opt_rate, opt_step);
        d->opt_busy_s = opt_busy;
    }
    cJSON_Delete(root);
    return rc;
}
