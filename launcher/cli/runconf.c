/* What the commands know of their run: RUN/model.conf (the model, where its store lives), the
 * model that init's and plan's options describe, and the configuration the workers start with. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/formats/ckpt.h"
#include "common/base/dtype.h"
#include "common/base/hostmem.h"
#include "common/base/log.h"
#include "common/model/optstate.h"
#include "gpu_worker/backend.h"
#include "io_worker/store.h"
#include "launcher/cli/runconf.h"
#include "launcher/run/gpus.h"
#include "launcher/run/staging.h"

/* --gpus is parsed against the plan's bound; the session starts that many gpu workers */
_Static_assert(FY_GPUS_MAX == FY_PLAN_RANKS_MAX, "the gpu workers' bound is the plan's");

struct fy_session_opts fy_runconf_session(const struct fy_options *o)
{
    /* train and profile have resolved the backend; the other commands leave "auto" as it is (no
     * CUDA call in the launcher), which is the CPU backend where CUDA is not built */
    int cpu_backend = strcmp(o->backend, "cpu") == 0 ||
                      (strcmp(o->backend, "auto") == 0 && !fy_backend_cuda_built());
    return (struct fy_session_opts){.run_dir = o->run_dir,
                                    .affinity = o->affinity,
                                    .ssd = o->ssd,
                                    .cpu_mem = o->cpu_mem,
                                    .cpu_backend = cpu_backend,
                                    .ready_timeout_ms = o->ready_timeout_s * 1000};
}

/* Entries every worker reads: the store, the backend, AdamW settings. */
int fy_runconf_base(const struct fy_options *o, struct fy_config *c, int create_store)
{
    fy_config_init(c);
    FY_TRY(fy_config_set(c, "ssd", o->ssd));
    FY_TRY(fy_config_setf(c, "store_create", "%d", create_store));
    FY_TRY(fy_config_setf(c, "store_overwrite", "%d", o->overwrite));
    FY_TRY(fy_config_setf(c, "stripe_unit", "%llu", (unsigned long long)o->stripe_unit));
    FY_TRY(fy_config_setf(c, "queue_depth", "%llu", (unsigned long long)o->queue_depth));
    FY_TRY(fy_config_setf(c, "block_size", "%llu", (unsigned long long)o->block_size));
    FY_TRY(fy_config_setf(c, "io_timeout_ms", "%d", o->timeout_s * 1000));
    FY_TRY(fy_config_set(c, "backend", o->backend));
    FY_TRY(fy_config_setf(c, "gpu_mem", "%llu", (unsigned long long)o->gpu_mem));
    FY_TRY(fy_config_set(c, "adamw_impl", o->adamw_impl));
    FY_TRY(fy_config_setf(c, "lr", "%.9g", o->lr));
    FY_TRY(fy_config_setf(c, "weight_decay", "%.9g", o->weight_decay));
    FY_TRY(fy_config_setf(c, "beta1", "%.9g", o->beta1));
    FY_TRY(fy_config_setf(c, "beta2", "%.9g", o->beta2));
    FY_TRY(fy_config_setf(c, "eps", "%.9g", o->adam_eps));
    return 0;
}

int fy_runconf_imported(const struct fy_config *mc)
{
    const char *hf = fy_config_get(mc, "hf");
    return hf != NULL && strcmp(hf, "1") == 0;
}

void fy_runconf_train_defaults(struct fy_options *o, const struct fy_config *mc, char *said,
                               size_t len)
{
    int imported = fy_runconf_imported(mc);
    char why[PATH_MAX + 96];
    if (imported)
        snprintf(why, sizeof why,
                 "the model was imported from Hugging Face: %s/model.conf has "
                 "hf = 1",
                 o->run_dir);
    else
        snprintf(why, sizeof why, "init made the model: %s/model.conf has no hf", o->run_dir);
    fy_options_train_defaults(o, imported);
    fy_options_describe_train_defaults(o, imported, why, said, len);
}

void fy_runconf_cpu_mem(struct fy_options *o, char *said, size_t len)
{
    char cap[32];
    if (o->cpu_mem_set) {
        fy_format_size(o->cpu_mem, cap, sizeof cap);
        snprintf(said, len,
                 o->cpu_mem ? "--cpu-mem %s (given)"
                            : "--cpu-mem 0 (given): no cap, "
                              "no optimizer state kept in memory",
                 cap);
        return;
    }
    struct fy_hostmem m;
    if (fy_hostmem_read(&m) < 0) {
        o->cpu_mem = 0;
        snprintf(said, len,
                 "--cpu-mem not given and this machine's free memory not known (above): "
                 "no cap, no optimizer state kept in memory; give --cpu-mem to keep some");
        return;
    }
    char from[512];
    o->cpu_mem = fy_hostmem_default_cap(&m, from, sizeof from);
    fy_format_size(o->cpu_mem, cap, sizeof cap);
    snprintf(said, len,
             "--cpu-mem %s (the default, what this machine can give): %s; --cpu-mem "
             "SIZE sets another cap, 0 none (and no state kept in memory)",
             cap, from);
}

/* The line of a --gpu-mem given; 0 where it was not given. */
static int gpu_mem_given(const struct fy_options *o, char *said, size_t len)
{
    if (!o->gpu_mem_set)
        return 0;
    char budget[32];
    fy_format_size(o->gpu_mem, budget, sizeof budget);
    snprintf(
        said, len,
        o->gpu_mem
            ? "--gpu-mem %s (given)"
            : "--gpu-mem 0 (given): the GPU arena "
              "sized to the working buffers alone, no room beside them for kept blocks' internals "
              "or held gradients",
        budget);
    return 1;
}

/* The --gpu-mem default of a GPU with free_bytes of total_bytes free, into o->gpu_mem and said;
 * `whose` names the free memory ("GPU 0's free memory"). */
static void gpu_mem_default(struct fy_options *o, uint64_t free_bytes, uint64_t total_bytes,
                            const char *whose, char *said, size_t len)
{
    uint64_t margin;
    o->gpu_mem = fy_backend_gpu_mem_default(free_bytes, total_bytes, &margin);
    char budget[32], free_s[32], total_s[32], margin_s[32];
    fy_format_size(o->gpu_mem, budget, sizeof budget);
    fy_format_size(free_bytes, free_s, sizeof free_s);
    fy_format_size(total_bytes, total_s, sizeof total_s);
    fy_format_size(margin, margin_s, sizeof margin_s);
    snprintf(said, len,
             "--gpu-mem %s (the default: %s %s of %s less a margin of %s for the CUDA "
             "context, cuBLAS and NCCL outside the arena); --gpu-mem SIZE sets another, 0 an "
             "arena sized to the working buffers alone",
             budget, whose, free_s, total_s, margin_s);
}

void fy_runconf_gpu_mem(struct fy_options *o, char *said, size_t len)
{
    said[0] = 0;
    if (strcmp(o->backend, "cuda") != 0 || gpu_mem_given(o, said, len))
        return;
    uint64_t free_bytes, total_bytes;
    int which;
    if (fy_backend_devices_free((int)o->gpus, &free_bytes, &total_bytes, &which) < 0) {
        o->gpu_mem = 0;
        snprintf(said, len,
                 "--gpu-mem not given and the GPU's free memory not known (above): the "
                 "GPU arena sized to the working buffers alone, no room beside them for kept "
                 "blocks' internals or held gradients; give --gpu-mem to make room");
        return;
    }
    char whose[96];
    if (o->gpus > 1)
        snprintf(whose, sizeof whose,
                 "GPU %d's, the least free of the %llu the gpu workers take, "
                 "free memory",
                 which, (unsigned long long)o->gpus);
    else
        snprintf(whose, sizeof whose, "GPU %d's free memory", which);
    gpu_mem_default(o, free_bytes, total_bytes, whose, said, len);
}

int fy_runconf_plan_gpu_mem(struct fy_options *o, const char *backend, char *said, size_t len)
{
    said[0] = 0;
    if (strcmp(backend, "cuda") != 0 || gpu_mem_given(o, said, len))
        return 0;
    struct fy_plan_machine_gpu gpu = {0};
    if (o->machine != NULL)
        FY_TRY(fy_plan_machine_gpu_load(o->machine, &gpu));
    if (gpu.total_bytes == 0) {
        o->gpu_mem = 0;
        char why[PATH_MAX + 96];
        if (o->machine != NULL)
            snprintf(why, sizeof why,
                     "%s records none: fuyou-launch probe on the CUDA backend "
                     "records it",
                     o->machine);
        else
            snprintf(why, sizeof why,
                     "no machine profile: fuyou-launch probe --run-dir RUN on "
                     "the GPU machine records it");
        snprintf(said, len,
                 "--gpu-mem not given and no GPU's free memory known (%s): planned "
                 "with the GPU arena sized to the working buffers alone, nothing kept beside "
                 "them; train takes its GPUs' free memory less a margin: give --gpu-mem SIZE to "
                 "plan for that",
                 why);
        return 0;
    }
    char whose[PATH_MAX + 256];
    snprintf(whose, sizeof whose,
             "the free memory of the GPU %s's probe measured%s%s%s%s, as "
             "train there would take it,",
             o->machine, gpu.probed_at[0] ? " on " : "", gpu.probed_at,
             gpu.host[0] ? " on host " : "", gpu.host);
    gpu_mem_default(o, gpu.free_bytes, gpu.total_bytes, whose, said, len);
    return 0;
}

/* Every --ssd directory must exist before any worker starts, so a typo costs one clear line. */
int fy_runconf_check_ssd(const char *list)
{
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        struct stat st;
        if (stat(p, &st) != 0) {
            int e = errno;
            fy_error(
                "ssd path %s: %s: create it, or pass the --ssd directories of this run's store", p,
                strerror(e));
            return -e;
        }
        FY_REQUIRE(S_ISDIR(st.st_mode), -ENOTDIR, "ssd path %s is not a directory", p);
    }
    return 0;
}

static void model_conf_path(const char *run_dir, char *out, size_t len)
{
    snprintf(out, len, "%s/model.conf", run_dir);
}

/* The store of the run in o->run_dir as model.conf records it, into o->ssd_here. A model.conf
 * written before stores were recorded relative to their run directory names the store of the
 * directory it was made in: where that is another directory's store/ and this one has its own
 * (a copy or a move), this one's is taken, and said. */
static void find_store(struct fy_options *o, const struct fy_config *mc, const char *recorded)
{
    const char *in_run = fy_config_get(mc, "store_in_run_dir");
    if (in_run != NULL && strcmp(in_run, "1") == 0) { /* absolute: one name whatever the cwd */
        char dir[PATH_MAX];
        snprintf(o->ssd_here, sizeof o->ssd_here, "%s/%s",
                 realpath(o->run_dir, dir) != NULL ? dir : o->run_dir, recorded);
        return;
    }
    snprintf(o->ssd_here, sizeof o->ssd_here, "%s", recorded);
    size_t len = strlen(recorded);
    char own[PATH_MAX + 32], own_data[PATH_MAX + 64], theirs[PATH_MAX], here[PATH_MAX];
    snprintf(own, sizeof own, "%s/store", o->run_dir);
    snprintf(own_data, sizeof own_data, "%s/%s", own, FY_STORE_DATA_NAME);
    if (strchr(recorded, ',') != NULL || len < 6 || strcmp(recorded + len - 6, "/store") != 0 ||
        access(own_data, F_OK) != 0)
        return;
    snprintf(theirs, sizeof theirs, "%.*s", (int)(len - 6), recorded);
    if (realpath(o->run_dir, here) == NULL)
        return;
    char theirs_real[PATH_MAX];
    if (realpath(theirs, theirs_real) != NULL && strcmp(theirs_real, here) == 0)
        return; /* its own store after all */
    fy_info("%s/model.conf names the store %s, of the run directory it was made in; this one "
            "has its own: using %s",
            o->run_dir, recorded, own);
    snprintf(o->ssd_here, sizeof o->ssd_here, "%s", own);
}

/* Reads RUN/model.conf (written by init): the model and where its store lives. */
int fy_runconf_load(struct fy_options *o, struct fy_config *mc, struct fy_model_config *model)
{
    char path[PATH_MAX];
    model_conf_path(o->run_dir, path, sizeof path);
    if (access(path, F_OK) != 0) {
        if (fy_staging_explain_missing(o->run_dir, path)) /* an init unfinished, or running */
            return -ENOENT;
        fy_error(
            "%s: no model in this run directory: create one with fuyou-launch init --run-dir %s",
            path, o->run_dir);
        return -ENOENT;
    }
    FY_TRY(fy_config_load(mc, path));
    FY_TRY(fy_model_config_from(mc, model));
    if (o->ssd != NULL) /* --ssd: the store is where the command says */
        return fy_runconf_check_ssd(o->ssd);
    const char *recorded = fy_config_get(mc, "ssd");
    FY_REQUIRE(recorded != NULL, -EINVAL, "%s has no 'ssd' entry: pass --ssd", path);
    find_store(o, mc, recorded);
    o->ssd = o->ssd_here;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", o->ssd);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        struct stat st;
        int e = stat(p, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
        if (e != 0) {
            fy_error("the store of %s is missing (%s: ssd = %s): %s: %s; mount or restore it "
                     "there, or pass --ssd with the store's directories",
                     o->run_dir, path, recorded, p, strerror(e));
            return -e;
        }
    }
    return 0;
}

/* The store must hold the model this run describes. */
int fy_runconf_check_store(const struct fy_storemeta *meta, const struct fy_model_config *model,
                           const char *ssd)
{
    if (fy_model_config_hash(&meta->model) == fy_model_config_hash(model)) {
        FY_REQUIRE(meta->model.optim_state == model->optim_state, -EINVAL,
                   "store %s keeps %s optimizer state, the run's model.conf says %s "
                   "(model.optim_state): pass the --ssd of this run's store, or put back the "
                   "model.conf init wrote",
                   ssd, fy_optim_state_name(meta->model.optim_state),
                   fy_optim_state_name(model->optim_state));
        FY_REQUIRE(meta->model.state_piece == model->state_piece, -EINVAL,
                   "store %s keeps its optimizer state in pieces of %llu bytes, the run's "
                   "model.conf says %llu (model.state_piece; 0: whole units): pass the --ssd of "
                   "this run's store, or put back the model.conf init wrote",
                   ssd, (unsigned long long)meta->model.state_piece,
                   (unsigned long long)model->state_piece);
        return 0;
    }
    char have[160], want[160];
    fy_model_config_describe(&meta->model, have, sizeof have);
    fy_model_config_describe(model, want, sizeof want);
    fy_error("store %s was made for another model (%s) than this run's (%s): pass the --ssd of "
             "this run's store",
             ssd, have, want);
    return -EINVAL;
}

int fy_runconf_optim_state(const struct fy_options *o)
{
    return o->optim_state >= 0 ? o->optim_state : FY_OPTIM_STATE_FP32;
}

/* The model that init's options describe (--arch, --layers, ...), validated. */
int fy_runconf_model(const struct fy_options *o, struct fy_model_config *out)
{
    struct fy_model_config model = {.n_layer = (uint32_t)o->layers,
                                    .n_head = (uint32_t)o->heads,
                                    .n_embd = (uint32_t)o->embd,
                                    .vocab = (uint32_t)o->vocab,
                                    .ctx = (uint32_t)o->ctx};
    FY_REQUIRE(o->layers <= UINT32_MAX && o->heads <= UINT32_MAX && o->embd <= UINT32_MAX &&
                   o->vocab <= UINT32_MAX && o->ctx <= UINT32_MAX && o->kv_heads <= UINT32_MAX &&
                   o->head_dim <= 1024 && o->ffn <= UINT32_MAX && 4 * o->embd <= UINT32_MAX,
               -FY_EUSAGE, "init: model dimensions too large");
    model.optim_state = fy_runconf_optim_state(o);
    model.state_piece = o->state_piece;
    model.arch = fy_arch_by_name(o->arch); /* parse_arch took a registry name */
    FY_REQUIRE(model.arch != NULL, -EINVAL, "init: --arch %s is not a model family", o->arch);
    const struct fy_family_options fo = {.kv_heads = o->kv_heads,
                                         .ffn = o->ffn,
                                         .head_dim = o->head_dim,
                                         .tied = o->tied,
                                         .rms_eps = o->rms_eps,
                                         .rope_theta = o->rope_theta};
    /* the model options' values, against each other and the family's limits (said) */
    if (model.arch->from_options(&fo, &model) < 0 || fy_model_config_validate(&model) < 0)
        return -FY_EUSAGE;
    *out = model;
    return 0;
}

/* Pool regions for moving a model unit by unit between a Hugging Face directory and the store:
 * a commit record and one piece's state (read whole on export, to check its digest). */
void fy_runconf_unit_regions(const struct fy_model_config *c, struct fy_pool_region_spec out[2])
{
    out[0] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    out[1] = (struct fy_pool_region_spec){"unit", fy_optstate_max_piece_bytes(c)};
}

int fy_runconf_train(const struct fy_options *o, const struct fy_model_config *model, int act_dtype,
                     struct fy_config *cfg)
{
    FY_TRY(fy_runconf_base(o, cfg, 0));
    FY_TRY(fy_model_config_to(model, cfg));
    FY_USAGE(o->gpus >= 1 && o->batch % o->gpus == 0,
             "--batch %llu over --gpus %llu: each gpu worker computes an equal share of the "
             "batch; give a batch that is a multiple of --gpus",
             (unsigned long long)o->batch, (unsigned long long)o->gpus);
    FY_TRY(fy_config_setf(cfg, "train.batch", "%llu", (unsigned long long)o->batch));
    FY_TRY(fy_config_setf(cfg, "train.seq", "%llu", (unsigned long long)o->seq));
    FY_TRY(fy_config_setf(cfg, "train.ranks", "%llu", (unsigned long long)o->gpus));
    FY_TRY(fy_config_set(cfg, "train.act_dtype", fy_dtype_name(act_dtype)));
    FY_TRY(fy_config_set(cfg, "train.act_plan", o->act_plan));
    return 0;
}

/* The dtype of the weights the gpu worker of `backend` is sent (--weights-dtype, auto: the
 * backend's). */
int fy_runconf_weight_dtype(const struct fy_options *o, const char *backend)
{
    return o->weights_dtype ? o->weights_dtype : fy_backend_preferred_weight_dtype(backend);
}

int fy_runconf_plan_in(const struct fy_options *o, const struct fy_model_config *model,
                       const char *backend, struct fy_plan_in *in)
{
    *in = (struct fy_plan_in){.shape = {.c = model,
                                        .B = (int)o->batch,
                                        .T = (int)o->seq,
                                        .act_dtype = fy_backend_preferred_act_dtype(backend),
                                        .clip = o->clip_grad_norm > 0,
                                        .ranks = (int)o->gpus,
                                        .weight_dtype = fy_runconf_weight_dtype(o, backend)},
                              .backend = backend,
                              .prefetch = (unsigned)o->prefetch,
                              .grad_slots = (unsigned)o->grad_slots,
                              .act_ahead = (unsigned)o->act_ahead,
                              .block_inputs_place = o->block_inputs_place,
                              .cpu_mem = o->cpu_mem,
                              .gpu_mem = o->gpu_mem,
                              .state_copies = (unsigned)o->state_copies,
                              .clip_mode = o->clip_mode,
                              .clip_hold = o->clip_hold,
                              .clip_max = o->clip_grad_norm,
                              .clip_given = o->given.clip,
                              .rates = fy_plan_reference_rates};
    return fy_actplan_mode_parse(o->act_plan, &in->act_mode);
}
