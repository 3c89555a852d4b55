/* What a training step moves (over the SSD, PCIe, NVLink and host memory) and its predicted time
 * per resource at a machine's rates, for a step's shape and placement
 * (launcher/plan/plan_layout.h). */
#ifndef FY_PLAN_TRAFFIC_H
#define FY_PLAN_TRAFFIC_H

#include <stdint.h>

#include "launcher/plan/plan_layout.h"
#include "launcher/plan/plan_rates.h"

/* What a step moves. With several gpu workers (shape.ranks), to_gpu and from_gpu are the busiest
 * link's, rank 0's: every GPU is sent every unit's weights over its own PCIe link (not broadcast
 * over NVLink) and moves the activations of its B / ranks sequences, while the f32 gradients go
 * down rank 0's link alone where they are reduced over NVLink (FY_REDUCE_NVLINK: nvlink is what
 * each link of the ring carries, (ranks - 1) / ranks of them), and down every link where each
 * worker adds its own into the pool; host_mem counts every link's copies, and with
 * FY_REDUCE_POOL the ranks after the first reading the pool's sum before adding to it. With one
 * gpu worker nvlink and host_mem are 0.
 * SSD: the streamed units' master sections in the forward (a block's once more
 * with clipping, for the norm pass, except where one pass defers the block's update to the next
 * forward, which reads its whole state in place of its master), their whole state read once,
 * which also gives a block its weights in the backward, and written once (common/model/optstate.h); the
 * checkpoints x_0..x_{L-1} on the store written in the forward and read in each backward pass; the
 * blocks' SSD-placed internals likewise (at most: the last ones may still be in their slots).
 * PCIe, through the gpu worker's host interface: weights as fy_plan_upload_bytes, f32 gradients,
 * activations in the shape's dtype, with two-pass clipping the second backward pass too, the
 * swapped internals down in the forward and up in each backward pass, every input uploaded (at
 * most: the CUDA backend hands a unit's output to the next unit on the device when the two are in
 * flight together). With bf16 weights, the head's final unit and embeddings go up in bf16 too. */
struct fy_plan_traffic {
    uint64_t ssd_read, ssd_write;
    uint64_t to_gpu, from_gpu;
    uint64_t nvlink, host_mem;
    /* host memory the opt worker's conversions to bf16 read and write (fy_plan_convert_params x
     * FY_PLAN_CONVERT_PARAM_BYTES); in host_mem too with several gpu workers */
    uint64_t convert;
};
/* The f32 gradients a step's gpu workers produce (each rank's, and what is summed over them):
 * every unit's, the blocks' and the embeddings' once per backward pass. */
uint64_t fy_plan_grad_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p);
void fy_plan_traffic(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     struct fy_plan_traffic *out);

/* Predicted seconds per step of each resource and the largest (the bound) and its name. */
struct fy_plan_prediction {
    double gpu_s, h2d_s, d2h_s, ssd_s, opt_s, step_s;
    double convert_s; /* of opt_s, the conversions to bf16 */
    const char *bound;
    double nvlink_s, host_mem_s; /* with several gpu workers (0 with one) */
};
/* The GPU's compute from the model FLOPs (with clipping, the blocks' backward once more) at
 * gpu_flops, the traffic at its rates (SSD reads and writes share the disk), the opt worker's
 * AdamW over every parameter (with clipping, the sums of squares too) and its conversions to bf16:
 * the host-memory bytes they move at the rate AdamW moves its own, opt_params x
 * fy_optstate_update_param_bytes a second. With several gpu workers: each GPU's
 * compute of its B / ranks sequences, each link's PCIe (rank 0's, the busiest), the NVLink
 * reduce at rates->nvlink and every link's copies at rates->host_mem (each 0 where its rate is
 * 0). */
void fy_plan_predict(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     const struct fy_plan_rates *rates, struct fy_plan_prediction *out);
/* The blocks' updates one after another, as the backward waits for them with one gradient slot:
 * each block's the longer of its AdamW and, streamed, its state read and written. */
double fy_plan_block_updates_s(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                               const struct fy_plan_rates *rates);

#endif
