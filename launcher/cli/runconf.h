/* What the commands know of their run: RUN/model.conf (the model, where its store lives), the
 * model that init's and plan's options describe, and the configuration the workers start with
 * (the store, the backend, AdamW, the batch), all from the options (launcher/cli/options.h). */
#ifndef FY_RUNCONF_H
#define FY_RUNCONF_H

#include "common/formats/ckpt.h"
#include "common/base/config.h"
#include "common/model/model.h"
#include "common/ipc/pool.h"
#include "launcher/cli/options.h"
#include "launcher/plan/plan.h"
#include "launcher/run/session.h"

/* The session of a command's workers: its run directory, affinity, store, --cpu-mem and
 * --ready-timeout. */
struct fy_session_opts fy_runconf_session(const struct fy_options *o);
/* Entries every worker reads: the store (created where create_store), the backend, AdamW's
 * settings. */
int fy_runconf_base(const struct fy_options *o, struct fy_config *c, int create_store);
/* Whether the run's model was imported from Hugging Face (init --from-hf: model.conf hf = 1). */
int fy_runconf_imported(const struct fy_config *mc);
/* The training values not given on the command line from the run's set of defaults
 * (fy_options_train_defaults): fine-tuning for a model imported from Hugging Face, from scratch
 * for one made by init. It depends on model.conf alone, so resume resolves as train did. The line
 * that says which set, and why, into said. */
void fy_runconf_train_defaults(struct fy_options *o, const struct fy_config *mc, char *said,
                               size_t len);
/* --cpu-mem where the command line did not give it: what this machine can give (common/base/hostmem.h:
 * MemAvailable, or its cgroup's room where less, less a margin), the machine the command runs on
 * (plan's too: train would run here). The line that says the cap and where it came from into
 * said. A machine whose memory cannot be read keeps no cap (0), said. */
void fy_runconf_cpu_mem(struct fy_options *o, char *said, size_t len);
/* --gpu-mem where the command line did not give it, for a run on the CUDA backend (o->backend
 * resolved): the least free memory of the GPUs its gpu workers take (fy_backend_devices_free)
 * less the margin of fy_backend_gpu_mem_default. The line that says the arena's budget and where
 * it came from into said; "" on the CPU backend, whose --gpu-mem keeps its meaning. GPUs whose
 * memory cannot be read leave 0 (the arena sized to the working buffers alone), said. */
void fy_runconf_gpu_mem(struct fy_options *o, char *said, size_t len);
/* plan's --gpu-mem where the command line did not give it, for a plan on the CUDA backend: from
 * the GPU's free memory the machine profile (--machine, or RUN/machine.json) records, less the
 * same margin, as train on that machine would take it; without one 0 (the arena sized to the
 * working buffers alone). No CUDA call: plan may run elsewhere. The line into said ("" on the CPU
 * backend); -EINVAL (said) for a profile whose GPU figures are not numbers. */
int fy_runconf_plan_gpu_mem(struct fy_options *o, const char *backend, char *said, size_t len);
/* fy_runconf_base's and the training entries of the gpu worker: the model, the batch, the
 * activations' dtype and --act-plan. */
int fy_runconf_train(const struct fy_options *o, const struct fy_model_config *model, int act_dtype,
                     struct fy_config *cfg);
/* Every directory of a --ssd list exists: else one line that names it, -errno. */
int fy_runconf_check_ssd(const char *list);
/* Reads RUN/model.conf (written by init) into mc and model, and points o->ssd at the run's store
 * (o->ssd_here) unless --ssd gave it; a missing model or store is said. */
int fy_runconf_load(struct fy_options *o, struct fy_config *mc, struct fy_model_config *model);
/* The store (at ssd) holds the model this run describes: else said, -EINVAL. */
int fy_runconf_check_store(const struct fy_storemeta *meta, const struct fy_model_config *model,
                           const char *ssd);
/* The optimizer state format --optim-state gives (fp32 where it is not given). */
int fy_runconf_optim_state(const struct fy_options *o);
/* The model that the model options describe (--arch, --layers, ...), validated. */
int fy_runconf_model(const struct fy_options *o, struct fy_model_config *out);
/* Pool regions for moving a model unit by unit between a Hugging Face directory and the store: a
 * commit record and one piece's state (fy_optstate_max_piece_bytes: a unit in one piece whole). */
void fy_runconf_unit_regions(const struct fy_model_config *c, struct fy_pool_region_spec out[2]);
/* The dtype of the weights the gpu worker of `backend` is sent (--weights-dtype; auto: the
 * backend's). */
int fy_runconf_weight_dtype(const struct fy_options *o, const char *backend);
/* What the planner (launcher/plan/plan.h) is given for a run of `model` on `backend` (resolved) with
 * these options: the step's shape (the backend's activations), where things may go, the budgets,
 * and the reference machine's rates. -EINVAL (said) for an --act-plan it does not know. */
int fy_runconf_plan_in(const struct fy_options *o, const struct fy_model_config *model,
                       const char *backend, struct fy_plan_in *in);

#endif
