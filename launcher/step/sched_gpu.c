/* The gpu worker's requests of a step's schedule: launcher/step/sched_gpu.h. */
#include "launcher/step/sched_gpu.h"

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "launcher/step/sched_weights.h"

struct fy_desc fy_sched_positions_part(const struct fy_plan_layout *l, int op, int layer)
{
    return fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->positions, l->tok_bytes, layer);
}

unsigned fy_sched_saved_parts(const struct fy_sched *r, unsigned b, int op, uint64_t ssd_off,
                              struct fy_desc *req, unsigned n)
{
    const unsigned mask[2] = {r->swap.host_mask[b], r->swap.ssd_mask[b]};
    const uint64_t off[2] = {r->swap.host_off[b], ssd_off};
    for (int i = 0; i < 2; i++)
        if (mask[i] != 0) {
            struct fy_actplan_region reg;
            fy_actplan_region_of(&r->swap.sizes, mask[i], &reg);
            req[n] = fy_desc_region(op, FY_KIND_SAVED, FY_DTYPE_NONE, off[i], reg.bytes, (int)b);
            req[n++].arg = mask[i];
        }
    return n;
}

/* In a backward pass, after block b's request: the checkpoints and the SSD-placed internals of
 * the next act_ahead blocks on their way into their slots, nearest first (each slot's previous
 * item belongs to a block whose backward is done or is the request before b's). */
static int backward_ahead(struct fy_sched *r, unsigned b)
{
    for (unsigned a = b - 1; a >= 1 && a + r->act_ahead >= b; a--) {
        FY_TRY(fy_spill_in(&r->block_inputs, a - 1, 0, NULL));
        if (r->swap.ssd_mask[a])
            FY_TRY(fy_spill_in(&r->swap.ring, a - 1, 0, NULL));
    }
    return 0;
}

int fy_sched_block_backward(struct fy_sched *r, unsigned b, uint64_t w_off, uint64_t dy,
                            uint64_t dx, uint64_t grad, int hold, struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    uint64_t x_off = 0, s_off = 0;
    FY_TRY(fy_spill_in(&r->block_inputs, b - 1, 1, &x_off));
    if (r->swap.ssd_mask[b])
        FY_TRY(fy_spill_in(&r->swap.ring, b - 1, 1, &s_off));
    int op = FY_OP_GPT_BLOCK_BWD;
    struct fy_desc req[FY_DESC_MAX_PARTS];
    req[0] = fy_sched_weights_region(r, op, b, w_off, (int)b);
    req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_off, l->act_bytes, (int)b);
    req[2] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dy, l->act_bytes, (int)b);
    req[3] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dx, l->act_bytes, (int)b);
    req[4] =
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, grad, fy_sched_grad_bytes(l, b), (int)b);
    req[4].arg = hold ? b : 0; /* and kept in the gpu worker's buffer b - 1 */
    req[5] = fy_sched_positions_part(l, op, (int)b);
    FY_TRY(fy_ticket_issue(&r->tk, FY_TICKET_GPU, req,
                           fy_sched_saved_parts(r, b, op, s_off, req, 6), t));
    fy_spill_used_by(&r->block_inputs, b - 1, t);
    if (r->swap.ssd_mask[b])
        fy_spill_used_by(&r->swap.ring, b - 1, t);
    return b >= 2 ? backward_ahead(r, b) : 0;
}

int fy_sched_embed_backward_issue(struct fy_sched *r, uint64_t dx0, struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    int op = FY_OP_GPT_EMBED_BWD;
    struct fy_desc req[4];
    req[0] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
    req[1] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dx0, l->act_bytes, 0);
    req[2] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, fy_sched_gslot(l, 0),
                            fy_sched_grad_bytes(l, 0), 0);
    req[3] = fy_sched_positions_part(l, op, 0);
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, 4, t);
}

int fy_sched_embed_backward(struct fy_sched *r, uint64_t dx0)
{
    struct fy_ticket t = {0};
    FY_TRY(fy_sched_embed_backward_issue(r, dx0, &t));
    return fy_ticket_wait(&r->tk, &t, NULL);
}

int fy_sched_grad_send(struct fy_sched *r, unsigned b, uint64_t grad, struct fy_ticket *t)
{
    struct fy_desc d = fy_desc_region(FY_OP_GPT_GRAD_SEND, FY_KIND_GRAD, FY_DTYPE_F32, grad,
                                      fy_sched_grad_bytes(&r->l, b), (int)b);
    d.arg = b; /* the gpu worker's buffer b - 1 */
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, &d, 1, t);
}

int fy_sched_embed_forward(struct fy_sched *r, uint64_t w_embed, uint64_t x_out,
                           struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    int op = FY_OP_GPT_EMBED_FWD;
    struct fy_desc req[4];
    req[0] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
    req[1] = fy_sched_weights_region(r, op, 0, w_embed, 0);
    req[2] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_out, l->act_bytes, 0);
    req[3] = fy_sched_positions_part(l, op, 0);
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, 4, t);
}

int fy_sched_block_forward(struct fy_sched *r, unsigned b, uint64_t w_off, uint64_t x_in,
                           uint64_t x_out, int train, uint64_t s_off, struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    int op = FY_OP_GPT_BLOCK_FWD;
    struct fy_desc req[FY_DESC_MAX_PARTS];
    req[0] = fy_sched_weights_region(r, op, b, w_off, (int)b);
    req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_in, l->act_bytes, (int)b);
    req[2] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_out, l->act_bytes, (int)b);
    req[3] = fy_sched_positions_part(l, op, (int)b);
    unsigned n = train ? fy_sched_saved_parts(r, b, op, s_off, req, 4) : 4;
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, n, t);
}

int fy_sched_head(struct fy_sched *r, uint64_t x_in, uint64_t w_fin, uint64_t w_embed, int train,
                  struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned fin = l->c->n_layer + 1;
    int op = FY_OP_GPT_HEAD, f = (int)fin;
    struct fy_desc req[7];
    req[0] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_in, l->act_bytes, f);
    req[1] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->targets, l->tok_bytes, f);
    req[2] = fy_sched_weights_region(r, op, fin, w_fin, f);
    req[3] = fy_sched_weights_region(r, op, 0, w_embed, f);
    req[4] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, fy_sched_dact(l, 0), l->act_bytes, f);
    req[5] =
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, r->dfinal, fy_sched_grad_bytes(l, fin), f);
    req[6] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, fy_sched_gslot(l, 0),
                            fy_sched_grad_bytes(l, 0), f);
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, train ? 7 : 4, t);
}
