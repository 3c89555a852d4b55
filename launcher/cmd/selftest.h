/* The data-path self-test: one optimizer round trip through all three workers, repeated for a few
 * steps. The io worker reads a state extent from the SSD store into the pool, the gpu worker places
 * gradients in a slot, the opt worker runs AdamW on them, the io worker writes the state back. Its
 * result on disk is checked by the integration tests against an in-process computation, and users
 * run it to check a machine (`fuyou-launch selftest`). */
#ifndef FY_SELFTEST_H
#define FY_SELFTEST_H

#include <stdint.h>

#include "common/pool.h"
#include "launcher/run/supervise.h"

#define FY_SELFTEST_TENSOR_STATE 1   /* extent: a unit's state layout (common/optstate.h) */
#define FY_SELFTEST_TENSOR_WEIGHTS 2 /* extent: bf16 weights after the last step */
#define FY_SELFTEST_INIT_SCALE 0.02f

struct fy_selftest_layout {
    uint64_t params;
    uint64_t m_offset; /* within the state extent; master is at 0 */
    uint64_t v_offset;
    uint64_t state_bytes;
    uint64_t grad_bytes;
    uint64_t weights_bytes;
};

struct fy_selftest_opts {
    uint64_t params;
    unsigned steps;
    uint64_t seed;
    int grad_dtype; /* FY_DTYPE_BF16 or FY_DTYPE_F32 */
    int timeout_ms; /* per request */
};

void fy_selftest_layout(uint64_t params, int grad_dtype, struct fy_selftest_layout *out);
/* The pool regions the self-test needs ("state", "grad" with two slots, "weights"). */
void fy_selftest_regions(const struct fy_selftest_layout *l, struct fy_pool_region_spec out[3]);
/* Initial master weights (GPT-style scale) and zero moments. */
void fy_selftest_init_state(uint64_t seed, uint64_t params, float *master, float *m, float *v);
int fy_selftest_run(struct fy_sup *s, struct fy_pool *pool, const struct fy_selftest_opts *o);

#endif
