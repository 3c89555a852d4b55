/* Every environment variable the programs read, in one place (docs/configuration.md,
 * "Environment variables"): one function per variable, which reads it when called (tests set and
 * unset them between calls) and parses it. Three kinds:
 *   - for users: FUYOU_LOG, FUYOU_TOKENIZE_SCRIPT, CUDA_VISIBLE_DEVICES, TMPDIR,
 *     FUYOU_CUDA_ATTENTION;
 *   - switches for comparisons (benchmarks, tests): FUYOU_CUDA_FUSE, FUYOU_GPU_QUEUE;
 *   - test hooks, FUYOU_TEST_*: they make a run fail, slow down or take a path a test needs and
 *     nothing else would give; the code that acts on one says so in the log.
 * Nothing outside common/knobs.c calls getenv (tests/test_knobs checks it). */
#ifndef FY_KNOBS_H
#define FY_KNOBS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum fy_knob_kind { FY_KNOB_USER, FY_KNOB_COMPARISON, FY_KNOB_TEST };

struct fy_knob {
    const char *name;
    enum fy_knob_kind kind;
};
/* The variables, for the documentation's test; *count gets how many. */
const struct fy_knob *fy_knobs(unsigned *count);

/* FUYOU_LOG: the log level named (error, warn, info, debug; any case), as enum fy_log_level
 * (common/log.h); -1 when unset or not a level (the program's own level stays). */
int fy_knob_log_level(void);
/* FUYOU_LOG's level where it names one, else `level`: what a program gives fy_log_init. */
int fy_knob_log_level_or(int level);
/* FUYOU_TOKENIZE_SCRIPT: the tokenizer helper's path; NULL when unset or empty. */
const char *fy_knob_tokenize_script(void);
/* CUDA_VISIBLE_DEVICES (CUDA's own): the GPUs the gpu workers may take, in rank order; NULL when
 * unset or empty (all of them). */
const char *fy_knob_cuda_visible_devices(void);
/* TMPDIR: where an export of a read-only run directory keeps its own files; /tmp when unset or
 * empty. */
const char *fy_knob_tmpdir(void);
/* FUYOU_CUDA_ATTENTION=materialised: the CUDA backend's materialised attention instead of the
 * flash attention. */
int fy_knob_cuda_materialised_attention(void);
/* FUYOU_CUDA_FUSE=0: the CUDA backend's GELU and residual adds as separate kernels. */
int fy_knob_cuda_unfused(void);
/* FUYOU_GPU_QUEUE=1: the gpu worker completes each GPT request before it takes the next. */
int fy_knob_gpu_one_at_a_time(void);

/* ---- test hooks ---- */

/* FUYOU_TEST_PROFILE_FAIL=1: the CPU backend's profiling fails, as a device error would. */
int fy_knob_test_profile_fail(void);
/* FUYOU_TEST_KEEP_LAYERS=N: the gpu worker keeps the internals of at most N blocks (atoi: a value
 * that is not a number keeps none). 1 with *most set, 0 when unset. */
int fy_knob_test_keep_layers(int *most);
/* FUYOU_TEST_IO_ENOSPC_AFTER=N: the io worker fails every write after the first N with ENOSPC,
 * as a full disk would (atoll); -1 when unset. */
long long fy_knob_test_io_enospc_after(void);
/* FUYOU_TEST_ACT_MIX=SEED: --act-plan host or ssd places each block's swappable kinds at a seeded
 * mix of host, ssd and recompute. The value as given (*seed its number, strtoull), or NULL. */
const char *fy_knob_test_act_mix(uint64_t *seed);
/* FUYOU_TEST_EXPORT_PAUSE_MS=MS: an export waits that long once its io worker is up (atoi;
 * 0 when unset). */
int fy_knob_test_export_pause_ms(void);
/* FUYOU_TEST_START_PAUSE_MS=MS: a launch waits that long once its workers are started, before it
 * waits for them to be ready (atoi; 0 when unset); a signal ends the wait. */
int fy_knob_test_start_pause_ms(void);
/* FUYOU_TEST_METRICS_PENDING_MAX=BYTES: the cap on metrics lines waiting for room in the run
 * directory. 1 with *bytes set, 0 when unset, -EINVAL (said) when not a positive number. */
int fy_knob_test_metrics_pending_max(size_t *bytes);
/* FUYOU_TEST_EMBED_WHOLE=1: the embeddings are updated in one piece after the backward. */
int fy_knob_test_embed_whole(void);
/* FUYOU_TEST_STATE_PIECES=1: the plan puts the state slots in pieces (struct fy_plan_place's
 * state_pieces) wherever a unit streams, whether or not a whole unit's state fits --cpu-mem. */
int fy_knob_test_state_pieces(void);
/* FUYOU_TEST_HOST_ROOT=DIR: the machine's memory is read under DIR instead of / (DIR/proc/meminfo,
 * DIR/proc/self/cgroup, DIR/sys/fs/cgroup/..., DIR/dev/shm), so that a test gives a fake one; NULL when unset
 * or empty. */
const char *fy_knob_test_host_root(void);
/* FUYOU_TEST_OPT_DELAY_MS=MS: every AdamW request is delayed by MS (0 to 10000) milliseconds.
 * 1 with *ms the delay, 0 when unset or empty (*ms 0), -EINVAL (said) when out of range. */
int fy_knob_test_opt_delay_ms(long *ms);
/* FUYOU_TEST_GRAD_PIECE_FLOATS=N: the CUDA backend's block gradients go home in pieces of at most
 * N floats (at least 64), so that small models take the path of sliced weights; 0 when unset (or
 * not such a number, said). */
size_t fy_knob_test_grad_piece_floats(void);
/* FUYOU_TEST_LAND_CHUNK=BYTES: the landing ring's chunk (launcher/plan/plan.h) at most that many bytes,
 * rounded up to a multiple of 4096, so that a small model's units stream in several chunks; 0 when
 * unset or not a positive number. */
uint64_t fy_knob_test_land_chunk(void);
/* FUYOU_TEST_GPU_FREE=FREE/TOTAL[,FREE/TOTAL...]: each GPU's free and total memory, in CUDA's
 * order (sizes as --gpu-mem takes them), that fy_backend_devices_free (gpu_worker/backend.h)
 * gives in place of CUDA's, so that the --gpu-mem default is tested without a GPU; NULL when
 * unset or empty. */
const char *fy_knob_test_gpu_free(void);

#ifdef __cplusplus
}
#endif

#endif
