/* Items a training step writes in the forward and reads in the backward (the blocks' input
 * checkpoints, the blocks' swapped internals), each item_bytes: kept in the pool at base +
 * i * item_bytes; or on the SSD store (byte i * item_bytes of a scratch extent), passing through
 * `slots` pool slots taken in turn (item i in slot i % slots, at base + slot * item_bytes):
 * written to the store once the gpu request that made it is done, read back ahead of each
 * backward pass. Per slot it keeps the item it holds, its transfer to or from the store in
 * flight, and the gpu request that used it last (within one schedule function, whose requests
 * are all done between: fy_spill_forget_users). */
#ifndef FY_SPILL_H
#define FY_SPILL_H

#include <stdint.h>

#include "launcher/plan/plan.h"
#include "launcher/step/ticket.h"

#define FY_SPILL_SLOTS_MAX (FY_PLAN_ACT_AHEAD_MAX + 2)

struct fy_spill {
    struct fy_tickets *tk;
    int on; /* on the store (else in the pool) */
    unsigned slots;
    uint64_t base, item_bytes;
    uint32_t tensor;
    int holds[FY_SPILL_SLOTS_MAX];
    struct fy_ticket io[FY_SPILL_SLOTS_MAX];
    struct fy_ticket *user[FY_SPILL_SLOTS_MAX];
};

/* Items kept in the pool from pool offset base. */
void fy_spill_in_pool(struct fy_spill *sp, struct fy_tickets *tk, uint64_t base,
                      uint64_t item_bytes);
/* Puts `count` items on the store, through `slots` slots (3 to FY_SPILL_SLOTS_MAX) from pool
 * offset base: the extent of the smallest size class k (fy_scratch_class) that holds them, id
 * first_tensor + k, made by the first run of that class and found by the next. `what` names the
 * items in messages. */
int fy_spill_setup(struct fy_spill *sp, struct fy_tickets *tk, uint64_t base, uint64_t item_bytes,
                   unsigned slots, unsigned count, uint32_t first_tensor, const char *what);
/* Where the gpu writes item i (its slot, once free: the gpu request that used it last and its
 * transfer done). */
int fy_spill_out(struct fy_spill *sp, unsigned i, uint64_t *off);
/* Item i, once `producer` (the gpu request that wrote it) is done, to the store. */
int fy_spill_write(struct fy_spill *sp, unsigned i, struct fy_ticket *producer);
/* Item i in its slot for a gpu request to read: read back from the store unless the slot still
 * holds it; with `wait`, until it is there (off may then be given). A write of the slot to the
 * store may go on while the gpu reads it. */
int fy_spill_in(struct fy_spill *sp, unsigned i, int wait, uint64_t *off);
/* Gpu request t reads or writes item i's slot. */
void fy_spill_used_by(struct fy_spill *sp, unsigned i, struct fy_ticket *t);
/* The end of a schedule function: its gpu requests are all done, their tickets gone. */
void fy_spill_forget_users(struct fy_spill *sp);
/* Every transfer done (the end of the run). */
int fy_spill_drain(struct fy_spill *sp);

#endif
