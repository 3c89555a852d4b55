/* The machine's rates: launcher/plan/plan_rates.h. */
#include "launcher/plan/plan_rates.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/base/log.h"
#include "common/model/optstate.h"

/* The reference machine: one H200 with a 16-core Xeon and one virtual disk, measured as
 * docs/benchmarks.md ("The machine") lists. */
const struct fy_plan_rates fy_plan_reference_rates = {
    .gpu_flops = 390e12, /* model FLOP/s of a step with the blocks recomputed (make bench-gpu) */
    .h2d = 54e9,         /* PCIe, pinned memory to the GPU, one way at a time */
    .d2h = 55e9,         /* ... and back */
    /* the disk as training steps use it, reads and writes at once: bench-pipeline's steps read at
     * 1.61-1.82 GB/s and wrote at 2.27-2.98 (a lone 256 MiB burst reads 2.3) */
    .ssd_read = 1.75e9,
    .ssd_write = 2.4e9,
    .opt_params = 3.1e9, /* AdamW beside the copies (make bench-pipeline) */
    /* fp32's, then bf16's and int8's by the ratios of AdamW's busy times in bench-pipeline's 1.3B
     * runs streamed from the SSD at B16 with each format (0.375, 0.269 and 0.408 s a step, the
     * means of two runs): bf16 moves fewer bytes, int8's codes cost compute */
    .opt_by_format = {3.1e9, 4.3e9, 2.85e9},
    /* not measured (the machine has one GPU): references for a host of H100/H200-class GPUs.
     * NVLink 4 carries 450 GB/s a direction; NCCL's ring reduce reaches about two thirds of that
     * in bus bandwidth */
    .nvlink = 300e9,
    /* the most DMA traffic this machine's host memory was seen to serve: PCIe both ways at once */
    .host_mem = 90e9,
};

/* The machine profile at path as a JSON object (*root, the caller's to free). */
static int profile_json(const char *path, cJSON **root)
{
    char buf[8192];
    ssize_t got = fy_file_read_text(path, buf, sizeof buf, NULL);
    if (got < 0) {
        fy_error("cannot open the machine profile %s: %s", path, strerror((int)-got));
        return (int)got;
    }
    *root = cJSON_Parse(buf);
    if (*root != NULL && !cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
    }
    FY_REQUIRE(*root != NULL, -EINVAL,
               "%s: not a JSON object (a machine profile has gpu_flops, h2d, d2h, ssd_read, "
               "ssd_write and opt_params)",
               path);
    return 0;
}

int fy_plan_rates_load(const char *path, struct fy_plan_rates *out)
{
    cJSON *root;
    FY_TRY(profile_json(path, &root));
    static const char *const keys[] = {"gpu_flops", "h2d",       "d2h",
                                       "ssd_read",  "ssd_write", "opt_params"};
    double *fields[] = {&out->gpu_flops, &out->h2d,       &out->d2h,
                        &out->ssd_read,  &out->ssd_write, &out->opt_params};
    int rc = 0;
    for (int i = 0; i < 6 && rc == 0; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
            fy_error("%s: \"%s\" must be a positive number (its rate: FLOP/s, bytes/s or "
                     "parameters/s)",
                     path, keys[i]);
            rc = -EINVAL;
        } else {
            *fields[i] = v->valuedouble;
        }
    }
    out->opt_by_format[FY_OPTIM_STATE_FP32] = out->opt_params;
    static const char *const by_format[] = {"opt_params_bf16", "opt_params_int8"};
    for (int i = 0; i < 2 && rc == 0; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, by_format[i]);
        out->opt_by_format[1 + i] = 0;
        if (v == NULL)
            continue;
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
            fy_error("%s: \"%s\" must be a positive number (AdamW parameters/s)", path,
                     by_format[i]);
            rc = -EINVAL;
        } else {
            out->opt_by_format[1 + i] = v->valuedouble;
        }
    }
    /* several GPUs' rates, the reference machine's where the profile has none */
    static const char *const links[] = {"nvlink", "host_mem"};
    double *link_fields[] = {&out->nvlink, &out->host_mem};
    const double link_reference[] = {fy_plan_reference_rates.nvlink,
                                     fy_plan_reference_rates.host_mem};
    for (int i = 0; i < 2 && rc == 0; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, links[i]);
        *link_fields[i] = link_reference[i];
        if (v == NULL)
            continue;
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
            fy_error("%s: \"%s\" must be a positive number (bytes/s)", path, links[i]);
            rc = -EINVAL;
        } else {
            *link_fields[i] = v->valuedouble;
        }
    }
    cJSON_Delete(root);
    return rc;
}

int fy_plan_machine_gpu_load(const char *path, struct fy_plan_machine_gpu *out)
{
    memset(out, 0, sizeof *out);
    cJSON *root;
    FY_TRY(profile_json(path, &root));
    const cJSON *free_v = cJSON_GetObjectItemCaseSensitive(root, "gpu_free");
    const cJSON *total_v = cJSON_GetObjectItemCaseSensitive(root, "gpu_total");
    int rc = 0;
    if (free_v != NULL) {
        if (!cJSON_IsNumber(free_v) || !(free_v->valuedouble > 0) || !cJSON_IsNumber(total_v) ||
            !(total_v->valuedouble >= free_v->valuedouble) || total_v->valuedouble > 0x1p60) {
            fy_error("%s: \"gpu_free\" and \"gpu_total\" must be positive numbers of bytes, "
                     "gpu_free at most gpu_total (the GPU's free and total memory as probe found "
                     "them)",
                     path);
            rc = -EINVAL;
        } else {
            out->free_bytes = (uint64_t)free_v->valuedouble;
            out->total_bytes = (uint64_t)total_v->valuedouble;
        }
    }
    static const char *const keys[] = {"host", "probed_at"};
    char *fields[] = {out->host, out->probed_at};
    const size_t sizes[] = {sizeof out->host, sizeof out->probed_at};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (cJSON_IsString(v) && v->valuestring != NULL)
            snprintf(fields[i], sizes[i], "%s", v->valuestring);
    }
    cJSON_Delete(root);
    return rc;
}

int fy_plan_rates_select(struct fy_plan_rates *r, int format, const char *from)
{
    FY_REQUIRE(format >= 0 && format < FY_OPTIM_STATE_COUNT && r->opt_by_format[format] > 0,
               -EINVAL,
               "%s has no AdamW rate for %s optimizer state: measure it with "
               "fuyou-launch probe (its profile's opt_params_%s), or plan with --machine FILE",
               from, fy_optim_state_name(format), fy_optim_state_name(format));
    r->opt_params = r->opt_by_format[format];
    return 0;
}

double fy_plan_rates_opt_worker(const struct fy_plan_rates *r)
{
    return r->opt_in_steps > 0 ? r->opt_in_steps : r->opt_params;
}
