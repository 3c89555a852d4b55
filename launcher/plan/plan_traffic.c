/* A step's traffic and predicted time: launcher/plan/plan_traffic.h. */
#include "launcher/plan/plan_traffic.h"

#include <math.h>
#include <string.h>

#include "common/base/dtype.h"
#include "common/model/optstate.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

/* ---- traffic and prediction ------------------------------------------------------------------ */

uint64_t fy_plan_grad_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    const struct fy_model_config *c = s->c;
    uint64_t embed = fy_model_unit_params(c, 0) * 4, block = fy_model_unit_params(c, 1) * 4;
    uint64_t fin = fy_model_unit_params(c, c->n_layer + 1) * 4;
    uint64_t wte = (uint64_t)c->vocab * c->n_embd * 4;
    /* the head's (the final unit's and the tied embeddings') in the forward */
    return fin + wte + fy_plan_backward_passes(s, p) * (c->n_layer * block + embed);
}

/* One link's PCIe bytes (rank 0's; every link's where the gradients are summed in the pool), and
 * with several ranks the NVLink and host memory bytes. */
static void pcie_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                       struct fy_plan_traffic *out)
{
    const struct fy_model_config *c = s->c;
    int wd = s->weight_dtype;
    uint64_t ranks = (uint64_t)fy_plan_ranks(s), b = (uint64_t)fy_plan_rank_batch(s);
    uint64_t act = fy_plan_act_bytes(c, (int)b, s->T, s->act_dtype), tok = b * s->T * 4;
    uint64_t embed = fy_model_unit_params(c, 0) * 4, block = fy_model_unit_params(c, 1) * 4;
    uint64_t fin = fy_model_unit_params(c, c->n_layer + 1) * 4;
    uint64_t wte = (uint64_t)c->vocab * c->n_embd * 4, L = c->n_layer;
    uint64_t passes = fy_plan_backward_passes(s, p);
    uint64_t blocks_up = 0, head_up = wd == FY_DTYPE_BF16 ? (fin + wte) / 2 : fin + wte;
    for (unsigned u = 1; u <= L; u++)
        blocks_up += fy_plan_upload_bytes(c, wd, u);
    /* forward: embeddings, blocks; the head (x, targets, final, wte in; dx, dfinal, dwte out);
     * backward: blocks (weights, x, dy in; dx, dweights out), embeddings (dx, dembed in and out).
     * Each link: the weights, its sequences' tokens and activations, the embeddings' gradient to
     * add to; the f32 gradients (fy_plan_grad_bytes) on rank 0's */
    uint64_t up = (tok + fy_plan_upload_bytes(c, wd, 0)) + blocks_up + L * act +
                  (act + tok + head_up) + passes * (blocks_up + L * 2 * act + (tok + embed + act));
    uint64_t acts_down = act + L * act + act + passes * L * act;
    uint64_t grads = fy_plan_grad_bytes(s, p);
    out->to_gpu = up + passes * (p->swap.host_bytes + p->swap.ssd_bytes);
    out->from_gpu = acts_down + grads + p->swap.host_bytes + p->swap.ssd_bytes;
    if (s->clip && p->grad_hold == FY_HOLD_GPU) /* held on the GPU: sent once more, to update */
        out->from_gpu += L * block;
    out->nvlink = out->host_mem = 0;
    if (ranks == 1)
        return;
    /* several: a ring reduce carries (ranks - 1) / ranks of the gradients over each link, and
     * rank 0 alone sends them; or every rank sends its own and those after the first add them to
     * the pool's sum, which they read */
    int nvlink = p->reduce == FY_REDUCE_NVLINK;
    out->nvlink = nvlink ? grads * (ranks - 1) / ranks : 0;
    out->host_mem = ranks * (out->to_gpu + out->from_gpu - grads) +
                    (nvlink ? grads : (2 * ranks - 1) * grads) + out->convert;
}

static void ssd_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                      struct fy_plan_traffic *out)
{
    const struct fy_model_config *c = s->c;
    uint64_t act = align4k(fy_plan_act_bytes(c, s->B, s->T, s->act_dtype));
    uint64_t spilled = p->block_inputs_slots ? c->n_layer * act : 0;
    spilled += p->swap.ssd_bytes;
    out->ssd_read = (s->clip && !p->grad_hold ? 2 : 1) * spilled;
    out->ssd_write = spilled;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (p->resident == NULL || !p->resident[u]) {
            int block = fy_model_unit_kind(c, u) == FY_UNIT_BLOCK;
            /* a clipped step's norm pass reads a streamed block's master once more, but where
             * one pass defers its update to the next forward, which reads its state in place of
             * its master (fy_sched_clipped_backward; not with the state in pieces) */
            int defers = p->grad_hold && p->prefetch <= 2 && !p->state_pieces;
            int twice = s->clip && block && !defers;
            /* with the state in pieces, the backward that updates (not one pass's) reads a
             * block's master again for its weights, its state after the block's backward */
            int again = p->state_pieces && block && !(s->clip && p->grad_hold);
            out->ssd_read += (uint64_t)(1 + twice + again) * fy_optstate_master_bytes(c, u) +
                             fy_optstate_bytes(c, u);
            out->ssd_write += fy_optstate_bytes(c, u);
        }
}

void fy_plan_traffic(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     struct fy_plan_traffic *out)
{
    out->convert = fy_plan_convert_params(s, p) * fy_plan_convert_param_bytes(s);
    pcie_bytes(s, p, out);
    ssd_bytes(s, p, out);
}

double fy_plan_block_updates_s(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                               const struct fy_plan_rates *rates)
{
    const struct fy_model_config *c = s->c;
    double total = 0;
    for (unsigned u = 1; u <= c->n_layer; u++) {
        double adamw = (double)fy_model_unit_params(c, u) / fy_plan_rates_opt_worker(rates),
               ssd = 0;
        if (p->resident == NULL || !p->resident[u])
            ssd = (double)fy_optstate_bytes(c, u) / rates->ssd_read +
                  (double)fy_optstate_bytes(c, u) / rates->ssd_write;
        total += fmax(adamw, ssd);
    }
    return total;
}

void fy_plan_predict(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     const struct fy_plan_rates *rates, struct fy_plan_prediction *out)
{
    const struct fy_model_config *c = s->c;
    /* each GPU's compute: its own sequences */
    double tokens = (double)fy_plan_rank_batch(s) * s->T;
    double flops = tokens * fy_model_flops_per_token(c, (unsigned)s->T);
    /* a clipped step runs the blocks' backward (with their recomputation) twice: 6 of the 8 parts
     * (2 forward, 2 recompute, 4 backward) of the blocks' work once more */
    double block_flops =
        tokens * c->n_layer * (6.0 * fy_model_unit_params(c, 1) + 6.0 * (double)s->T * c->n_embd);
    double norm_flops = s->clip && !p->grad_hold ? 0.75 * block_flops : 0;
    flops += norm_flops;
    struct fy_plan_traffic t;
    fy_plan_traffic(s, p, &t);
    double params = (double)fy_model_total_params(c);
    memset(out, 0, sizeof *out);
    out->gpu_s = rates->gpu_flops > 0 ? flops / rates->gpu_flops : 0;
    out->h2d_s = t.to_gpu / rates->h2d;
    out->d2h_s = t.from_gpu / rates->d2h;
    out->ssd_s = t.ssd_read / rates->ssd_read + t.ssd_write / rates->ssd_write;
    out->nvlink_s = t.nvlink > 0 && rates->nvlink > 0 ? t.nvlink / rates->nvlink : 0;
    out->host_mem_s = t.host_mem > 0 && rates->host_mem > 0 ? t.host_mem / rates->host_mem : 0;
    /* with clipping the opt worker also reads every gradient for its sum of squares: with f32
     * gradients 4 bytes a parameter beside the update's 28 */
    double update_bytes = fy_optstate_update_param_bytes(FY_DTYPE_F32, c->optim_state);
    double sumsq_share = (double)fy_dtype_size(FY_DTYPE_F32) / update_bytes;
    /* the conversions to bf16 move their bytes at host memory's rate as AdamW finds it: its
     * parameters/s times the bytes an update moves a parameter */
    double adamw = fy_plan_rates_opt_worker(rates);
    out->convert_s = (double)t.convert / (adamw * update_bytes);
    out->opt_s = params / adamw * (s->clip ? 1.0 + sumsq_share : 1.0) + out->convert_s;
    /* no update before the norm. One pass: AdamW overlaps the next forward (a quarter of the
     * compute with the blocks recomputed) and nothing of the backward. Two passes: the norm pass
     * alone, then the updates overlap the second backward, and the forward waits for them */
    double norm_s = rates->gpu_flops > 0 ? norm_flops / rates->gpu_flops : 0;
    double serial_s = !s->clip       ? 0
                      : p->grad_hold ? 0.75 * out->gpu_s + out->opt_s
                                     : out->gpu_s + fmax(0.0, out->opt_s - norm_s);
    /* one gradient slot: each block's backward waits for the update of the block above (a
     * streamed one's state read and written, its AdamW), none overlaps the gpu */
    double one_slot_s = 0;
    if (p->grad_slots == 1) { /* the forward as the faster of its compute and its reads allow,
                                 then the backward's compute and the updates one after another */
        double fwd_read_s = 0;
        for (unsigned u = 0; u < fy_model_unit_count(c); u++)
            if (p->resident == NULL || !p->resident[u])
                fwd_read_s += (double)fy_optstate_master_bytes(c, u) / rates->ssd_read;
        one_slot_s = fmax(0.25 * out->gpu_s, fwd_read_s) + 0.75 * out->gpu_s +
                     fy_plan_block_updates_s(s, p, rates);
    }
    const double times[] = {out->gpu_s, out->h2d_s,    out->d2h_s,      out->ssd_s, out->opt_s,
                            serial_s,   out->nvlink_s, out->host_mem_s, one_slot_s};
    static const char *const names[] = {"GPU compute",
                                        "PCIe to the GPU",
                                        "PCIe from the GPU",
                                        "SSD",
                                        "optimizer",
                                        "the norm, then the optimizer",
                                        "NVLink",
                                        "host memory",
                                        "the backward, then each block's update (one gradient "
                                        "slot)"};
    for (int i = 0; i < 9; i++)
        if (times[i] > out->step_s) {
            out->step_s = times[i];
            out->bound = names[i];
        }
}
