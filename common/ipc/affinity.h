/* Where the gpu, io and opt workers run: the default placement on the topology
 * (common/ipc/topo.h) and the --affinity override. */
#ifndef FY_AFFINITY_H
#define FY_AFFINITY_H

struct fy_topo;

struct fy_affinity {
    char gpu[256];
    char io[256];
    char opt[256];
    int numa_node;   /* OS index of the node the shared pool should live on; -1 if unknown */
    int io_near_ssd; /* the default placed the io worker on the SSD's node, not the GPU's */
};

/* Placement on the allowed cores of the GPU's NUMA node (else the node of the first allowed core),
 * one PU per core (the first allowed one): gpu one core, io the next, opt the rest of the node.
 * When the store's disk is on another node (fy_topo_locate_ssd) with an allowed core and the
 * GPU's node has at least three, the io worker goes on that node's first allowed core instead and
 * opt takes every core of the GPU's node but the gpu worker's. With fewer than 3 allowed cores gpu
 * and io share the first core and opt gets all of them. */
int fy_affinity_default(const struct fy_topo *t, struct fy_affinity *out);
/* The default where the gpu worker computes on the CPU (the CPU backend): as fy_affinity_default,
 * and the gpu worker also on every core of the opt worker, which it shares with AdamW (mostly
 * running beside the backward); the io worker keeps its core. On 2 cores: gpu=0-1,io=0,opt=0-1. */
int fy_affinity_default_cpu_backend(const struct fy_topo *t, struct fy_affinity *out);
/* Applies "gpu=0,io=1,opt=2-15" on top of *inout; a token without '=' continues the previous
 * worker's list; unnamed workers keep their lists. Every cpu must exist and be allowed. Lists come
 * back normalized ("2,3,4-6" -> "2-6"); numa_node follows the opt worker's first cpu. On error
 * *inout is unchanged and -FY_EUSAGE (common/base/check.h: a usage error) is returned after one
 * line naming the token. */
int fy_affinity_parse(const struct fy_topo *t, const char *spec, struct fy_affinity *inout);

#endif
