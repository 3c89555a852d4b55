/* Machine topology through hwloc: NUMA nodes, cores, the cpus this process may use, where the
 * GPU and the store's disk sit, and binding of processes, threads and memory. The workers'
 * placement is common/ipc/affinity.h. Cpu lists are OS PU indexes ("0", "2-15", "0,2,4-6":
 * common/ipc/cpulist.h). */
#ifndef FY_TOPO_H
#define FY_TOPO_H

#include <stddef.h>

#include "common/ipc/cpulist.h"

struct fy_topo;

/* Loads this machine's topology, I/O devices included, and looks for the GPU. The allowed cpus are
 * hwloc's allowed cpuset (cgroup) narrowed to the process's current binding (taskset). */
int fy_topo_load(struct fy_topo **out);
/* Loads a synthetic topology such as "numa:2 core:8 pu:1" (for tests: placement rules on shapes
 * this machine does not have). Binding calls refuse such a topology with -ENOTSUP. */
int fy_topo_load_synthetic(struct fy_topo **out, const char *desc);
void fy_topo_destroy(struct fy_topo **t); /* sets *t = NULL; safe on NULL */

unsigned fy_topo_numa_count(const struct fy_topo *t);
/* Allowed cores (a core with any allowed PU) and allowed PUs. */
unsigned fy_topo_core_count(const struct fy_topo *t);
unsigned fy_topo_pu_count(const struct fy_topo *t);
/* OS index of the GPU's NUMA node; -1 if unknown. */
int fy_topo_gpu_numa_node(const struct fy_topo *t);
/* The allowed cpus nearest the k-th NVIDIA GPU (its NUMA node's, as hwloc places it) as a list;
 * -ENOENT where hwloc does not see that GPU or it has no allowed cpu near it. */
int fy_topo_gpu_cpus(const struct fy_topo *t, int k, char *buf, size_t len);
/* Says where the GPU is when hwloc cannot see it (config entry); node is an OS index with allowed
 * cpus, or -1 to forget the GPU's locality. -EINVAL with a message otherwise. */
int fy_topo_set_gpu_numa_node(struct fy_topo *t, int node);
/* Finds the NUMA node of the disk under the first of the comma-separated store paths (its block
 * device through sysfs, then hwloc's block OS device of that name), for the io worker's placement,
 * and a description of every path's disk for fy_topo_describe. Unknown locality is not an error
 * (virtual disks, device-mapper, a synthetic topology): the node stays -1. */
int fy_topo_locate_ssd(struct fy_topo *t, const char *paths);
/* OS index of the store's disk's NUMA node; -1 if unknown. */
int fy_topo_ssd_numa_node(const struct fy_topo *t);
/* Says where the store's disk is (tests, configuration); -1 forgets it; -EINVAL with a message for
 * a node that does not exist or has no allowed cpus. */
int fy_topo_set_ssd_numa_node(struct fy_topo *t, int node);
/* Narrows the allowed cpus to those of cpulist as a cgroup would (config entry, tests). */
int fy_topo_restrict(struct fy_topo *t, const char *cpulist);
/* Allowed cpus as a list; -ERANGE if buf is too small. */
int fy_topo_allowed_cpus(const struct fy_topo *t, char *buf, size_t len);
/* 1 if cpu exists and is allowed, else 0. */
int fy_topo_cpu_allowed(const struct fy_topo *t, int cpu);
/* One paragraph for the log: NUMA nodes with cpus and memory, cores/PUs, allowed cpus, GPU locality
 * (or "GPU locality: not visible to hwloc"). Truncated to len. */
void fy_topo_describe(const struct fy_topo *t, char *buf, size_t len);

/* Binds every thread of the calling process to cpulist and writes the binding then in effect
 * (hwloc_get_cpubind) to actual, so the worker can log it. actual may be NULL. */
int fy_topo_bind_self(const struct fy_topo *t, const char *cpulist, char *actual,
                      size_t actual_len);
/* The calling process's current binding as a list (to restore it later with fy_topo_bind_self). */
int fy_topo_get_binding(const struct fy_topo *t, char *buf, size_t len);
/* Binds the calling thread to one cpu. */
int fy_topo_bind_thread(const struct fy_topo *t, int cpu);
/* Binds the pages of [addr, addr+len) to a NUMA node (OS index); addr must be page-aligned; call it
 * before the pages are first touched, as pages already there do not move. Containers often refuse
 * (-ENOSYS, -EPERM, -EXDEV): these are returned with only a debug line, for the caller to warn;
 * other failures log an error. */
int fy_topo_bind_memory(const struct fy_topo *t, void *addr, size_t len, int numa_node);

/* ---- for the placement (common/ipc/affinity.c): the topology as hwloc holds it ---- */
struct hwloc_topology; /* hwloc_topology_t */
struct hwloc_obj;      /* hwloc_obj_t */
struct hwloc_topology *fy_topo_hwloc(const struct fy_topo *t);
/* The cpus this process may use (fy_topo_allowed_cpus as a set). */
const struct hwloc_bitmap_s *fy_topo_allowed_set(const struct fy_topo *t);
/* The depth of cores in hwloc's tree (of PUs where hwloc reports no cores). */
int fy_topo_core_depth(const struct fy_topo *t);
/* The NUMA node of OS index os; NULL if none. */
struct hwloc_obj *fy_topo_numa_obj(const struct fy_topo *t, int os);
/* The first allowed PU of a core; -1 if none. */
int fy_topo_core_first_pu(const struct fy_topo *t, struct hwloc_obj *core);
/* The NUMA node (OS index) holding a cpu; -1 if none. */
int fy_topo_numa_of_cpu(const struct fy_topo *t, int cpu);
/* 1 if node n (may be NULL) has cpus this process may use. */
int fy_topo_numa_has_allowed(const struct fy_topo *t, struct hwloc_obj *n);
/* Every cpu of set must be a PU of this machine and allowed; -EINVAL with err naming the first
 * that is not. */
int fy_topo_check_cpus(const struct fy_topo *t, const struct hwloc_bitmap_s *set, char *err,
                       size_t errlen);

#endif
