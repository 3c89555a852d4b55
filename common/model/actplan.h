/* Activation placement for GPT training (issue 6): what each block's backward needs, what it costs
 * to keep, move or recompute each piece, a cost model that predicts the step time of a placement
 * from a profile, and the planner behind `--act-plan auto|recompute|host|ssd`. Pure computation:
 * no I/O except the JSON writer, no device; the launcher and workers are to use it.
 *
 * KINDS. A GPT-2 block computes, in order (gpu_worker/cpu/cpu_gpt2.c and the CUDA backend's GPT-2
 * units), with N = B*T rows:
 *
 *   op      output (kind)                                        bytes per layer
 *   -       x    block input, the checkpoint        FY_ACT_CKPT  N*C*e
 *   LN1     ln1 + mean1, rstd1                      FY_ACT_LN1   N*C*e + 2*N*4
 *   QKV     qkv = ln1 @ Wqkv                        FY_ACT_QKV   N*3C*e
 *   ATT     atty (before the projection) + lse      FY_ACT_ATTN  N*C*e + B*H*T*4
 *   PROJ    y1 = x + atty @ Wproj (the residual)    FY_ACT_RESID N*C*e
 *   LN2     ln2 + mean2, rstd2                      FY_ACT_LN2   N*C*e + 2*N*4
 *   FC      fc = ln2 @ Wfc (MLP up, pre-activation) FY_ACT_FC    N*4C*e
 *   GELU    g = gelu(fc)                            FY_ACT_GELU  N*4C*e
 *   DOWN    y = y1 + g @ Wdown                      (none: y is the next layer's checkpoint)
 *
 * e is the tensor element size (2 for bf16, 4 for the CPU backend's fp32); statistics (LayerNorm
 * mean and rstd per row, the attention's logsumexp per row and head) are fp32. The MLP-down output
 * is not a kind of its own: it is x of layer l+1 (the head's input for the last layer), placed as
 * that layer's checkpoint, and no backward op of layer l reads it.
 *
 * The backward reads x, ln1 (+stats), qkv, atty + lse, y1, ln2 (+stats), fc and g. Placements:
 * FY_ACT_GPU (kept in GPU memory until its backward), FY_ACT_HOST (GPU -> pinned host in forward,
 * prefetched back in backward), FY_ACT_SSD (on to the SSD in forward, SSD -> host -> GPU in
 * backward) and FY_ACT_RECOMPUTE. The checkpoint is never recomputed (recomputation starts from
 * it): GPU, HOST or SSD. The LayerNorm kinds are always recomputed (cheap per byte). QKV, ATTN,
 * RESID, FC and GELU are swappable: any of the four.
 *
 * RECOMPUTE MODEL. The backward of a layer runs the forward op of an output iff that output is
 * needed (read by a backward op, or an input of an op that runs) and not kept (placed anywhere but
 * RECOMPUTE); the op's inputs are then needed in turn (fy_actplan_recompute_s walks this). Every
 * intermediate of the chain is itself read by the backward, so an op runs exactly when its own
 * output is not kept: keeping kind k saves exactly the profiled time of the op producing k and
 * nothing else, and savings add up over kinds (the tests check this against the walk for every
 * subset). LN1 and LN2 always run. The MLP-down product is never rerun (its output is unused). With
 * the fused FC+GELU epilogue, keeping g but not fc reruns FC alone at its profiled time.
 *
 * COST MODEL (every number from struct fy_actplan_profile). A step is a forward phase and a backward
 * phase; each phase takes the largest of the times it puts on each resource (everything in a phase
 * is assumed overlapped), and the step is their sum. With A = activation bytes placed on HOST or
 * SSD (they cross PCIe once each way), S = bytes placed on SSD, R = recompute time of the placement,
 * and o = the other traffic of that phase (weights, gradients, optimizer state):
 *   forward:  gpu  = sum fwd_s + o.gpu_s
 *             d2h  = (A + o.d2h) / d2h_Bps           h2d = o.h2d / h2d_Bps
 *             pcie = (A + o.d2h + o.h2d) / duplex_Bps (both directions at once)
 *             ssd  = (S + o.ssd_write) / ssd_write_Bps + o.ssd_read / ssd_read_Bps (one disk)
 *             opt  = o.opt_s
 *             mem  = (A + S + o.mem) / mem_Bps
 *   backward: gpu  = sum bwd_s + o.gpu_s + R
 *             h2d  = (A + o.h2d) / h2d_Bps           d2h = o.d2h / d2h_Bps
 *             pcie = (A + o.h2d + o.d2h) / duplex_Bps
 *             ssd  = (S + o.ssd_read) / ssd_read_Bps + o.ssd_write / ssd_write_Bps
 *             opt  = o.opt_s
 *             mem  = (A + S + o.mem) / mem_Bps
 * mem is host memory, which every copy to or from the pool (PCIe and disk DMA alike) and the
 * optimizer's reads and writes share: a swapped byte crosses it once on its way out of the GPU and
 * once back, an SSD-placed byte once more each way (0 when mem_Bps is 0: not modelled). On the H200
 * machine AdamW ran 0.7 times its rate alone beside the backward's copies at batch 16, and this
 * term accounts for that (docs/benchmarks.md). GPU-kept bytes cost GPU memory only. It ignores
 * per-layer stalls (a prefetch arriving late in one layer and early in another average out) and the
 * fixed working set of the layers in flight (GPU staging, host slots of SSD-bound activations): the
 * caller passes budgets net of those.
 *
 * PLANNER (fy_actplan_new). Forced modes: "recompute" = checkpoints on the host (the pool, as the
 * current training schedule keeps them), everything else recomputed; "host" = checkpoints and every
 * swappable kind on the host; "ssd" = all of those on the SSD. Nothing goes to the GPU in a forced
 * mode. "auto": candidates are the swappable (layer, kind) pairs that save time, ranked by time
 * saved per byte (ties: layer, then kind); for each prefix k = 0..n of that ranking, the checkpoints
 * and the first k candidates are placed largest first (first-fit decreasing: fills the budgets
 * closer than the ranking's order), each on the GPU if it fits there, else the host, else the SSD,
 * the rest recomputed, and the prefix with the smallest predicted step is kept (a linear scan: the
 * prediction is convex in the bytes swapped, but the scan needs no assumption). Then moves of one
 * (layer, kind) to another placement, and exchanges of two items' placements, are applied while
 * they lower the prediction within the budgets. Between equal predictions (a phase bound by the
 * optimizer, say) the plan putting the least total work on all resources wins, so idle GPU memory
 * still spares recomputation. Budgets are never exceeded; when the forced plan
 * (or, in auto, the checkpoints alone) cannot be placed, -ENOSPC with one line giving the numbers.
 *
 * Bound on auto against the optimum of the same model (tested by brute force on 2 layers), with
 * unlimited SSD room: the fractional relaxation (items divisible) is solved by the ratio ranking
 * with the GPU, then the host filled to the byte; the scan's prefix just below its optimum lacks one
 * partial item (at most s_max more recompute) and loses less than one item per tier boundary to
 * packing (at most b_max more bytes off the GPU, 2*b_max more on the SSD); a phase's maximum grows
 * by at most the largest growth of its terms, so
 *   auto - optimum <= max(b_max/d2h, b_max/duplex, 2*b_max/ssd_write, 3*b_max/mem)
 *                   + max(s_max, b_max/h2d, b_max/duplex, 2*b_max/ssd_read, 3*b_max/mem)
 * (s_max: the largest saving, b_max: the largest item, checkpoints included).
 *
 * Errors: -EINVAL for a malformed profile or placement, -ENOSPC for a plan that does not fit,
 * -ENOMEM, -EIO writing JSON; each with one fy_error line. */
#ifndef FY_ACTPLAN_H
#define FY_ACTPLAN_H

#include <stdint.h>
#include <stdio.h>

#include "common/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

enum fy_actplan_kind {
    FY_ACT_CKPT = 0, /* block input x [N][C] */
    FY_ACT_LN1,      /* ln1 [N][C] + mean1, rstd1 [N] f32: always recomputed */
    FY_ACT_QKV,      /* qkv [N][3C] */
    FY_ACT_ATTN,     /* atty [N][C] + logsumexp [B][H][T] f32 */
    FY_ACT_RESID,    /* y1 [N][C], the residual after attention */
    FY_ACT_LN2,      /* ln2 [N][C] + mean2, rstd2 [N] f32: always recomputed */
    FY_ACT_FC,       /* fc [N][4C], MLP up before GELU */
    FY_ACT_GELU,     /* g [N][4C] */
    FY_ACT_KINDS
};

enum fy_actplan_place { FY_ACT_GPU = 0, FY_ACT_HOST, FY_ACT_SSD, FY_ACT_RECOMPUTE, FY_ACT_PLACES };

enum fy_actplan_mode { FY_ACTPLAN_AUTO = 0, FY_ACTPLAN_RECOMPUTE, FY_ACTPLAN_HOST, FY_ACTPLAN_SSD };

enum fy_actplan_res {
    FY_RES_GPU = 0, /* compute, recomputation included */
    FY_RES_H2D,
    FY_RES_D2H,
    FY_RES_PCIE, /* both directions together */
    FY_RES_SSD,  /* reads + writes, one disk */
    FY_RES_OPT,  /* the CPU optimizer */
    FY_RES_MEM,  /* host memory: the copies to and from the pool and the optimizer's traffic */
    FY_RES_COUNT
};

/* "ckpt", "ln1", "qkv", "attn", "resid", "ln2", "fc", "gelu". */
const char *fy_actplan_kind_name(int kind);
/* "gpu", "host", "ssd", "recompute". */
const char *fy_actplan_place_name(int place);
/* "auto", "recompute", "host", "ssd". */
const char *fy_actplan_mode_name(int mode);
/* "gpu", "h2d", "d2h", "pcie", "ssd", "opt". */
const char *fy_actplan_res_name(int res);
/* Parses an --act-plan value; -EINVAL (said) for anything else. */
int fy_actplan_mode_parse(const char *text, enum fy_actplan_mode *out);
/* 1 for QKV, ATTN, RESID, FC, GELU. */
int fy_actplan_kind_swappable(int kind);
/* Whether a kind may take a placement (CKPT: not RECOMPUTE; LN1, LN2: RECOMPUTE only). */
int fy_actplan_allowed(int kind, int place);

/* Bytes of each kind in one layer (every layer has the same). */
struct fy_actplan_sizes {
    uint64_t bytes[FY_ACT_KINDS];
};
/* From the model and batch; elem_bytes is 2 (bf16) or 4 (f32). -EINVAL (said) otherwise. */
int fy_actplan_sizes_gpt(const struct fy_model_config *c, int B, int T, int elem_bytes,
                         struct fy_actplan_sizes *out);
/* The sizes in a backend's own layout of the internals, which is what a block's saved region
 * holds: "cuda" computes in bf16 and its flash attention keeps a logsumexp [B][H][T] f32 (the
 * sizes above, elem_bytes 2); "cpu" computes in f32 and its attention keeps the softmax
 * probabilities [B][H][T][T] f32 instead. -EINVAL (said) for another backend or a bad shape. */
int fy_actplan_sizes_backend(const struct fy_model_config *c, int B, int T, const char *backend,
                             struct fy_actplan_sizes *out);

/* Sets of kinds as bit masks. */
#define FY_ACT_BIT(kind) (1u << (kind))
#define FY_ACT_SWAPPABLE                                                                           \
    (FY_ACT_BIT(FY_ACT_QKV) | FY_ACT_BIT(FY_ACT_ATTN) | FY_ACT_BIT(FY_ACT_RESID) |                \
     FY_ACT_BIT(FY_ACT_FC) | FY_ACT_BIT(FY_ACT_GELU))

/* A block's saved region: the swappable kinds of a mask, one after another in kind order, each at
 * a 4 KiB-aligned offset so the region moves to and from the SSD store with O_DIRECT as it is.
 * Within ATTN the attention output [N][C] comes first, its statistics right after. */
struct fy_actplan_region {
    uint64_t offset[FY_ACT_KINDS]; /* of each kind in the mask (others: 0) */
    uint64_t bytes;                /* the whole region, 4 KiB-aligned */
};
/* -EINVAL (said) for a mask with a kind that is not swappable. */
int fy_actplan_region_of(const struct fy_actplan_sizes *s, unsigned mask,
                         struct fy_actplan_region *out);
/* The swappable kinds that a placement array (place[layer * FY_ACT_KINDS + kind], as struct
 * fy_actplan's; NULL: none) puts at `where` in one layer (0-based), as a mask. */
unsigned fy_actplan_mask(const unsigned char *place, int layer, int where);

/* What a profiler run measures (seconds, bytes, bytes/s), plus the memory budgets. */
struct fy_actplan_layer_prof {
    double fwd_s;                     /* the block's forward */
    double bwd_s;                     /* its backward, recomputation not included */
    double recompute_s[FY_ACT_KINDS]; /* the forward op producing each kind (CKPT: unused) */
};
struct fy_actplan_other {   /* what the rest of a phase puts on the shared resources */
    uint64_t h2d, d2h;      /* PCIe bytes: weights up, gradients down */
    uint64_t ssd_read, ssd_write;
    double gpu_s;           /* compute outside the blocks: embeddings, head */
    double opt_s;           /* CPU optimizer time in this phase */
    uint64_t mem;           /* host memory bytes: the copies above (PCIe and SSD) and the
                               optimizer's reads and writes */
};
struct fy_actplan_profile {
    int n_layer;
    const struct fy_actplan_layer_prof *layer; /* [n_layer], the caller's */
    double h2d_Bps, d2h_Bps, duplex_Bps;       /* PCIe; duplex = both directions summed */
    double ssd_read_Bps, ssd_write_Bps;
    double mem_Bps;                            /* host memory; 0: not modelled */
    struct fy_actplan_other fwd, bwd;
    uint64_t gpu_bytes;  /* GPU memory for kept activations */
    uint64_t host_bytes; /* pinned pool for host-placed activations */
    uint64_t ssd_bytes;  /* SSD room for spilled activations (UINT64_MAX: no limit) */
};
/* -EINVAL (said) for a negative, NaN or infinite time, a bandwidth not > 0 (INFINITY is allowed),
 * no layers or a NULL layer table. */
int fy_actplan_profile_check(const struct fy_actplan_profile *p);

struct fy_actplan_phase {
    double res_s[FY_RES_COUNT];
    double s;  /* the largest */
    int bound; /* which */
};
struct fy_actplan_pred {
    struct fy_actplan_phase fwd, bwd;
    double step_s;
    double recompute_s;                /* R, all layers */
    uint64_t bytes[FY_ACT_PLACES];     /* activation bytes per placement, all layers */
};

/* Recompute time of one layer's backward when the kinds with kept[k] != 0 are available (the
 * dependency walk above; CKPT is always available whatever kept[CKPT] says). */
double fy_actplan_recompute_s(const struct fy_actplan_layer_prof *lp, const unsigned char *kept);

/* Predicts a placement: place[l * FY_ACT_KINDS + k] for every layer and kind. Budgets are not
 * checked here (fy_actplan_fits does). -EINVAL (said) for a placement a kind does not allow. */
int fy_actplan_predict(const struct fy_actplan_profile *p, const struct fy_actplan_sizes *s,
                       const unsigned char *place, struct fy_actplan_pred *out);
/* 1 when the bytes of pred fit the profile's GPU, host and SSD budgets. */
int fy_actplan_fits(const struct fy_actplan_profile *p, const struct fy_actplan_pred *pred);

struct fy_actplan {
    enum fy_actplan_mode mode;
    int n_layer;
    unsigned char *place; /* [n_layer][FY_ACT_KINDS] */
    struct fy_actplan_sizes sizes;
    struct fy_actplan_profile prof; /* a copy; prof.layer is NULL */
    struct fy_actplan_pred pred;
};
/* Plans for a mode (see PLANNER above). -EINVAL, -ENOSPC or -ENOMEM, said. */
int fy_actplan_new(struct fy_actplan **out, const struct fy_actplan_profile *p,
                   const struct fy_actplan_sizes *s, enum fy_actplan_mode mode);
void fy_actplan_destroy(struct fy_actplan **p);
static inline int fy_actplan_at(const struct fy_actplan *p, int layer, int kind)
{
    return p->place[layer * FY_ACT_KINDS + kind];
}

/* A few lines for people: bytes per placement, layers per placement of each kind, predicted phase
 * times and their bound resource. Truncates to len. */
void fy_actplan_describe(const struct fy_actplan *p, char *buf, size_t len);
/* The plan as a JSON object (mode, sizes, profile figures, prediction, placement per layer). */
int fy_actplan_write_json(const struct fy_actplan *p, FILE *f);

#ifdef __cplusplus
}
#endif

#endif
