/* Where the workers run (affinity.h): the default placement from the topology's NUMA nodes, the
 * GPU's and the store's disk's nodes, and the --affinity override checked against the cpus this
 * process may use. */
#include "common/ipc/affinity.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "common/ipc/cpulist.h"
#include "common/ipc/topo.h"

/* The node workers go on: the GPU's if it has allowed cpus, else the first allowed core's. */
static int placement_node(const struct fy_topo *t, int first_cpu)
{
    int gpu = fy_topo_gpu_numa_node(t);
    if (gpu >= 0) {
        if (fy_topo_numa_has_allowed(t, fy_topo_numa_obj(t, gpu)))
            return gpu;
        fy_warn("the GPU's NUMA node %d has no allowed cpus; placing workers on the node of cpu %d "
                "instead (widen the cgroup/taskset to include node %d for best bandwidth)",
                gpu, first_cpu, gpu);
    }
    return fy_topo_numa_of_cpu(t, first_cpu);
}

/* cpu_backend: the gpu worker computes the model on the CPU, so it also gets the opt worker's cores
 * (AdamW runs mostly beside the backward, and takes much less of them). */
static int default_placement(const struct fy_topo *t, int cpu_backend, struct fy_affinity *out)
{
    FY_REQUIRE(t != NULL && out != NULL, -EINVAL, "fy_affinity_default: NULL argument");
    int rc = 0;
    hwloc_topology_t topo = fy_topo_hwloc(t);
    int depth = fy_topo_core_depth(t), ssd = fy_topo_ssd_numa_node(t);
    int total = hwloc_get_nbobjs_by_depth(topo, depth);
    hwloc_bitmap_t gpu = NULL, io = NULL, opt = NULL;
    int *order = calloc((size_t)(total > 0 ? total : 1), sizeof *order);
    FY_REQUIRE(order != NULL, -ENOMEM, "fy_affinity_default: out of memory");
    FY_CPUSET_ALLOC_OUT(rc, gpu);
    FY_CPUSET_ALLOC_OUT(rc, io);
    FY_CPUSET_ALLOC_OUT(rc, opt);

    /* First PUs of allowed cores: those of the chosen node first, then the others. */
    int first = -1;
    for (int i = 0; i < total && first < 0; i++)
        first = fy_topo_core_first_pu(t, hwloc_get_obj_by_depth(topo, depth, (unsigned)i));
    if (first < 0) {
        fy_error("no allowed cpus; check the cgroup's cpuset and taskset");
        rc = -ENODEV;
        goto out;
    }
    int node = placement_node(t, first);
    hwloc_obj_t nobj = node >= 0 ? fy_topo_numa_obj(t, node) : NULL;
    int n = 0, in_node = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < total; i++) {
            int pu = fy_topo_core_first_pu(t, hwloc_get_obj_by_depth(topo, depth, (unsigned)i));
            if (pu < 0)
                continue;
            int inside = nobj == NULL || hwloc_bitmap_isset(nobj->cpuset, (unsigned)pu);
            if (inside == (pass == 0))
                order[n++] = pu;
        }
    for (int i = 0; i < n && nobj; i++)
        in_node += hwloc_bitmap_isset(nobj->cpuset, (unsigned)order[i]);
    if (nobj == NULL)
        in_node = n;
    /* The io worker's core: on the SSD's node when that is another node with an allowed core and
     * the GPU's node keeps at least three (the gpu worker and two for AdamW). */
    int ssd_pu = -1;
    hwloc_obj_t sobj = ssd >= 0 && ssd != node ? fy_topo_numa_obj(t, ssd) : NULL;
    for (int i = in_node; sobj != NULL && in_node >= 3 && i < n && ssd_pu < 0; i++)
        if (hwloc_bitmap_isset(sobj->cpuset, (unsigned)order[i]))
            ssd_pu = order[i];

    if (n < 3) {
        FY_HWLOC_OUT(rc, hwloc_bitmap_only(gpu, (unsigned)order[0]), "building gpu cpuset");
        FY_HWLOC_OUT(rc, hwloc_bitmap_only(io, (unsigned)order[0]), "building io cpuset");
        for (int i = 0; i < n; i++)
            FY_HWLOC_OUT(rc, hwloc_bitmap_set(opt, (unsigned)order[i]), "building opt cpuset");
        if (cpu_backend)
            fy_info("only %d allowed core%s: the io worker on cpu %d, the gpu worker (CPU backend) "
                    "and the opt worker on all",
                    n, n == 1 ? "" : "s", order[0]);
        else
            fy_info("only %d allowed core%s: gpu and io workers share cpu %d, opt uses all", n,
                    n == 1 ? "" : "s", order[0]);
    } else if (ssd_pu >= 0) {
        /* The store's disk hangs off another node: the io worker there, the others as before. */
        FY_HWLOC_OUT(rc, hwloc_bitmap_only(gpu, (unsigned)order[0]), "building gpu cpuset");
        FY_HWLOC_OUT(rc, hwloc_bitmap_only(io, (unsigned)ssd_pu), "building io cpuset");
        for (int i = 1; i < in_node; i++)
            FY_HWLOC_OUT(rc, hwloc_bitmap_set(opt, (unsigned)order[i]), "building opt cpuset");
    } else {
        FY_HWLOC_OUT(rc, hwloc_bitmap_only(gpu, (unsigned)order[0]), "building gpu cpuset");
        FY_HWLOC_OUT(rc, hwloc_bitmap_only(io, (unsigned)order[1]), "building io cpuset");
        /* A node too small for all three spills opt onto the other nodes rather than sharing. */
        int end = in_node >= 3 ? in_node : n;
        if (in_node < 3)
            fy_info("NUMA node %d has only %d allowed core%s; opt worker uses cores of other nodes",
                    node, in_node, in_node == 1 ? "" : "s");
        for (int i = 2; i < end; i++)
            FY_HWLOC_OUT(rc, hwloc_bitmap_set(opt, (unsigned)order[i]), "building opt cpuset");
    }
    if (cpu_backend)
        FY_HWLOC_OUT(rc, hwloc_bitmap_or(gpu, gpu, opt), "building gpu cpuset");
    struct fy_affinity a;
    memset(&a, 0, sizeof a);
    a.numa_node = node;
    a.io_near_ssd = ssd_pu >= 0;
    if (fy_cpulist_of_set(gpu, a.gpu, sizeof a.gpu) < 0 ||
        fy_cpulist_of_set(io, a.io, sizeof a.io) < 0 ||
        fy_cpulist_of_set(opt, a.opt, sizeof a.opt) < 0) {
        fy_error("default cpu lists do not fit in %zu bytes; give --affinity with ranges",
                 sizeof a.opt);
        rc = -ERANGE;
        goto out;
    }
    *out = a;
out:
    free(order);
    hwloc_bitmap_free(gpu);
    hwloc_bitmap_free(io);
    hwloc_bitmap_free(opt);
    return rc;
}

int fy_affinity_default(const struct fy_topo *t, struct fy_affinity *out)
{
    return default_placement(t, 0, out);
}

int fy_affinity_default_cpu_backend(const struct fy_topo *t, struct fy_affinity *out)
{
    return default_placement(t, 1, out);
}

enum { W_GPU, W_IO, W_OPT, W_COUNT };
static const char *const worker_names[W_COUNT] = {"gpu", "io", "opt"};

/* What --affinity's tokens build: each worker's cpus and whether the spec names it, and the
 * worker that a token without '=' continues (-1 before the first). */
struct spec_parse {
    const struct fy_topo *t;
    const char *spec, *allowed;
    hwloc_bitmap_t sets[W_COUNT], item;
    int named[W_COUNT], cur;
};

/* The worker named by [nb, ne); -1 for none. */
static int worker_of(const char *nb, const char *ne)
{
    for (int w = 0; w < W_COUNT; w++)
        if ((size_t)(ne - nb) == strlen(worker_names[w]) &&
            strncmp(nb, worker_names[w], (size_t)(ne - nb)) == 0)
            return w;
    return -1;
}

/* A token's cpus [val, e) into sp->item: one cpu or range (not empty after a worker's '='), none
 * listed for the worker before, each allowed; -EINVAL with why in err. */
static int token_cpus(struct spec_parse *sp, const char *val, const char *e, int after_name,
                      char *err, size_t errlen)
{
    hwloc_bitmap_zero(sp->item);
    if (after_name && fy_cpulist_skip_spaces(val, e) == e) {
        snprintf(err, errlen, "empty cpu list for %s", worker_names[sp->cur]);
        return -EINVAL;
    }
    FY_TRY(fy_cpulist_item(val, e, sp->item, err, errlen));
    if (hwloc_bitmap_intersects(sp->item, sp->sets[sp->cur])) {
        snprintf(err, errlen, "cpu %d already listed for %s", hwloc_bitmap_first(sp->item),
                 worker_names[sp->cur]);
        return -EINVAL;
    }
    return fy_topo_check_cpus(sp->t, sp->item, err, errlen);
}

/* One token [p, e): "worker=cpus", or more cpus for the worker named before. */
static int parse_token(struct spec_parse *sp, const char *p, const char *e)
{
    int tl = (int)(e - p);
    const char *eq = memchr(p, '=', (size_t)(e - p));
    const char *val = p;
    if (eq != NULL) {
        const char *nb = fy_cpulist_skip_spaces(p, eq), *ne = eq; /* the name, spaces trimmed */
        while (ne > nb && (ne[-1] == ' ' || ne[-1] == '\t'))
            ne--;
        sp->cur = worker_of(nb, ne);
        FY_USAGE(sp->cur >= 0,
                 "--affinity '%s': token '%.*s': unknown worker '%.*s' (use gpu, io or opt); "
                 "allowed cpus: %s",
                 sp->spec, tl, p, (int)(ne - nb), nb, sp->allowed);
        FY_USAGE(!sp->named[sp->cur],
                 "--affinity '%s': token '%.*s': worker %s given twice; allowed cpus: %s", sp->spec,
                 tl, p, worker_names[sp->cur], sp->allowed);
        sp->named[sp->cur] = 1;
        val = eq + 1;
    } else {
        FY_USAGE(sp->cur >= 0,
                 "--affinity '%s': token '%.*s': no worker named before it; write it like "
                 "gpu=0,io=1,opt=2-15 (allowed cpus: %s)",
                 sp->spec, tl, p, sp->allowed);
    }
    char err[256];
    FY_USAGE(token_cpus(sp, val, e, eq != NULL, err, sizeof err) == 0,
             "--affinity '%s': token '%.*s': %s; allowed cpus: %s", sp->spec, tl, p, err,
             sp->allowed);
    FY_HWLOC(hwloc_bitmap_or(sp->sets[sp->cur], sp->sets[sp->cur], sp->item), "building %s cpuset",
             worker_names[sp->cur]);
    return 0;
}

/* The named workers' lists on top of *inout, and the pool's node after the opt worker's. */
static int apply_spec(struct spec_parse *sp, struct fy_affinity *inout)
{
    struct fy_affinity a = *inout;
    char *dst[W_COUNT] = {a.gpu, a.io, a.opt};
    for (int w = 0; w < W_COUNT; w++)
        FY_USAGE(!sp->named[w] || fy_cpulist_of_set(sp->sets[w], dst[w], sizeof a.gpu) == 0,
                 "--affinity: %s cpu list does not fit in %zu bytes; use ranges", worker_names[w],
                 sizeof a.gpu);
    /* The opt worker touches the shared pool most, so the pool follows it. */
    char err[256];
    if (fy_cpulist_to_set(a.opt, sp->item, err, sizeof err) == 0) {
        int node = fy_topo_numa_of_cpu(sp->t, hwloc_bitmap_first(sp->item));
        if (node >= 0 && node != a.numa_node) {
            fy_info("--affinity: opt worker is on NUMA node %d; shared memory goes there", node);
            a.numa_node = node;
        }
    }
    if (sp->named[W_GPU] && sp->named[W_IO] &&
        hwloc_bitmap_intersects(sp->sets[W_GPU], sp->sets[W_IO]))
        fy_info("--affinity: gpu and io workers share cpus");
    *inout = a;
    return 0;
}

int fy_affinity_parse(const struct fy_topo *t, const char *spec, struct fy_affinity *inout)
{
    FY_REQUIRE(t != NULL && inout != NULL, -EINVAL, "fy_affinity_parse: NULL argument");
    char allowed[256];
    if (fy_cpulist_of_set(fy_topo_allowed_set(t), allowed, sizeof allowed) < 0)
        snprintf(allowed, sizeof allowed, "(too many to list)");
    FY_USAGE(spec != NULL && *fy_cpulist_skip_spaces(spec, spec + strlen(spec)) != 0,
             "--affinity: empty spec; write it like gpu=0,io=1,opt=2-15 (allowed cpus: %s)",
             allowed);
    struct spec_parse sp = {.t = t, .spec = spec, .allowed = allowed, .cur = -1};
    int rc = 0;
    for (int w = 0; w < W_COUNT; w++)
        FY_CPUSET_ALLOC_OUT(rc, sp.sets[w]);
    FY_CPUSET_ALLOC_OUT(rc, sp.item);
    for (const char *p = spec;;) {
        const char *comma = strchr(p, ',');
        FY_TRY_OUT(rc, parse_token(&sp, p, comma ? comma : p + strlen(p)));
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    rc = apply_spec(&sp, inout);
out:
    for (int w = 0; w < W_COUNT; w++)
        hwloc_bitmap_free(sp.sets[w]);
    hwloc_bitmap_free(sp.item);
    return rc;
}
