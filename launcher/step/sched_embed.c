/* The embeddings' update of a step's schedule: launcher/step/sched_embed.h. */
#include "launcher/step/sched_embed.h"

#include <errno.h>
#include <string.h>

#include "common/base/check.h"
#include "launcher/step/sched_state.h"
#include "launcher/step/sched_update.h"

int fy_sched_embed_update_early(struct fy_sched *r, uint64_t step, double lr, uint64_t *late)
{
    const struct fy_plan_layout *l = &r->l;
    const struct fy_model_config *c = l->c;
    uint64_t rows = fy_plan_embed_rows(c), tokens = (uint64_t)l->B * l->T;
    const int32_t *tok = fy_pool_at(r->pool, l->tokens, l->tok_bytes);
    int32_t *early = fy_pool_at(r->pool, l->embed_rows, 2 * rows * 4), *rest = early + rows;
    FY_REQUIRE(tok != NULL && early != NULL, -ERANGE,
               "schedule error: the batch or the embeddings' row lists lie outside the pool");
    memset(r->embed.row_touched, 0, c->vocab);
    for (uint64_t i = 0; i < tokens; i++) {
        FY_REQUIRE(tok[i] >= 0 && (uint64_t)tok[i] < c->vocab, -EINVAL,
                   "train: token %d at %llu is outside the vocabulary of %llu", tok[i],
                   (unsigned long long)i, (unsigned long long)c->vocab);
        r->embed.row_touched[tok[i]] = 1;
    }
    uint64_t n_early = 0, n_rest = 0;
    for (uint64_t v = 0; v < rows; v++) {
        if (v < c->vocab && !r->embed.row_touched[v])
            early[n_early++] = (int32_t)v;
        else
            rest[n_rest++] = (int32_t)v; /* touched, or a position's row */
    }
    *late = n_rest;
    if (n_early == 0)
        return 0;
    struct fy_desc req[FY_OPTQ_PARTS_MAX];
    unsigned n = fy_sched_adamw_parts(r, 0, fy_sched_gslot(l, 0), r->resident[0], step, lr, 0.0,
                                      req); /* unclipped */
    req[n++] = fy_sched_rows_part(l, 0, l->embed_rows, n_early, step);
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, req, n, &r->embed.early);
}

int fy_sched_embed_split(const struct fy_sched *r)
{
    return r->embed.split && !r->clip.on && fy_sched_kept(r, 0);
}

int fy_sched_embed_update(struct fy_sched *r, uint64_t step, double lr, int split, uint64_t late)
{
    const struct fy_plan_layout *l = &r->l;
    if (!fy_sched_kept(r, 0))
        return fy_sched_update_unit(r, 0, fy_sched_gslot(l, 0), step, lr);
    /* updated in place: the next forward waits for it */
    struct fy_ticket none = {0};
    FY_TRY(fy_sched_state_read(r, 0, 0, &none));
    FY_TRY(fy_sched_enqueue(r, 0, 0, fy_sched_gslot(l, 0), step, lr));
    if (split)
        fy_optq_add_part(
            &r->opt, 0,
            fy_sched_rows_part(l, 0, l->embed_rows + fy_plan_embed_rows(l->c) * 4, late, step));
    return 0;
}
