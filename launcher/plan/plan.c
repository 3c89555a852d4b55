/* The planner of a training run (launcher/plan/plan.h). */
#include "launcher/plan/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/ckpt.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/knobs.h"
#include "common/log.h"
#include "common/optstate.h"
#include "gpu_worker/backend.h"

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
    FILE *f = fopen(path, "r");
    FY_SYS(f == NULL ? -1 : 0, "cannot open the machine profile %s", path);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
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

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

int fy_plan_ranks(const struct fy_plan_shape *s) { return s->ranks > 1 ? s->ranks : 1; }

int fy_plan_rank_batch(const struct fy_plan_shape *s) { return s->B / fy_plan_ranks(s); }

uint64_t fy_plan_act_bytes(const struct fy_model_config *c, int B, int T, int act_dtype)
{
    return (uint64_t)B * T * c->n_embd * fy_dtype_size(act_dtype);
}

uint64_t fy_plan_embed_rows(const struct fy_model_config *c)
{
    return fy_model_unit_params(c, 0) / c->n_embd;
}

/* Two lists of the embeddings' rows (int32): those the batch's tokens do not touch, whose
 * gradient is final after the head, and the others (launcher/step/train.c, embed_update_early). */
static uint64_t embed_rows_bytes(const struct fy_model_config *c)
{
    return align4k(2 * fy_plan_embed_rows(c) * 4);
}

/* The embeddings' f32 gradient, 4 KiB padded: grads slot 0, which holds it from the head to the
 * embedding backward. */
static uint64_t embed_grad_bytes(const struct fy_model_config *c)
{
    return align4k(fy_model_unit_params(c, 0) * 4);
}

/* The final unit's gradient: from grads slot 1 on, where the head writes it and its update reads
 * it before any block's gradient comes (it can be larger than a block's: a Llama's untied head);
 * with clipping after the block slots, kept between the passes of a clipped step. */
static uint64_t dfinal_bytes(const struct fy_model_config *c)
{
    return align4k(fy_model_unit_params(c, c->n_layer + 1) * 4);
}

static uint64_t block_slot_bytes(const struct fy_model_config *c)
{
    return align4k(fy_model_unit_params(c, 1) * 4);
}

unsigned fy_plan_act_ahead(unsigned asked) { return asked ? asked : FY_PLAN_ACT_AHEAD_DEFAULT; }

unsigned fy_plan_spill_slots(unsigned act_ahead) { return fy_plan_act_ahead(act_ahead) + 2; }

uint64_t fy_plan_spill_extent_bytes(uint64_t item_bytes, unsigned count)
{
    return fy_scratch_bytes((uint64_t)(count ? count : 1) * item_bytes);
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
    return swap->host_bytes + swap->slots * swap->slot_bytes;
}

uint64_t fy_plan_swap_store_bytes(const struct fy_plan_swap *swap, unsigned n_layer)
{
    return swap->ssd_bytes ? fy_plan_spill_extent_bytes(swap->slot_bytes, n_layer) : 0;
}

uint64_t fy_plan_block_inputs_store_bytes(const struct fy_plan_shape *s)
{
    uint64_t act = align4k(fy_plan_act_bytes(s->c, s->B, s->T, s->act_dtype));
    return fy_plan_spill_extent_bytes(act, s->c->n_layer);
}

uint64_t fy_plan_upload_bytes(const struct fy_model_config *c, int weight_dtype, unsigned u)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(c, u, &lay);
    if (weight_dtype == FY_DTYPE_BF16)
        return lay.params * fy_dtype_size(FY_OPTSTATE_COPY_DTYPE);
    return lay.section[FY_OPTSTATE_MASTER].bytes;
}

int fy_plan_converts(const struct fy_plan_shape *s, const unsigned char *resident, unsigned u)
{
    if (s->weight_dtype != FY_DTYPE_BF16)
        return s->weight_dtype == FY_DTYPE_F32 && fy_optstate_piece_count(s->c, u) > 1;
    return resident == NULL || resident[u] != FY_PLAN_KEPT_BF16;
}

uint64_t fy_plan_convert_param_bytes(const struct fy_plan_shape *s)
{
    return s->weight_dtype == FY_DTYPE_BF16 ? FY_PLAN_CONVERT_PARAM_BYTES : 8;
}

/* Backward passes through the blocks and the embeddings: two with two-pass clipping. */
static uint64_t backward_passes(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    return s->clip && !p->grad_hold ? 2 : 1;
}

uint64_t fy_plan_convert_params(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    const struct fy_model_config *c = s->c;
    uint64_t params = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_plan_converts(s, p->resident, u))
            params += fy_model_unit_params(c, u) *
                      (1 + (fy_model_unit_kind(c, u) == FY_UNIT_BLOCK ? backward_passes(s, p) : 0));
    return params;
}

uint64_t fy_plan_land_chunk(const struct fy_model_config *c)
{
    uint64_t most = fy_optstate_max_master_bytes(c), asked = fy_knob_test_land_chunk();
    uint64_t cap = asked > 0 ? asked : FY_PLAN_LAND_CHUNK;
    uint64_t share = align4k((most + FY_PLAN_LAND_SLOTS - 1) / FY_PLAN_LAND_SLOTS);
    return share < cap ? share : cap;
}

/* Unit u's weights as a weights slot holds them: its f32 master, or its bf16 weights (4 KiB
 * padded). */
static uint64_t unit_weights_bytes(const struct fy_model_config *c, int weight_dtype, unsigned u)
{
    if (weight_dtype == FY_DTYPE_BF16)
        return fy_optstate_copy_bytes(c, u);
    return align4k(fy_model_unit_params(c, u) * 4);
}

/* Weights slot 0, which holds the embeddings (from the forward's start until the tied head), and
 * the others, which the blocks and the final unit take in turn: the largest of those. */
static uint64_t wslot0_bytes(const struct fy_model_config *c, int weight_dtype)
{
    return unit_weights_bytes(c, weight_dtype, 0);
}

static uint64_t wslot_bytes(const struct fy_model_config *c, int weight_dtype)
{
    uint64_t most = 0;
    for (unsigned u = 1; u < fy_model_unit_count(c); u++)
        if (unit_weights_bytes(c, weight_dtype, u) > most)
            most = unit_weights_bytes(c, weight_dtype, u);
    return most;
}

/* Whether a streamed unit's master comes through the landing ring (resident NULL: every unit
 * streams): one whose weights the opt worker converts (fy_plan_converts). */
static int any_landing(const struct fy_plan_shape *s, const unsigned char *resident)
{
    for (unsigned u = 0; u < fy_model_unit_count(s->c); u++)
        if ((resident == NULL || !resident[u]) && fy_plan_converts(s, resident, u))
            return 1;
    return 0;
}

/* A state slot: the largest unit's whole state, or with the state in pieces the largest piece's. */
static uint64_t state_slot_bytes(const struct fy_model_config *c, int pieces)
{
    return pieces ? fy_optstate_max_piece_bytes(c) : fy_optstate_max_bytes(c);
}

unsigned fy_plan_weight_copies(const struct fy_model_config *c, const unsigned char *resident)
{
    unsigned n = 0;
    for (unsigned u = 0; resident != NULL && u < fy_model_unit_count(c); u++)
        n += resident[u] == FY_PLAN_KEPT_BF16;
    return n;
}

uint64_t fy_plan_resident_bytes(const struct fy_model_config *c, const unsigned char *resident)
{
    uint64_t bytes = 0;
    for (unsigned u = 0; resident != NULL && u < fy_model_unit_count(c); u++)
        if (resident[u])
            bytes += fy_optstate_bytes(c, u) +
                     (resident[u] == FY_PLAN_KEPT_BF16 ? fy_optstate_copy_bytes(c, u) : 0);
    return bytes;
}

/* ---- the pool's regions ---------------------------------------------------------------------- */

void fy_plan_regions(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     struct fy_pool_region_spec out[FY_PLAN_REGIONS_MAX], unsigned *n)
{
    const struct fy_model_config *c = s->c;
    uint64_t act = align4k(fy_plan_act_bytes(c, s->B, s->T, s->act_dtype));
    uint64_t tok = align4k((uint64_t)s->B * s->T * 4);
    unsigned i = 0, block_inputs_slots = p->block_inputs_slots;
    out[i++] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    /* inputs, targets, positions (each [B][T] int32), then the embeddings' row lists */
    out[i++] = (struct fy_pool_region_spec){"tokens", 3 * tok + embed_rows_bytes(c)};
    /* the checkpoints x_0..x_L, or the slots they take in turn on their way to the store; two
     * activation gradients (with the store a third: clipping's pass 1 can no longer borrow x_L's
     * room) */
    out[i++] = (struct fy_pool_region_spec){
        "acts", (block_inputs_slots ? block_inputs_slots : c->n_layer + 1) * act};
    out[i++] = (struct fy_pool_region_spec){"dacts", (block_inputs_slots ? 3 : 2) * act};
    /* weights: slot 0 keeps the embeddings for the tied head, the blocks and the final unit take
     * the other prefetch + 1 in turn, so the next units' weights arrive while one computes; grads:
     * slot 0 holds the embedding gradient through the backward, the blocks take grad_slots
     * block-sized slots in turn so the gpu can run grad_slots - 1 blocks ahead of the optimizer;
     * the final unit's gradient from slot 1 on (room for it where it is larger than the block
     * slots), and with clipping after them (it must outlive pass 1, whose blocks use slots 1 and
     * 2); state: two units' whole state, or two pieces' (common/optstate.h), so one is updated
     * while the next is read */
    unsigned prefetch = p->prefetch, grad_slots = p->grad_slots;
    if (prefetch < 1 || prefetch > FY_PLAN_PREFETCH_MAX)
        prefetch = 1; /* the option parser refuses these; the layout stays sane anyway */
    if (grad_slots < FY_PLAN_GRAD_SLOTS_MIN || grad_slots > FY_PLAN_GRAD_SLOTS_MAX)
        grad_slots = FY_PLAN_GRAD_SLOTS_FLOOR;
    out[i++] = (struct fy_pool_region_spec){"weights",
                                            wslot0_bytes(c, s->weight_dtype) +
                                                (1 + prefetch) * wslot_bytes(c, s->weight_dtype)};
    /* a streamed unit's master on its way from the store to the weights slots, chunk by chunk */
    if (any_landing(s, p->resident))
        out[i++] =
            (struct fy_pool_region_spec){"landing", FY_PLAN_LAND_SLOTS * fy_plan_land_chunk(c)};
    uint64_t blocks = grad_slots * block_slot_bytes(c), fin = dfinal_bytes(c);
    out[i++] = (struct fy_pool_region_spec){"grads", embed_grad_bytes(c) + (s->clip ? blocks + fin
                                                                            : blocks > fin ? blocks
                                                                                           : fin)};
    out[i++] = (struct fy_pool_region_spec){"state", 2 * state_slot_bytes(c, p->state_pieces)};
    if (s->clip && p->grad_hold == FY_HOLD_POOL) /* one-pass clipping's held block gradients */
        out[i++] = (struct fy_pool_region_spec){"gradhold", fy_plan_hold_bytes(c)};
    uint64_t kept = fy_plan_resident_bytes(c, p->resident);
    if (kept > 0) /* optimizer state that stays in the pool across steps */
        out[i++] = (struct fy_pool_region_spec){"resident", kept};
    if (s->ranks > 1) /* the gpu workers' rank-order reduction: a line each (fy_plan_layout) */
        out[i++] = (struct fy_pool_region_spec){"ranks", FY_PLAN_RANKS_BYTES};
    if (fy_plan_swap_pool_bytes(&p->swap) > 0) /* the blocks' swapped internals */
        out[i++] = (struct fy_pool_region_spec){"saved", fy_plan_swap_pool_bytes(&p->swap)};
    *n = i;
}

void fy_plan_unit_regions(const struct fy_model_config *c,
                          struct fy_pool_region_spec out[FY_PLAN_REGIONS_MAX], unsigned *n)
{
    /* a commit record, and two pieces' state that a unit moves through piece by piece */
    out[0] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    out[1] = (struct fy_pool_region_spec){"state", 2 * state_slot_bytes(c, 1)};
    *n = 2;
}

/* The pool that placement p takes for a step of shape s. */
static uint64_t pool_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n;
    fy_plan_regions(s, p, regions, &n);
    return fy_pool_layout_size(regions, n);
}

/* The state region: two units' whole state, or two pieces' (l->state_pieces, state_slot_bytes). */
static int layout_state(const struct fy_pool *p, const struct fy_model_config *c,
                        struct fy_plan_layout *l)
{
    uint64_t bytes;
    FY_TRY(fy_pool_region(p, "state", &l->state, &bytes));
    l->state_pieces = bytes < 2 * state_slot_bytes(c, 0);
    l->state_slot_bytes = state_slot_bytes(c, l->state_pieces);
    FY_REQUIRE(bytes >= 2 * l->state_slot_bytes, -EINVAL,
               "shared pool: a state region of %llu bytes does not hold two pieces' state",
               (unsigned long long)bytes);
    return 0;
}

int fy_plan_layout_read(const struct fy_pool *p, const struct fy_plan_shape *s,
                        struct fy_plan_layout *l)
{
    const struct fy_model_config *c = s->c;
    int B = s->B, T = s->T;
    uint64_t bytes;
    memset(l, 0, sizeof *l);
    l->c = c;
    l->B = B;
    l->T = T;
    l->act_dtype = s->act_dtype;
    l->act_bytes = fy_plan_act_bytes(c, B, T, s->act_dtype);
    l->tok_bytes = (uint64_t)B * T * 4;
    l->slot_bytes = embed_grad_bytes(c);
    l->weight_dtype = s->weight_dtype == FY_DTYPE_BF16 ? FY_DTYPE_BF16 : FY_DTYPE_F32;
    l->wslot0_bytes = wslot0_bytes(c, l->weight_dtype);
    l->wslot_bytes = wslot_bytes(c, l->weight_dtype);
    FY_TRY(fy_pool_region(p, "meta", &l->meta, &bytes));
    /* a session that moves units alone (weight_dtype 0: init, export) has the state slots alone
     * (fy_plan_unit_regions) */
    if (s->weight_dtype == 0)
        return layout_state(p, c, l);
    FY_TRY(fy_pool_region(p, "tokens", &l->tokens, &bytes));
    l->targets = l->tokens + align4k(l->tok_bytes);
    l->positions = l->tokens + 2 * align4k(l->tok_bytes);
    l->embed_rows = l->tokens + 3 * align4k(l->tok_bytes);
    FY_REQUIRE(bytes >= 3 * align4k(l->tok_bytes) + embed_rows_bytes(c), -EINVAL,
               "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "acts", &l->acts, &bytes));
    l->act_slots = (unsigned)(bytes / align4k(l->act_bytes));
    FY_REQUIRE(l->act_slots >= 1, -EINVAL, "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "dacts", &l->dacts, &bytes));
    l->dact_slots = (unsigned)(bytes / align4k(l->act_bytes));
    FY_TRY(fy_pool_region(p, "weights", &l->weights, &bytes));
    /* slot 0 for the embeddings, then the prefetch depth + 1 that the units take in turn */
    uint64_t others = bytes > l->wslot0_bytes ? (bytes - l->wslot0_bytes) / l->wslot_bytes : 0;
    l->wslots = (unsigned)others;
    FY_REQUIRE(others >= 2 && l->wslots <= FY_PLAN_PREFETCH_MAX + 1, -EINVAL,
               "shared pool: a weights region of %llu bytes is not 3 to %d unit slots of %s "
               "weights",
               (unsigned long long)bytes, FY_PLAN_PREFETCH_MAX + 2, fy_dtype_name(l->weight_dtype));
    if (fy_pool_has_region(p, "landing")) {
        FY_TRY(fy_pool_region(p, "landing", &l->land, &bytes));
        l->land_chunk = fy_plan_land_chunk(c);
        l->land_slots = (unsigned)(bytes / l->land_chunk);
        FY_REQUIRE(l->land_slots >= 2, -EINVAL,
                   "shared pool: a landing region of %llu bytes does not hold two chunks of %llu",
                   (unsigned long long)bytes, (unsigned long long)l->land_chunk);
    }
    FY_TRY(fy_pool_region(p, "grads", &l->grads, &l->grads_bytes));
    /* the block slots, less clipping's final-unit gradient after them (without clipping it lies
     * from slot 1 on, over the block slots and past them where it is the larger) */
    l->bslot_bytes = block_slot_bytes(c);
    l->dfinal_bytes = dfinal_bytes(c);
    uint64_t fixed = l->slot_bytes + (s->clip ? l->dfinal_bytes : 0);
    uint64_t gslots = l->grads_bytes >= fixed ? (l->grads_bytes - fixed) / l->bslot_bytes : 0;
    gslots = gslots > FY_PLAN_GRAD_SLOTS_MAX ? FY_PLAN_GRAD_SLOTS_MAX : gslots;
    FY_REQUIRE(gslots >= FY_PLAN_GRAD_SLOTS_MIN &&
                   (s->clip || l->grads_bytes >= l->slot_bytes + l->dfinal_bytes),
               -EINVAL,
               "shared pool: a grads region of %llu bytes does not hold %d to %d block gradients "
               "and the final unit's",
               (unsigned long long)l->grads_bytes, FY_PLAN_GRAD_SLOTS_MIN, FY_PLAN_GRAD_SLOTS_MAX);
    l->gslots = (unsigned)gslots;
    FY_TRY(layout_state(p, c, l));
    if (s->clip && fy_pool_has_region(p, "gradhold")) {
        FY_TRY(fy_pool_region(p, "gradhold", &l->hold, &bytes));
        FY_REQUIRE(bytes >= fy_plan_hold_bytes(c), -EINVAL,
                   "shared pool: a gradhold region of %llu bytes does not hold the %u blocks' "
                   "gradients",
                   (unsigned long long)bytes, c->n_layer);
    }
    return 0;
}

int fy_plan_resident_offsets(const struct fy_pool *p, const struct fy_model_config *c,
                             const unsigned char *resident, uint64_t *offsets, uint64_t *copies)
{
    unsigned units = fy_model_unit_count(c);
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
               "by fy_plan_regions for another plan?)",
               (unsigned long long)bytes, (unsigned long long)(at - start));
    return 0;
}

/* ---- traffic and prediction ------------------------------------------------------------------ */

uint64_t fy_plan_grad_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    const struct fy_model_config *c = s->c;
    uint64_t embed = fy_model_unit_params(c, 0) * 4, block = fy_model_unit_params(c, 1) * 4;
    uint64_t fin = fy_model_unit_params(c, c->n_layer + 1) * 4;
    uint64_t wte = (uint64_t)c->vocab * c->n_embd * 4;
    /* the head's (the final unit's and the tied embeddings') in the forward */
    return fin + wte + backward_passes(s, p) * (c->n_layer * block + embed);
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
    uint64_t passes = backward_passes(s, p);
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
        double adamw = (double)fy_model_unit_params(c, u) / rates->opt_params, ssd = 0;
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
    out->convert_s = (double)t.convert / (rates->opt_params * update_bytes);
    out->opt_s = params / rates->opt_params * (s->clip ? 1.0 + sumsq_share : 1.0) + out->convert_s;
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

/* ---- the plan -------------------------------------------------------------------------------- */

/* Marks units of p->resident from FY_PLAN_STREAMED (or _KEPT) up to `mark`, unit 0 first, while a
 * pool with the gradient slots the floor took (plan_floor) still fits cpu_mem; returns how many it
 * marked. */
static unsigned plan_mark(const struct fy_plan_in *in, struct fy_plan *p, unsigned char mark)
{
    unsigned count = 0;
    struct fy_plan_place least = p->place;
    for (unsigned u = 0; u < fy_model_unit_count(in->shape.c); u++) {
        if (p->resident[u] != mark - 1)
            continue;
        p->resident[u] = mark;
        if (pool_bytes(&in->shape, &least) > in->cpu_mem)
            p->resident[u] = mark - 1;
        else
            count++;
    }
    return count;
}

/* The floor's tries, in order: state slots of a unit's whole state with FY_PLAN_GRAD_SLOTS_FLOOR
 * gradient slots, then two; state slots of a piece with the floor's slots, two, and without
 * clipping one (its norm pass and held gradients take slots 1 and 2); never more slots than
 * --grad-slots. Try i's placement into p->place (0 where the test hook has the state in pieces
 * and the try is of whole units). */
static const struct {
    int pieces;
    unsigned slots;
} floor_tries[] = {
    {0, FY_PLAN_GRAD_SLOTS_FLOOR}, {0, 2}, {1, FY_PLAN_GRAD_SLOTS_FLOOR}, {1, 2}, {1, 1}};
#define FLOOR_TRIES (sizeof floor_tries / sizeof floor_tries[0])

static int floor_try(const struct fy_plan_in *in, unsigned i, struct fy_plan *p)
{
    if (fy_knob_test_state_pieces() && !floor_tries[i].pieces) /* pieces whatever the room */
        return 0;
    unsigned asked =
        in->grad_slots >= FY_PLAN_GRAD_SLOTS_MIN ? in->grad_slots : FY_PLAN_GRAD_SLOTS_FLOOR;
    unsigned least = in->shape.clip ? 2 : 1, slots = floor_tries[i].slots;
    slots = slots < asked ? slots : asked;
    /* whole units' state slots take two gradient slots at least (backward_blocks) */
    slots = slots < least ? least : slots < 2 && !floor_tries[i].pieces ? 2 : slots;
    p->place.state_pieces = floor_tries[i].pieces;
    p->place.grad_slots = slots;
    return 1;
}

/* Whether try i's streaming regions with nothing kept fit cpu_mem (none given: they do). */
static int floor_fits(const struct fy_plan_in *in, unsigned i, struct fy_plan *p)
{
    return floor_try(in, i, p) &&
           (in->cpu_mem == 0 || pool_bytes(&in->shape, &p->place) <= in->cpu_mem);
}

/* The streaming regions with nothing kept (p->resident all streamed): the first try that fits
 * cpu_mem, the last where none does (the plan then does not fit). */
static void plan_floor(const struct fy_plan_in *in, struct fy_plan *p)
{
    for (unsigned i = 0; i < FLOOR_TRIES; i++)
        if (floor_fits(in, i, p))
            return;
}

/* The kept units, unit 0 first, with the streaming regions of p->place; returns how many. */
static unsigned plan_keep(const struct fy_plan_in *in, struct fy_plan *p)
{
    memset(p->resident, FY_PLAN_STREAMED, fy_model_unit_count(in->shape.c));
    unsigned kept = plan_mark(in, p, FY_PLAN_KEPT);
    if (in->shape.weight_dtype == FY_DTYPE_BF16)
        plan_mark(in, p, FY_PLAN_KEPT_BF16);
    return kept;
}

/* The state's residency (fy_plan_make) with the checkpoints and swap of p->place: the streaming
 * regions (the state slots and the gradient slots), p->resident, and the units kept. Of the
 * floor's tries that fit cpu_mem, the one with which the units kept in the room it leaves give the
 * fastest predicted step, the first of those that tie (whole units' state slots, more gradient
 * slots): state slots of a piece and fewer gradient slots leave room for more state, which can
 * save more SSD time than a block's master read twice and the wait for the updates cost. */
static unsigned plan_resident(const struct fy_plan_in *in, struct fy_plan *p)
{
    unsigned units = fy_model_unit_count(in->shape.c);
    memset(p->resident, FY_PLAN_STREAMED, units);
    plan_floor(in, p);
    if (in->cpu_mem == 0 || in->floor_only)
        return 0;
    unsigned char *best = malloc(units);
    if (best == NULL) /* the floor's slots alone */
        return plan_keep(in, p);
    struct fy_plan_place chosen = p->place;
    unsigned kept = 0;
    double best_s = INFINITY;
    for (unsigned i = 0; i < FLOOR_TRIES; i++) {
        if (!floor_fits(in, i, p))
            continue;
        unsigned k = plan_keep(in, p);
        struct fy_plan_prediction pr;
        fy_plan_predict(&in->shape, &p->place, &in->rates, &pr);
        if (pr.step_s < best_s * (1 - 1e-9)) {
            best_s = pr.step_s;
            chosen = p->place;
            kept = k;
            memcpy(best, p->resident, units);
        }
    }
    if (best_s < INFINITY) {
        p->place = chosen;
        memcpy(p->resident, best, units);
    } else { /* the floor did not fit: nothing kept */
        plan_floor(in, p);
        memset(p->resident, FY_PLAN_STREAMED, units);
    }
    free(best);
    return kept;
}

/* --ckpt-place: where the blocks' input checkpoints go (p->place.block_inputs_slots). auto:
 * everything in the pool when it all fits, no SSD traffic at all; otherwise the pool is better spent on optimizer state: a
 * streamed unit moves 28 bytes over the SSD per 12 of state each step (weights read, state read
 * and written), a checkpoint 2 per byte. */
static void plan_checkpoints(const struct fy_plan_in *in, struct fy_plan *p)
{
    int ssd = in->block_inputs_place == FY_BLOCK_INPUTS_SSD;
    if (in->block_inputs_place == FY_BLOCK_INPUTS_AUTO) {
        p->place.block_inputs_slots = 0;
        unsigned all = plan_resident(in, p);
        ssd = in->cpu_mem != 0 && all < fy_model_unit_count(in->shape.c);
        if (in->say)
            fy_info("plan: checkpoints %s (--ckpt-place auto: %s)",
                    ssd ? "on the SSD store" : "in the shared pool",
                    ssd ? "the optimizer state does not all fit --cpu-mem beside them"
                        : "they fit beside all the optimizer state");
    }
    p->place.block_inputs_slots = ssd ? fy_plan_spill_slots(in->act_ahead) : 0;
}

/* The block gradient slots, up to in->grad_slots: more than the floor's (plan_floor) only when
 * every unit's state is resident (then the optimizer is what the gpu may wait for, and more slots
 * let it lag behind the backward instead, its updates going lowest unit first), as many as still
 * fit cpu_mem, at most one per block. */
static unsigned plan_grad_slots(const struct fy_plan_in *in, const struct fy_plan *p)
{
    const struct fy_model_config *c = in->shape.c;
    unsigned units = fy_model_unit_count(c), slots = p->place.grad_slots;
    for (unsigned u = 0; u < units; u++)
        if (!p->resident[u])
            return slots; /* streamed blocks are paced by their two state slots anyway */
    unsigned most = c->n_layer < FY_PLAN_GRAD_SLOTS_MAX ? c->n_layer : FY_PLAN_GRAD_SLOTS_MAX;
    most = in->grad_slots < most ? in->grad_slots : most;
    struct fy_plan_place more = p->place;
    for (more.grad_slots = slots + 1; more.grad_slots <= most; more.grad_slots++) {
        if (pool_bytes(&in->shape, &more) > in->cpu_mem)
            break;
        slots = more.grad_slots;
    }
    return slots;
}

uint64_t fy_plan_hold_bytes(const struct fy_model_config *c)
{
    return (uint64_t)c->n_layer * block_slot_bytes(c);
}

/* What the GPU arena takes (each GPU's, for its B / ranks sequences), where the backend's memory
 * is modelled (returns 1; 0 where it is not, or no backend is named): its working buffers, a
 * block's internals (a set), and what the plan needs: the working buffers, a set per call in
 * flight with every block's internals swapped (--act-plan host or ssd), and with `hold` one
 * pass's held gradients. */
static int gpu_bytes(const struct fy_plan_in *in, int hold, uint64_t *working, uint64_t *set,
                     uint64_t *need)
{
    const struct fy_plan_shape *s = &in->shape;
    *working = *set = *need = 0;
    if (in->backend == NULL ||
        !fy_backend_gpu_bytes(in->backend, s->c, fy_plan_rank_batch(s), s->T, working, set))
        return 0;
    int forced = in->act_mode == FY_ACTPLAN_HOST || in->act_mode == FY_ACTPLAN_SSD;
    *need =
        *working + (forced ? FY_BACKEND_QUEUE * *set : 0) + (hold ? fy_plan_hold_bytes(s->c) : 0);
    return 1;
}

/* Room in the GPU arena for one pass's held gradients beside what the plan needs there: within
 * the --gpu-mem given where the backend's memory is modelled (without one, the arena is sized to
 * the working buffers alone); the CPU backend holds them in the gpu worker's own memory. Never
 * with several gpu workers: gradients held on the GPUs are not summed across them. */
static int hold_fits_gpu(const struct fy_plan_in *in)
{
    uint64_t working, set, need;
    if (in->backend == NULL || fy_plan_ranks(&in->shape) > 1)
        return 0;
    if (!gpu_bytes(in, 1, &working, &set, &need))
        return 1;
    return in->gpu_mem > 0 && need <= in->gpu_mem;
}

/* --clip-mode one-pass with --clip-hold auto: the held gradients in the pool where it has room for
 * them beside the kept state, else in the GPU arena where it has room, else in the pool with fewer
 * units kept (refused where even that does not fit). */
static void one_pass_hold(const struct fy_plan_in *in, struct fy_plan *p)
{
    p->place.grad_hold = FY_HOLD_POOL;
    if (in->cpu_mem == 0 || pool_bytes(&in->shape, &p->place) <= in->cpu_mem)
        return;
    if (hold_fits_gpu(in)) {
        p->place.grad_hold = FY_HOLD_GPU;
        return;
    }
    p->kept = plan_resident(in, p);
}

/* With clipping and --clip-mode auto, one backward pass or two (p->place.grad_hold), where one
 * pass is predicted no slower than two: the gradients held in the pool where it has room for them
 * beside the kept state within --cpu-mem (--clip-hold auto or pool); else in the GPU arena where it
 * has room (auto or gpu); else, with --cpu-mem, in the pool in place of some kept units' state
 * where that is predicted faster than two passes keeping them (auto or pool). Without --cpu-mem,
 * not in the pool: 4 bytes a parameter of pinned memory (27 GiB at 7B) that no budget allowed.
 * One pass in the pool leaves the gradient slots unused but for the embeddings' and the final
 * unit's. What did not fit is kept for the plan to say (one_pass_pool_bytes, one_pass_gpu_short). */
static void plan_clip_mode(const struct fy_plan_in *in, struct fy_plan *p)
{
    if (!in->shape.clip || in->clip_mode == FY_CLIP_TWO_PASS)
        return;
    if (in->clip_mode == FY_CLIP_ONE_PASS) {
        if (in->clip_hold == FY_CLIP_HOLD_AUTO) /* the pool beside the kept state, the GPU, or the
                                                   pool before the kept state */
            one_pass_hold(in, p);
        return; /* pool or gpu: placed before the kept state */
    }
    struct fy_plan_place one = p->place;
    struct fy_plan_prediction once, twice;
    fy_plan_predict(&in->shape, &p->place, &in->rates, &twice);
    if (in->clip_hold != FY_CLIP_HOLD_GPU) {
        one.grad_hold = FY_HOLD_POOL;
        uint64_t bytes = pool_bytes(&in->shape, &one);
        if (in->cpu_mem != 0 && bytes <= in->cpu_mem) {
            fy_plan_predict(&in->shape, &one, &in->rates, &once);
            p->place.grad_hold = once.step_s <= twice.step_s ? FY_HOLD_POOL : FY_HOLD_NONE;
            return;
        }
        p->one_pass_pool_bytes = bytes;
    }
    if (in->clip_hold != FY_CLIP_HOLD_POOL) {
        one.grad_hold = FY_HOLD_GPU;
        if (hold_fits_gpu(in)) {
            fy_plan_predict(&in->shape, &one, &in->rates, &once);
            p->place.grad_hold = once.step_s <= twice.step_s ? FY_HOLD_GPU : FY_HOLD_NONE;
            p->one_pass_pool_bytes = 0;
            return;
        }
        p->one_pass_gpu_short = fy_plan_ranks(&in->shape) == 1; /* several: not a matter of room */
    }
    if (in->clip_hold == FY_CLIP_HOLD_GPU || in->cpu_mem == 0)
        return;
    /* no room beside the kept state: one pass with the held gradients planned first, fewer units
     * kept, where that is predicted faster than two passes with them all */
    unsigned units = fy_model_unit_count(in->shape.c), kept = p->kept;
    unsigned char *was = malloc(units);
    if (was == NULL) /* two passes, as planned */
        return;
    memcpy(was, p->resident, units);
    struct fy_plan_shape unclipped = in->shape;
    unclipped.clip = 0;
    struct fy_plan_prediction none;
    fy_plan_predict(&unclipped, &p->place, &in->rates, &none); /* with every unit kept that fits */
    p->place.grad_hold = FY_HOLD_POOL;
    unsigned fewer = plan_resident(in, p);
    fy_plan_predict(&in->shape, &p->place, &in->rates, &once);
    if (pool_bytes(&in->shape, &p->place) <= in->cpu_mem && once.step_s < twice.step_s) {
        p->kept = fewer;
        p->clip_kept_fewer = kept - fewer;
        p->two_pass_step_s = twice.step_s;
        p->unclipped_step_s = none.step_s;
        p->one_pass_pool_bytes = 0;
        p->one_pass_gpu_short = 0;
    } else {
        memcpy(p->resident, was, units);
        p->place.grad_hold = FY_HOLD_NONE;
    }
    free(was);
}

void fy_plan_weights_describe(const struct fy_plan_shape *s, const struct fy_plan *p, char *buf,
                              size_t len)
{
    if (s->weight_dtype != FY_DTYPE_BF16) {
        unsigned gathered = 0;
        for (unsigned u = 0; u < fy_model_unit_count(s->c); u++)
            gathered += fy_plan_converts(s, p->resident, u);
        char bytes[32];
        fy_format_size(p->traffic.convert, bytes, sizeof bytes);
        if (gathered == 0)
            snprintf(buf, len, "weights to the GPU in f32");
        else
            snprintf(buf, len,
                     "weights to the GPU in f32, those of the %u units in pieces copied "
                     "together from their pieces' masters by the opt worker for each use (%s of "
                     "host memory a step)",
                     gathered, bytes);
        return;
    }
    unsigned units = fy_model_unit_count(s->c), copies = p->weight_copies;
    char bytes[32], short_of[96] = "";
    fy_format_size(p->traffic.convert, bytes, sizeof bytes);
    if (copies < p->kept)
        snprintf(short_of, sizeof short_of, "; --cpu-mem holds no copy for %u of the %u kept units",
                 p->kept - copies, p->kept);
    snprintf(buf, len,
             "weights to the GPU in bf16 for all %u units: %u from a bf16 copy beside "
             "their kept state (rewritten by AdamW), %u converted from their f32 master by the opt "
             "worker for each use (%s of host memory a step)%s",
             units, copies, units - copies, bytes, short_of);
}

void fy_plan_state_describe(const struct fy_plan_in *in, const struct fy_plan *p, char *buf,
                            size_t len)
{
    const struct fy_model_config *c = in->shape.c;
    buf[0] = 0;
    size_t n = 0;
    if (p->place.state_pieces) {
        unsigned cut = 0;
        for (unsigned u = 0; u < fy_model_unit_count(c); u++)
            cut += fy_optstate_piece_count(c, u) > 1;
        struct fy_plan_place whole = p->place;
        whole.state_pieces = 0;
        struct fy_plan_traffic t;
        struct fy_plan_prediction pr;
        fy_plan_traffic(&in->shape, &whole, &t);
        fy_plan_predict(&in->shape, &whole, &in->rates, &pr);
        char piece[32], slot[32], unit[32], more[32];
        fy_format_size(c->state_piece, piece, sizeof piece);
        fy_format_size(state_slot_bytes(c, 1), slot, sizeof slot);
        fy_format_size(state_slot_bytes(c, 0), unit, sizeof unit);
        fy_format_size(p->traffic.ssd_read - t.ssd_read, more, sizeof more);
        n += (size_t)snprintf(buf, len,
                              "optimizer state in pieces (%u units cut in pieces of at "
                              "most %s, init --state-piece): two state slots of a piece, %s each, "
                              "where a unit's whole state, %s, %s; a streamed block's master is "
                              "read again for its backward and its state updated piece by piece "
                              "after it: %s more SSD reads a step, predicted %.4g s a step against "
                              "%.4g",
                              cut, c->state_piece ? piece : "(whole units)", slot, unit,
                              fy_knob_test_state_pieces() ? "would fit (test hook "
                                                            "FUYOU_TEST_STATE_PIECES)"
                                                          : "does not fit --cpu-mem",
                              more, p->predicted.step_s, pr.step_s);
    }
    if (p->place.grad_slots < FY_PLAN_GRAD_SLOTS_FLOOR && n < len) {
        struct fy_plan_place more = p->place;
        more.grad_slots = FY_PLAN_GRAD_SLOTS_FLOOR;
        struct fy_plan_prediction pr;
        fy_plan_predict(&in->shape, &more, &in->rates, &pr);
        char why[64];
        if (in->grad_slots >= FY_PLAN_GRAD_SLOTS_MIN && in->grad_slots < FY_PLAN_GRAD_SLOTS_FLOOR)
            snprintf(why, sizeof why, "--grad-slots %u", in->grad_slots);
        else
            snprintf(why, sizeof why, "%d where --cpu-mem has room", FY_PLAN_GRAD_SLOTS_FLOOR);
        snprintf(buf + n, len - n,
                 "%s%u block gradient slot%s (%s): each block's backward waits "
                 "for the update of the block %s; predicted %.4g s a step against %.4g",
                 n ? "; " : "", p->place.grad_slots, p->place.grad_slots == 1 ? "" : "s", why,
                 p->place.grad_slots == 1 ? "above" : "two up", p->predicted.step_s, pr.step_s);
    }
}

void fy_plan_clip_describe(const struct fy_plan_in *in, const struct fy_plan *p, char *buf,
                           size_t len)
{
    buf[0] = 0;
    if (!in->shape.clip)
        return;
    struct fy_plan_shape unclipped = in->shape;
    unclipped.clip = 0;
    struct fy_plan_place other = p->place;
    other.grad_hold = p->place.grad_hold                  ? FY_HOLD_NONE
                      : in->clip_hold == FY_CLIP_HOLD_GPU ? FY_HOLD_GPU
                                                          : FY_HOLD_POOL;
    struct fy_plan_prediction none, alt;
    fy_plan_predict(&unclipped, &p->place, &in->rates, &none);
    fy_plan_predict(&in->shape, &other, &in->rates, &alt);
    if (p->clip_kept_fewer > 0) /* against the unclipped plan, which keeps them */
        none.step_s = p->unclipped_step_s;
    char hold[32], need[32], cap[32], how[400];
    fy_format_size(fy_plan_hold_bytes(in->shape.c), hold, sizeof hold);
    const char *why = in->clip_mode == FY_CLIP_ONE_PASS   ? " (--clip-mode one-pass)"
                      : in->clip_mode == FY_CLIP_TWO_PASS ? " (--clip-mode two-pass)"
                                                          : "";
    if (p->place.grad_hold && p->clip_kept_fewer > 0)
        snprintf(how, sizeof how,
                 "one backward pass: the blocks' gradients (%s) held in the pool "
                 "in place of %u units' state, the updates after the backward, under the next "
                 "forward (two passes, every unit kept that fits: %.4g s)",
                 hold, p->clip_kept_fewer, p->two_pass_step_s);
    else if (p->place.grad_hold)
        snprintf(how, sizeof how,
                 "one backward pass%s: the blocks' gradients (%s) held in the "
                 "%s until the norm is known, the updates after the backward, under the next "
                 "forward (two passes: %.4g s)",
                 why, hold,
                 p->place.grad_hold == FY_HOLD_GPU ? "GPU arena (each sent to the pool for its "
                                                     "update)"
                                                   : "pool",
                 alt.step_s);
    else if (p->one_pass_pool_bytes > 0 || p->one_pass_gpu_short) {
        char pool[160] = "", gpu[160] = "";
        fy_format_size(p->one_pass_pool_bytes, need, sizeof need);
        fy_format_size(in->cpu_mem, cap, sizeof cap);
        if (p->one_pass_pool_bytes > 0)
            snprintf(pool, sizeof pool, ", a pool of %s, and %s%s", need,
                     in->cpu_mem ? "--cpu-mem is " : "no --cpu-mem allows it",
                     in->cpu_mem ? cap : "");
        if (p->one_pass_gpu_short) {
            fy_format_size(in->gpu_mem, cap, sizeof cap);
            snprintf(gpu, sizeof gpu,
                     "%s the GPU arena has no room for them beside its working "
                     "buffers (--gpu-mem %s)",
                     pool[0] ? ";" : ",", in->gpu_mem ? cap : "not given");
        }
        snprintf(how, sizeof how,
                 "two backward passes, the first for the norm alone: one pass "
                 "would hold the blocks' gradients (%s)%s%s",
                 hold, pool, gpu);
    } else
        snprintf(how, sizeof how,
                 "two backward passes%s, the first for the norm alone (one pass, "
                 "the updates after the backward: %.4g s)",
                 why, alt.step_s);
    double step = p->predicted.step_s;
    snprintf(buf, len,
             "clipping in %s; predicted %.4g s a step, %.4g s without clipping (%+.0f%%, "
             "%+.4g s a step); --clip-grad-norm %g (%s), 0 turns clipping off",
             how, step, none.step_s, none.step_s > 0 ? 100.0 * (step / none.step_s - 1) : 0.0,
             step - none.step_s, in->clip_max, in->clip_given ? "given" : "the default");
}

/* What the store takes: the state's copies, both commit records, and the scratch extents of the
 * internals and checkpoints placed there, as train makes them. */
static uint64_t store_bytes(const struct fy_plan_in *in, const struct fy_plan *p)
{
    const struct fy_model_config *c = in->shape.c;
    uint64_t state = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        state += fy_optstate_bytes(c, u);
    return state * in->state_copies + 2 * FY_COMMIT_RECORD_BYTES +
           fy_plan_swap_store_bytes(&p->place.swap, c->n_layer) +
           (p->place.block_inputs_slots ? fy_plan_block_inputs_store_bytes(&in->shape) : 0);
}

/* The GPU arena against --gpu-mem (gpu_bytes). */
static void plan_gpu(const struct fy_plan_in *in, struct fy_plan *p)
{
    int hold = in->shape.clip && p->place.grad_hold == FY_HOLD_GPU;
    p->gpu_modelled = gpu_bytes(in, hold, &p->gpu_working, &p->gpu_set, &p->gpu_need);
    p->fits_gpu = !p->gpu_modelled || in->gpu_mem == 0 || p->gpu_need <= in->gpu_mem;
}

/* What several gpu workers cannot do (yet): -FY_EUSAGE, said. */
static int check_ranks(const struct fy_plan_in *in)
{
    const struct fy_plan_shape *s = &in->shape;
    int ranks = fy_plan_ranks(s);
    if (ranks == 1)
        return 0;
    FY_USAGE(s->B % ranks == 0,
             "--gpus %d: the batch of %d sequences does not split evenly over "
             "%d GPUs (each computes B / N of every step): give a --batch that %d divides, such as "
             "%d",
             ranks, s->B, ranks, ranks, (s->B + ranks - 1) / ranks * ranks);
    FY_USAGE(!(s->clip && in->clip_hold == FY_CLIP_HOLD_GPU),
             "--clip-hold gpu with --gpus %d: "
             "gradients held on the GPUs are not summed across them (not supported): use "
             "--clip-hold auto or pool",
             ranks);
    FY_USAGE(in->act_mode != FY_ACTPLAN_HOST && in->act_mode != FY_ACTPLAN_SSD,
             "--act-plan %s with --gpus %d: swapping the blocks' internals is not supported with "
             "several GPUs yet: use --act-plan auto or recompute",
             fy_actplan_mode_name(in->act_mode), ranks);
    return 0;
}

int fy_plan_make(const struct fy_plan_in *in, const struct fy_plan_acts *acts, struct fy_plan *p)
{
    const struct fy_plan_shape *s = &in->shape;
    memset(p, 0, sizeof *p);
    FY_TRY(check_ranks(in));
    p->resident = calloc(fy_model_unit_count(s->c), 1);
    FY_REQUIRE(p->resident != NULL, -ENOMEM, "plan: out of memory");
    p->place.resident = p->resident;
    p->place.prefetch = in->prefetch;
    p->place.reduce =
        in->backend != NULL && strcmp(in->backend, "cuda") == 0 ? FY_REDUCE_NVLINK : FY_REDUCE_POOL;
    int forced = in->act_mode == FY_ACTPLAN_HOST || in->act_mode == FY_ACTPLAN_SSD;
    if (forced && acts != NULL) /* placed whatever the room; the residency plans around them */
        FY_TRY(acts->place(acts->ctx, in, p));
    /* --clip-mode one-pass with --clip-hold pool or gpu: the held gradients in the pool before
     * the kept state, which takes what is left, or on the GPU (auto: plan_clip_mode) */
    if (s->clip && in->clip_mode == FY_CLIP_ONE_PASS && in->clip_hold != FY_CLIP_HOLD_AUTO)
        p->place.grad_hold = in->clip_hold == FY_CLIP_HOLD_GPU ? FY_HOLD_GPU : FY_HOLD_POOL;
    plan_checkpoints(in, p);
    p->kept = plan_resident(in, p);
    plan_clip_mode(in, p);       /* before auto's activations, which take the room left */
    if (!forced && acts != NULL) /* in the room that the kept state and the streaming leave */
        FY_TRY(acts->place(acts->ctx, in, p));
    p->place.grad_slots = plan_grad_slots(in, p);
    p->weight_copies = fy_plan_weight_copies(s->c, p->resident);
    p->resident_bytes = fy_plan_resident_bytes(s->c, p->resident);
    fy_plan_regions(s, &p->place, p->regions, &p->n_regions);
    p->pool_bytes = fy_pool_layout_size(p->regions, p->n_regions);
    p->fits_cpu = in->cpu_mem == 0 || p->pool_bytes <= in->cpu_mem;
    p->store_bytes = store_bytes(in, p);
    plan_gpu(in, p);
    fy_plan_traffic(s, &p->place, &p->traffic);
    fy_plan_predict(s, &p->place, &in->rates, &p->predicted);
    return 0;
}

int fy_plan_check_gpu(const struct fy_plan_in *in, const struct fy_plan *p)
{
    const struct fy_plan_shape *s = &in->shape;
    uint64_t working, set, need;
    if (p != NULL) {
        working = p->gpu_working;
        need = p->gpu_need;
        if (p->fits_gpu)
            return 0;
    } else {
        if (in->gpu_mem == 0 || in->backend == NULL ||
            !fy_backend_gpu_bytes(in->backend, s->c, fy_plan_rank_batch(s), s->T, &working, &set))
            return 0;
        need = working;
        if (need <= in->gpu_mem)
            return 0;
    }
    char need_s[32], working_s[32], budget[32];
    fy_format_size(need, need_s, sizeof need_s);
    fy_format_size(working, working_s, sizeof working_s);
    fy_format_size(in->gpu_mem, budget, sizeof budget);
    fy_error("plan does not fit the GPU: batch %d x %d needs %s of GPU memory (the model's working "
             "buffers %s%s) but --gpu-mem is %s: raise --gpu-mem or lower the batch (fuyou-launch "
             "plan prints the largest batch that fits)",
             fy_plan_rank_batch(s), s->T, need_s, working_s,
             need > working ? ", with the swapped internals' sets or the held gradients" : "",
             budget);
    return -FY_EUSAGE;
}

void fy_plan_free(struct fy_plan *p)
{
    free(p->resident);
    p->resident = NULL;
    p->place.resident = NULL;
}
