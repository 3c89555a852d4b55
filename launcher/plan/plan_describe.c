/* A plan described for people: launcher/plan/plan_describe.h. */
#include "launcher/plan/plan_describe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "common/base/log.h"
#include "common/model/optstate.h"

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
        fy_format_size(fy_plan_state_slot_bytes(c, 1), slot, sizeof slot);
        fy_format_size(fy_plan_state_slot_bytes(c, 0), unit, sizeof unit);
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
