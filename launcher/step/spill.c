/* Checkpoints and swapped internals through pool slots to and from the store (launcher/step/spill.h). */
#include "launcher/step/spill.h"

#include <errno.h>
#include <string.h>

#include "common/base/check.h"
#include "common/formats/ckpt.h"
#include "common/base/dtype.h"
#include "common/base/log.h"

void fy_spill_in_pool(struct fy_spill *sp, struct fy_tickets *tk, uint64_t base,
                      uint64_t item_bytes)
{
    memset(sp, 0, sizeof *sp);
    sp->tk = tk;
    sp->base = base;
    sp->item_bytes = item_bytes;
}

static uint64_t slot_at(const struct fy_spill *sp, unsigned i)
{
    return sp->base + i * sp->item_bytes;
}

/* Slot k free for new contents: the gpu request that used it last and its transfer done. */
static int slot_free(struct fy_spill *sp, unsigned k)
{
    if (sp->user[k] != NULL) {
        struct fy_ticket *t = sp->user[k];
        sp->user[k] = NULL;
        FY_TRY(fy_ticket_wait(sp->tk, t, NULL));
    }
    return fy_ticket_wait(sp->tk, &sp->io[k], NULL);
}

static int transfer(struct fy_spill *sp, int op, unsigned i, unsigned k)
{
    struct fy_desc d =
        fy_desc_region(op, FY_KIND_RAW, FY_DTYPE_NONE, slot_at(sp, k), sp->item_bytes, -1);
    d.tensor = sp->tensor;
    d.arg = i * sp->item_bytes;
    return fy_ticket_issue(sp->tk, FY_TICKET_IO, &d, 1, &sp->io[k]);
}

int fy_spill_out(struct fy_spill *sp, unsigned i, uint64_t *off)
{
    if (!sp->on) {
        *off = slot_at(sp, i);
        return 0;
    }
    unsigned k = i % sp->slots;
    FY_TRY(slot_free(sp, k));
    sp->holds[k] = (int)i;
    *off = slot_at(sp, k);
    return 0;
}

int fy_spill_write(struct fy_spill *sp, unsigned i, struct fy_ticket *producer)
{
    if (!sp->on)
        return 0;
    FY_TRY(fy_ticket_wait(sp->tk, producer, NULL));
    return transfer(sp, FY_OP_IO_WRITE, i, i % sp->slots);
}

int fy_spill_in(struct fy_spill *sp, unsigned i, int wait, uint64_t *off)
{
    if (!sp->on) {
        if (off != NULL)
            *off = slot_at(sp, i);
        return 0;
    }
    unsigned k = i % sp->slots;
    if (sp->holds[k] != (int)i) {
        FY_TRY(slot_free(sp, k));
        sp->holds[k] = (int)i;
        FY_TRY(transfer(sp, FY_OP_IO_READ, i, k));
    }
    if (wait && sp->io[k].op == FY_OP_IO_READ)
        FY_TRY(fy_ticket_wait(sp->tk, &sp->io[k], NULL));
    if (off != NULL)
        *off = slot_at(sp, k);
    return 0;
}

void fy_spill_used_by(struct fy_spill *sp, unsigned i, struct fy_ticket *t)
{
    if (sp->on)
        sp->user[i % sp->slots] = t;
}

void fy_spill_forget_users(struct fy_spill *sp)
{
    for (unsigned k = 0; k < FY_SPILL_SLOTS_MAX; k++)
        sp->user[k] = NULL;
}

int fy_spill_drain(struct fy_spill *sp)
{
    int rc = 0;
    for (unsigned k = 0; k < FY_SPILL_SLOTS_MAX; k++) {
        int w = fy_ticket_wait(sp->tk, &sp->io[k], NULL);
        rc = rc ? rc : w;
    }
    return rc;
}

int fy_spill_setup(struct fy_spill *sp, struct fy_tickets *tk, uint64_t base, uint64_t item_bytes,
                   unsigned slots, unsigned count, uint32_t first_tensor, const char *what)
{
    memset(sp, 0, sizeof *sp);
    sp->tk = tk;
    FY_REQUIRE(slots >= 3 && slots <= FY_SPILL_SLOTS_MAX, -EINVAL,
               "train: %s through %u pool slots, not 3 to %d (--act-ahead 1 to %d)", what, slots,
               FY_SPILL_SLOTS_MAX, FY_PLAN_ACT_AHEAD_MAX);
    for (unsigned k = 0; k < FY_SPILL_SLOTS_MAX; k++)
        sp->holds[k] = -1;
    sp->on = 1;
    sp->slots = slots;
    sp->base = base;
    sp->item_bytes = item_bytes;
    uint64_t bytes = fy_plan_spill_extent_bytes(item_bytes, count);
    unsigned cls = fy_scratch_class(bytes);
    sp->tensor = first_tensor + cls;
    FY_TRY(fy_ticket_io(sp->tk, FY_OP_IO_ALLOC, sp->tensor, 0, 0, bytes));
    fy_info("%s spilled to the store through %u pool slots (%llu MiB of scratch, size class %u)",
            what, slots, (unsigned long long)(bytes >> 20), cls);
    return 0;
}
