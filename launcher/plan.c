/* The planner of a training run (launcher/plan.h). */
#include "plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/ckpt.h"
#include "common/dtype.h"
#include "common/optstate.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

uint64_t fy_plan_act_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype)
{
    return (uint64_t)B * T * c->n_embd * fy_dtype_size(act_dtype);
}

uint64_t fy_plan_embed_rows(const struct fy_gpt_config *c)
{
    return fy_gpt_unit_params(c, 0) / c->n_embd;
}

/* Two lists of the embeddings' rows (int32): those the batch's tokens do not touch, whose
 * gradient is final after the head, and the others (embed_update_early). */
static uint64_t embed_rows_bytes(const struct fy_gpt_config *c)
{
    return align4k(2 * fy_plan_embed_rows(c) * 4);
}

/* The largest unit's f32 gradient, 4 KiB padded. */
static uint64_t max_grad_bytes(const struct fy_gpt_config *c)
{
    uint64_t m = 0;
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++)
        if (align4k(fy_gpt_unit_params(c, u) * 4) > m)
            m = align4k(fy_gpt_unit_params(c, u) * 4);
    return m;
}

unsigned fy_plan_act_ahead(unsigned asked)
{
    return asked ? asked : FY_PLAN_ACT_AHEAD_DEFAULT;
}

unsigned fy_plan_spill_slots(unsigned act_ahead)
{
    return fy_plan_act_ahead(act_ahead) + 2;
}

void fy_plan_swap_of(const unsigned char *place, unsigned n_layer,
                     const struct fy_actplan_sizes *sizes, unsigned act_ahead,
                     struct fy_plan_swap *out)
{
    memset(out, 0, sizeof *out);
    for (unsigned l = 0; place != NULL && l < n_layer; l++) {
        struct fy_actplan_region h, d; /* swappable kinds only: cannot fail */
        fy_actplan_region_of(sizes, fy_actplan_mask(place, (int)l, FY_ACT_HOST), &h);
        fy_actplan_region_of(sizes, fy_actplan_mask(place, (int)l, FY_ACT_SSD), &d);
        out->host_bytes += h.bytes;
        out->ssd_bytes += d.bytes;
        out->slot_bytes = d.bytes > out->slot_bytes ? d.bytes : out->slot_bytes;
    }
    out->slots = out->ssd_bytes ? fy_plan_spill_slots(act_ahead) : 0;
}

uint64_t fy_plan_swap_pool_bytes(const struct fy_plan_swap *swap)
{
    if (swap == NULL)
        return 0;
    return swap->host_bytes + swap->slots * swap->slot_bytes;
}

uint64_t fy_plan_spill_extent_bytes(uint64_t item_bytes, unsigned count)
{
    return fy_scratch_bytes((uint64_t)(count ? count : 1) * item_bytes);
}

uint64_t fy_plan_swap_store_bytes(const struct fy_plan_swap *swap, unsigned n_layer)
{
    return swap != NULL && swap->ssd_bytes ? fy_plan_spill_extent_bytes(swap->slot_bytes, n_layer) : 0;
}

uint64_t fy_plan_ckpt_store_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype)
{
    return fy_plan_spill_extent_bytes(align4k(fy_plan_act_bytes(c, B, T, act_dtype)), c->n_layer);
}

uint64_t fy_plan_upload_bytes(const struct fy_gpt_config *c, const unsigned char *resident,
                              unsigned u)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(c, u, &lay);
    if (resident != NULL && resident[u] == FY_PLAN_KEPT_BF16)
        return lay.params * fy_dtype_size(FY_OPTSTATE_COPY_DTYPE);
    return lay.section[FY_OPTSTATE_MASTER].bytes;
}

unsigned fy_plan_weight_copies(const struct fy_gpt_config *c, const unsigned char *resident)
{
    unsigned n = 0;
    for (unsigned u = 0; resident != NULL && u < fy_gpt_unit_count(c); u++)
        n += resident[u] == FY_PLAN_KEPT_BF16;
    return n;
}

/* The head's weights go up in bf16 only when both its units have copies (one dtype a request). */
static int head_has_copies(const struct fy_gpt_config *c, const unsigned char *resident)
{
    return resident != NULL && resident[0] == FY_PLAN_KEPT_BF16 &&
           resident[c->n_layer + 1] == FY_PLAN_KEPT_BF16;
}

void fy_plan_pcie_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                        const struct fy_plan_swap *swap, const unsigned char *resident,
                        uint64_t *to_gpu, uint64_t *from_gpu)
{
    uint64_t act = fy_plan_act_bytes(c, B, T, act_dtype), tok = (uint64_t)B * T * 4;
    uint64_t embed = fy_gpt_unit_params(c, 0) * 4, block = fy_gpt_unit_params(c, 1) * 4;
    uint64_t fin = fy_gpt_unit_params(c, c->n_layer + 1) * 4;
    uint64_t wte = (uint64_t)c->vocab * c->n_embd * 4, L = c->n_layer;
    uint64_t passes = clip ? 2 : 1; /* backward passes through the blocks and the embeddings */
    uint64_t blocks_up = 0, head_up = head_has_copies(c, resident) ? (fin + wte) / 2 : fin + wte;
    for (unsigned u = 1; u <= L; u++)
        blocks_up += fy_plan_upload_bytes(c, resident, u);
    /* forward: embeddings, blocks; the head (x, targets, final, wte in; dx, dfinal, dwte out);
     * backward: blocks (weights, x, dy in; dx, dweights out), embeddings (dx, dembed in and out) */
    *to_gpu = (tok + fy_plan_upload_bytes(c, resident, 0)) + blocks_up + L * act +
              (act + tok + head_up) + passes * (blocks_up + L * 2 * act + (tok + embed + act));
    *from_gpu = act + L * act + (act + fin + wte) + passes * (L * (act + block) + embed);
    if (swap != NULL) {
        *from_gpu += swap->host_bytes + swap->ssd_bytes;
        *to_gpu += passes * (swap->host_bytes + swap->ssd_bytes);
    }
}

void fy_plan_ssd_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                       int ckpt_ssd, const struct fy_plan_swap *swap,
                       const unsigned char *resident, uint64_t *read, uint64_t *write)
{
    uint64_t ckpts = ckpt_ssd ? c->n_layer * align4k(fy_plan_act_bytes(c, B, T, act_dtype)) : 0;
    ckpts += swap != NULL ? swap->ssd_bytes : 0;
    *read = (clip ? 2 : 1) * ckpts;
    *write = ckpts;
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++)
        if (resident == NULL || !resident[u]) {
            int block = fy_gpt_unit_kind(c, u) == FY_UNIT_BLOCK;
            *read += (uint64_t)(1 + (clip && block)) * fy_optstate_master_bytes(c, u) +
                     fy_optstate_bytes(c, u);
            *write += fy_optstate_bytes(c, u);
        }
}

struct fy_plan_rates fy_plan_reference_rates(void)
{
    return (struct fy_plan_rates){.gpu_flops = 390e12, .h2d = 54e9, .d2h = 55e9,
                                  .ssd_read = 2.3e9, .ssd_write = 2.4e9, .opt_params = 3.1e9};
}

void fy_plan_predict(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                     int ckpt_ssd, const struct fy_plan_swap *swap,
                     const unsigned char *resident, const struct fy_plan_rates *rates,
                     struct fy_plan_prediction *out)
{
    double tokens = (double)B * T, flops = tokens * fy_gpt_flops_per_token(c, (unsigned)T);
    /* a clipped step runs the blocks' backward (with their recomputation) twice: 6 of the 8 parts
     * (2 forward, 2 recompute, 4 backward) of the blocks' work once more */
    double block_flops = tokens * c->n_layer *
                         (6.0 * fy_gpt_unit_params(c, 1) + 6.0 * (double)T * c->n_embd);
    if (clip)
        flops += 0.75 * block_flops;
    uint64_t up, down, rd, wr;
    fy_plan_pcie_bytes(c, B, T, act_dtype, clip, swap, resident, &up, &down);
    fy_plan_ssd_bytes(c, B, T, act_dtype, clip, ckpt_ssd, swap, resident, &rd, &wr);
    double params = (double)fy_gpt_total_params(c);
    memset(out, 0, sizeof *out);
    out->gpu_s = rates->gpu_flops > 0 ? flops / rates->gpu_flops : 0;
    out->h2d_s = up / rates->h2d;
    out->d2h_s = down / rates->d2h;
    out->ssd_s = rd / rates->ssd_read + wr / rates->ssd_write;
    /* with clipping the opt worker also reads every gradient for its sum of squares: with f32
     * gradients 4 bytes a parameter beside the update's 28 */
    double sumsq_share = (double)fy_dtype_size(FY_DTYPE_F32) /
                         (double)fy_optstate_update_param_bytes(FY_DTYPE_F32);
    out->opt_s = params / rates->opt_params * (clip ? 1.0 + sumsq_share : 1.0);
    const double times[] = {out->gpu_s, out->h2d_s, out->d2h_s, out->ssd_s, out->opt_s};
    static const char *const names[] = {"GPU compute", "PCIe to the GPU", "PCIe from the GPU",
                                        "SSD", "optimizer"};
    for (int i = 0; i < 5; i++)
        if (times[i] > out->step_s) {
            out->step_s = times[i];
            out->bound = names[i];
        }
}

uint64_t fy_plan_resident_bytes(const struct fy_gpt_config *c, const unsigned char *resident)
{
    uint64_t bytes = 0;
    for (unsigned u = 0; resident != NULL && u < fy_gpt_unit_count(c); u++)
        if (resident[u])
            bytes += fy_optstate_bytes(c, u) +
                     (resident[u] == FY_PLAN_KEPT_BF16 ? fy_optstate_copy_bytes(c, u) : 0);
    return bytes;
}

/* Marks units of `resident` from FY_PLAN_STREAMED (or _KEPT) up to `mark`, unit 0 first, while the
 * pool still fits cpu_mem; returns how many it marked. */
static unsigned plan_mark(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                          uint64_t cpu_mem, int clip, unsigned prefetch, unsigned ckpt_slots,
                          const struct fy_plan_swap *swap, unsigned char mark,
                          unsigned char *resident)
{
    unsigned count = 0;
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++) {
        if (resident[u] != mark - 1)
            continue;
        resident[u] = mark;
        struct fy_pool_region_spec regions[10];
        unsigned n;
        fy_plan_regions(c, B, T, act_dtype, resident, clip, prefetch, FY_PLAN_GRAD_SLOTS_MIN,
                        ckpt_slots, swap, regions, &n);
        if (fy_pool_layout_size(regions, n) > cpu_mem)
            resident[u] = mark - 1;
        else
            count++;
    }
    return count;
}

unsigned fy_plan_resident(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                          uint64_t cpu_mem, int clip, unsigned prefetch, unsigned ckpt_slots,
                          const struct fy_plan_swap *swap, int weight_dtype,
                          unsigned char *resident)
{
    memset(resident, FY_PLAN_STREAMED, fy_gpt_unit_count(c));
    if (cpu_mem == 0)
        return 0;
    unsigned kept = plan_mark(c, B, T, act_dtype, cpu_mem, clip, prefetch, ckpt_slots, swap,
                              FY_PLAN_KEPT, resident);
    if (weight_dtype == FY_DTYPE_BF16)
        plan_mark(c, B, T, act_dtype, cpu_mem, clip, prefetch, ckpt_slots, swap,
                  FY_PLAN_KEPT_BF16, resident);
    return kept;
}

/* The final unit's gradient, kept between the passes of a clipped step, after the block slots. */
static uint64_t dfinal_bytes(const struct fy_gpt_config *c)
{
    return align4k(fy_gpt_unit_params(c, c->n_layer + 1) * 4);
}

static uint64_t block_slot_bytes(const struct fy_gpt_config *c)
{
    return align4k(fy_gpt_unit_params(c, 1) * 4);
}

unsigned fy_plan_grad_slots(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                            uint64_t cpu_mem, int clip, unsigned prefetch, unsigned ckpt_slots,
                            const struct fy_plan_swap *swap, const unsigned char *resident,
                            unsigned wanted)
{
    unsigned units = fy_gpt_unit_count(c), slots = FY_PLAN_GRAD_SLOTS_MIN;
    for (unsigned u = 0; u < units; u++)
        if (!resident[u])
            return slots; /* streamed blocks are paced by their two state slots anyway */
    unsigned most = c->n_layer < FY_PLAN_GRAD_SLOTS_MAX ? c->n_layer : FY_PLAN_GRAD_SLOTS_MAX;
    most = wanted < most ? wanted : most;
    for (unsigned more = slots + 1; more <= most; more++) {
        struct fy_pool_region_spec regions[10];
        unsigned n;
        fy_plan_regions(c, B, T, act_dtype, resident, clip, prefetch, more, ckpt_slots, swap,
                        regions, &n);
        if (fy_pool_layout_size(regions, n) > cpu_mem)
            break;
        slots = more;
    }
    return slots;
}

void fy_plan_regions(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                     const unsigned char *resident, int clip, unsigned prefetch,
                     unsigned grad_slots, unsigned ckpt_slots, const struct fy_plan_swap *swap,
                     struct fy_pool_region_spec out[10], unsigned *n)
{
    uint64_t act = align4k(fy_plan_act_bytes(c, B, T, act_dtype));
    uint64_t tok = align4k((uint64_t)B * T * 4);
    uint64_t slot = max_grad_bytes(c);
    unsigned i = 0;
    out[i++] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    out[i++] = (struct fy_pool_region_spec){"tokens", 2 * tok + embed_rows_bytes(c)};
    /* the checkpoints x_0..x_L, or the slots they take in turn on their way to the store; two
     * activation gradients (with the store a third: clipping's pass 1 can no longer borrow x_L's
     * room) */
    out[i++] = (struct fy_pool_region_spec){"acts", (ckpt_slots ? ckpt_slots : c->n_layer + 1) * act};
    out[i++] = (struct fy_pool_region_spec){"dacts", (ckpt_slots ? 3 : 2) * act};
    /* weights: slot 0 keeps the embeddings for the tied head, the blocks and the final unit take
     * the other prefetch + 1 in turn, so the next units' weights arrive while one computes; grads:
     * slot 0 holds the embedding gradient through the backward, the blocks take grad_slots
     * block-sized slots in turn so the gpu can run grad_slots - 1 blocks ahead of the optimizer,
     * and with clipping the final unit's gradient after them (it must outlive pass 1, whose blocks
     * use slots 1 and 2); state: two units' whole state (common/optstate.h) so one is updated
     * while the next is read */
    if (prefetch < 1 || prefetch > FY_PLAN_PREFETCH_MAX)
        prefetch = 1; /* the option parser refuses these; the layout stays sane anyway */
    if (grad_slots < FY_PLAN_GRAD_SLOTS_MIN || grad_slots > FY_PLAN_GRAD_SLOTS_MAX)
        grad_slots = FY_PLAN_GRAD_SLOTS_MIN;
    out[i++] = (struct fy_pool_region_spec){"weights",
                                            (2 + prefetch) * fy_optstate_max_master_bytes(c)};
    out[i++] = (struct fy_pool_region_spec){
        "grads", slot + grad_slots * block_slot_bytes(c) + (clip ? dfinal_bytes(c) : 0)};
    out[i++] = (struct fy_pool_region_spec){"state", 2 * fy_optstate_max_bytes(c)};
    uint64_t kept = fy_plan_resident_bytes(c, resident);
    if (kept > 0) /* optimizer state that stays in the pool across steps */
        out[i++] = (struct fy_pool_region_spec){"resident", kept};
    if (fy_plan_swap_pool_bytes(swap) > 0) /* the blocks' swapped internals */
        out[i++] = (struct fy_pool_region_spec){"saved", fy_plan_swap_pool_bytes(swap)};
    *n = i;
}

int fy_plan_layout_read(const struct fy_pool *p, const struct fy_gpt_config *c, int B, int T,
                        int act_dtype, int clip, struct fy_plan_layout *l)
{
    uint64_t bytes;
    memset(l, 0, sizeof *l);
    l->c = c;
    l->B = B;
    l->T = T;
    l->act_dtype = act_dtype;
    l->act_bytes = fy_plan_act_bytes(c, B, T, act_dtype);
    l->tok_bytes = (uint64_t)B * T * 4;
    l->slot_bytes = max_grad_bytes(c);
    l->wslot_bytes = fy_optstate_max_master_bytes(c);
    l->state_slot_bytes = fy_optstate_max_bytes(c);
    FY_TRY(fy_pool_region(p, "meta", &l->meta, &bytes));
    FY_TRY(fy_pool_region(p, "tokens", &l->tokens, &bytes));
    l->targets = l->tokens + align4k(l->tok_bytes);
    l->embed_rows = l->tokens + 2 * align4k(l->tok_bytes);
    FY_REQUIRE(bytes >= 2 * align4k(l->tok_bytes) + embed_rows_bytes(c), -EINVAL,
               "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "acts", &l->acts, &bytes));
    l->act_slots = (unsigned)(bytes / align4k(l->act_bytes));
    FY_REQUIRE(l->act_slots >= 1, -EINVAL, "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "dacts", &l->dacts, &bytes));
    l->dact_slots = (unsigned)(bytes / align4k(l->act_bytes));
    FY_TRY(fy_pool_region(p, "weights", &l->weights, &bytes));
    /* slot 0 for the embeddings, then the prefetch depth + 1 that the units take in turn */
    l->wslots = (unsigned)(bytes / l->wslot_bytes) - 1;
    FY_REQUIRE(bytes / l->wslot_bytes >= 3 && l->wslots <= FY_PLAN_PREFETCH_MAX + 1, -EINVAL,
               "shared pool: a weights region of %llu bytes is not 3 to %d unit slots",
               (unsigned long long)bytes, FY_PLAN_PREFETCH_MAX + 2);
    FY_TRY(fy_pool_region(p, "grads", &l->grads, &l->grads_bytes));
    /* the block slots, less clipping's final-unit gradient after them (which can be larger than
     * a block's: a Llama's untied head) */
    l->bslot_bytes = block_slot_bytes(c);
    l->dfinal_bytes = dfinal_bytes(c);
    uint64_t fixed = l->slot_bytes + (clip ? l->dfinal_bytes : 0);
    uint64_t gslots = l->grads_bytes >= fixed ? (l->grads_bytes - fixed) / l->bslot_bytes : 0;
    FY_REQUIRE(gslots >= FY_PLAN_GRAD_SLOTS_MIN && gslots <= FY_PLAN_GRAD_SLOTS_MAX, -EINVAL,
               "shared pool: a grads region of %llu bytes does not hold %d to %d block gradients",
               (unsigned long long)l->grads_bytes, FY_PLAN_GRAD_SLOTS_MIN, FY_PLAN_GRAD_SLOTS_MAX);
    l->gslots = (unsigned)gslots;
    FY_TRY(fy_pool_region(p, "state", &l->state, &bytes));
    FY_REQUIRE(bytes >= 2 * l->state_slot_bytes, -EINVAL,
               "shared pool: a state region of %llu bytes does not hold two units' state",
               (unsigned long long)bytes);
    return 0;
}

int fy_plan_resident_offsets(const struct fy_pool *p, const struct fy_gpt_config *c,
                             const unsigned char *resident, uint64_t *offsets, uint64_t *copies)
{
    unsigned units = fy_gpt_unit_count(c);
    memset(offsets, 0, units * sizeof *offsets);
    memset(copies, 0, units * sizeof *copies);
    if (fy_plan_resident_bytes(c, resident) == 0)
        return 0;
    uint64_t start, bytes, at;
    FY_TRY(fy_pool_region(p, "resident", &start, &bytes));
    at = start;
    for (unsigned u = 0; u < units; u++)
        if (resident[u]) {
            offsets[u] = at;
            at += fy_optstate_bytes(c, u);
            if (resident[u] == FY_PLAN_KEPT_BF16) {
                copies[u] = at;
                at += fy_optstate_copy_bytes(c, u);
            }
        }
    FY_REQUIRE(at - start <= bytes, -EINVAL,
               "shared pool: a resident region of %llu bytes does not hold the plan's %llu (made "
               "by fy_plan_regions for another plan?)", (unsigned long long)bytes,
               (unsigned long long)(at - start));
    return 0;
}

int fy_plan_rates_load(const char *path, struct fy_plan_rates *out)
{
    FILE *f = fopen(path, "r");
    FY_SYS(f == NULL ? -1 : 0, "cannot open the machine profile %s", path);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *root = cJSON_Parse(buf);
    FY_REQUIRE(root != NULL && cJSON_IsObject(root), -EINVAL,
               "%s: not a JSON object (a machine profile has gpu_flops, h2d, d2h, ssd_read, "
               "ssd_write and opt_params)", path);
    static const char *const keys[] = {"gpu_flops", "h2d", "d2h", "ssd_read", "ssd_write",
                                       "opt_params"};
    double *fields[] = {&out->gpu_flops, &out->h2d, &out->d2h, &out->ssd_read, &out->ssd_write,
                        &out->opt_params};
    int rc = 0;
    for (int i = 0; i < 6 && rc == 0; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
            fy_error("%s: \"%s\" must be a positive number (its rate: FLOP/s, bytes/s or "
                     "parameters/s)", path, keys[i]);
            rc = -EINVAL;
        } else {
            *fields[i] = v->valuedouble;
        }
    }
    cJSON_Delete(root);
    return rc;
}
