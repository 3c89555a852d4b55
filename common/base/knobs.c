/* The environment variables the programs read, each parsed as its one reader needs it. See
 * knobs.h. */
#include "common/base/knobs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/base/check.h"
#include "common/base/log.h"

enum {
    LOG,
    TOKENIZE_SCRIPT,
    CUDA_VISIBLE,
    TMPDIR,
    CUDA_ATTENTION,
    CUDA_FUSE,
    GPU_QUEUE,
    TEST_PROFILE_FAIL,
    TEST_KEEP_LAYERS,
    TEST_IO_ENOSPC_AFTER,
    TEST_ACT_MIX,
    TEST_EXPORT_PAUSE_MS,
    TEST_START_PAUSE_MS,
    TEST_METRICS_PENDING_MAX,
    TEST_EMBED_WHOLE,
    TEST_OPT_DELAY_MS,
    TEST_GRAD_PIECE_FLOATS,
    TEST_LAND_CHUNK,
    TEST_STATE_PIECES,
    TEST_HOST_ROOT,
    TEST_GPU_FREE,
    KNOB_COUNT
};

static const struct fy_knob knobs[KNOB_COUNT] = {
    [LOG] = {"FUYOU_LOG", FY_KNOB_USER},
    [TOKENIZE_SCRIPT] = {"FUYOU_TOKENIZE_SCRIPT", FY_KNOB_USER},
    [CUDA_VISIBLE] = {"CUDA_VISIBLE_DEVICES", FY_KNOB_USER},
    [TMPDIR] = {"TMPDIR", FY_KNOB_USER},
    [CUDA_ATTENTION] = {"FUYOU_CUDA_ATTENTION", FY_KNOB_USER},
    [CUDA_FUSE] = {"FUYOU_CUDA_FUSE", FY_KNOB_COMPARISON},
    [GPU_QUEUE] = {"FUYOU_GPU_QUEUE", FY_KNOB_COMPARISON},
    [TEST_PROFILE_FAIL] = {"FUYOU_TEST_PROFILE_FAIL", FY_KNOB_TEST},
    [TEST_KEEP_LAYERS] = {"FUYOU_TEST_KEEP_LAYERS", FY_KNOB_TEST},
    [TEST_IO_ENOSPC_AFTER] = {"FUYOU_TEST_IO_ENOSPC_AFTER", FY_KNOB_TEST},
    [TEST_ACT_MIX] = {"FUYOU_TEST_ACT_MIX", FY_KNOB_TEST},
    [TEST_EXPORT_PAUSE_MS] = {"FUYOU_TEST_EXPORT_PAUSE_MS", FY_KNOB_TEST},
    [TEST_START_PAUSE_MS] = {"FUYOU_TEST_START_PAUSE_MS", FY_KNOB_TEST},
    [TEST_METRICS_PENDING_MAX] = {"FUYOU_TEST_METRICS_PENDING_MAX", FY_KNOB_TEST},
    [TEST_EMBED_WHOLE] = {"FUYOU_TEST_EMBED_WHOLE", FY_KNOB_TEST},
    [TEST_OPT_DELAY_MS] = {"FUYOU_TEST_OPT_DELAY_MS", FY_KNOB_TEST},
    [TEST_GRAD_PIECE_FLOATS] = {"FUYOU_TEST_GRAD_PIECE_FLOATS", FY_KNOB_TEST},
    [TEST_LAND_CHUNK] = {"FUYOU_TEST_LAND_CHUNK", FY_KNOB_TEST},
    [TEST_STATE_PIECES] = {"FUYOU_TEST_STATE_PIECES", FY_KNOB_TEST},
    [TEST_HOST_ROOT] = {"FUYOU_TEST_HOST_ROOT", FY_KNOB_TEST},
    [TEST_GPU_FREE] = {"FUYOU_TEST_GPU_FREE", FY_KNOB_TEST},
};

const struct fy_knob *fy_knobs(unsigned *count)
{
    *count = KNOB_COUNT;
    return knobs;
}

/* The variable's value, or NULL: the one getenv of the programs. */
static const char *value(int knob) { return getenv(knobs[knob].name); }

/* Whether the variable is set to exactly `want`. */
static int is(int knob, const char *want)
{
    const char *v = value(knob);
    return v != NULL && strcmp(v, want) == 0;
}

int fy_knob_log_level(void)
{
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    const char *v = value(LOG);
    for (int i = 0; v != NULL && i < (int)(sizeof levels / sizeof levels[0]); i++)
        if (strcasecmp(v, levels[i]) == 0)
            return i;
    return -1;
}

int fy_knob_log_level_or(int level)
{
    int asked = fy_knob_log_level();
    return asked >= 0 ? asked : level;
}

const char *fy_knob_tokenize_script(void)
{
    const char *v = value(TOKENIZE_SCRIPT);
    return v != NULL && *v ? v : NULL;
}

const char *fy_knob_cuda_visible_devices(void)
{
    const char *v = value(CUDA_VISIBLE);
    return v != NULL && *v ? v : NULL;
}

const char *fy_knob_tmpdir(void)
{
    const char *v = value(TMPDIR);
    return v != NULL && *v ? v : "/tmp";
}

int fy_knob_cuda_materialised_attention(void) { return is(CUDA_ATTENTION, "materialised"); }

int fy_knob_cuda_unfused(void) { return is(CUDA_FUSE, "0"); }

int fy_knob_gpu_one_at_a_time(void) { return is(GPU_QUEUE, "1"); }

int fy_knob_test_profile_fail(void) { return is(TEST_PROFILE_FAIL, "1"); }

int fy_knob_test_keep_layers(int *most)
{
    const char *v = value(TEST_KEEP_LAYERS);
    if (v == NULL)
        return 0;
    *most = atoi(v);
    return 1;
}

long long fy_knob_test_io_enospc_after(void)
{
    const char *v = value(TEST_IO_ENOSPC_AFTER);
    return v != NULL ? atoll(v) : -1;
}

const char *fy_knob_test_act_mix(uint64_t *seed)
{
    const char *v = value(TEST_ACT_MIX);
    *seed = v != NULL ? strtoull(v, NULL, 10) : 0;
    return v;
}

int fy_knob_test_export_pause_ms(void)
{
    const char *v = value(TEST_EXPORT_PAUSE_MS);
    return v != NULL ? atoi(v) : 0;
}

int fy_knob_test_start_pause_ms(void)
{
    const char *v = value(TEST_START_PAUSE_MS);
    return v != NULL ? atoi(v) : 0;
}

int fy_knob_test_metrics_pending_max(size_t *bytes)
{
    const char *v = value(TEST_METRICS_PENDING_MAX);
    if (v == NULL)
        return 0;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    FY_REQUIRE(*v >= '0' && *v <= '9' && *end == 0 && n > 0, -EINVAL,
               "FUYOU_TEST_METRICS_PENDING_MAX=%s: give a number of bytes (a test hook)", v);
    *bytes = (size_t)n;
    return 1;
}

int fy_knob_test_embed_whole(void) { return is(TEST_EMBED_WHOLE, "1"); }

int fy_knob_test_state_pieces(void) { return is(TEST_STATE_PIECES, "1"); }

const char *fy_knob_test_host_root(void)
{
    const char *v = value(TEST_HOST_ROOT);
    return v != NULL && *v != 0 ? v : NULL;
}

const char *fy_knob_test_gpu_free(void)
{
    const char *v = value(TEST_GPU_FREE);
    return v != NULL && *v != 0 ? v : NULL;
}

int fy_knob_test_opt_delay_ms(long *ms)
{
    const char *v = value(TEST_OPT_DELAY_MS);
    *ms = 0;
    if (v == NULL || *v == 0)
        return 0;
    char *end;
    long n = strtol(v, &end, 10);
    FY_REQUIRE(*end == 0 && n >= 0 && n <= 10000, -EINVAL,
               "FUYOU_TEST_OPT_DELAY_MS=%s: give 0 to 10000 milliseconds (a test hook)", v);
    *ms = n;
    return 1;
}

size_t fy_knob_test_grad_piece_floats(void)
{
    const char *v = value(TEST_GRAD_PIECE_FLOATS);
    if (v == NULL || *v == 0)
        return 0;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end != 0 || n < 64) {
        fy_warn("FUYOU_TEST_GRAD_PIECE_FLOATS=%s: not a number of at least 64 floats; ignored", v);
        return 0;
    }
    return (size_t)n;
}

uint64_t fy_knob_test_land_chunk(void)
{
    const char *v = value(TEST_LAND_CHUNK);
    if (v == NULL || *v == 0)
        return 0;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end != 0 || n == 0 || v[0] == '-')
        return 0;
    return (n + 4095) / 4096 * 4096;
}
