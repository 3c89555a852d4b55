/* Machine topology through hwloc: what the log shows about the machine, where the GPU and the
 * store's disk sit, and process/thread/memory binding. Every placement decision (here and in
 * affinity.c) reads t->allowed, our own copy of the usable cpus, so tests can narrow it like a
 * cgroup would. */
#include "common/ipc/topo.h"

#include <errno.h>
#include <hwloc.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/log.h"

struct fy_topo {
    hwloc_topology_t topo;
    int synthetic;
    hwloc_bitmap_t allowed; /* cpus we may use: hwloc allowed set & current process binding */
    int core_depth;         /* depth of cores, or of PUs where hwloc reports no cores */
    int gpu_numa;           /* OS index, -1 if unknown */
    char gpu_desc[160];     /* empty when no GPU was seen */
    char gpu_near[32];      /* cpus of the GPU's first non-I/O ancestor */
    int ssd_numa;           /* OS index of the store's disk's node, -1 if unknown */
    char ssd_desc[200];     /* what fy_topo_locate_ssd found (empty before it ran) */
};

/* ---- loading ------------------------------------------------------------------------------ */

hwloc_obj_t fy_topo_numa_obj(const struct fy_topo *t, int os)
{
    hwloc_obj_t n = NULL;
    while ((n = hwloc_get_next_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, n)) != NULL)
        if ((int)n->os_index == os)
            return n;
    return NULL;
}

/* First allowed PU of a core, -1 if none. */
int fy_topo_core_first_pu(const struct fy_topo *t, hwloc_obj_t core)
{
    for (int c = hwloc_bitmap_first(core->cpuset); c >= 0; c = hwloc_bitmap_next(core->cpuset, c))
        if (hwloc_bitmap_isset(t->allowed, (unsigned)c))
            return c;
    return -1;
}

/* The NUMA node (OS index) holding a cpu, -1 if none. */
int fy_topo_numa_of_cpu(const struct fy_topo *t, int cpu)
{
    hwloc_obj_t n = NULL;
    while ((n = hwloc_get_next_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, n)) != NULL)
        if (n->cpuset && hwloc_bitmap_isset(n->cpuset, (unsigned)cpu))
            return (int)n->os_index;
    return -1;
}

int fy_topo_numa_has_allowed(const struct fy_topo *t, hwloc_obj_t n)
{
    return n && n->cpuset && hwloc_bitmap_intersects(n->cpuset, t->allowed);
}

/* The first NUMA node of obj (an I/O device's non-I/O ancestor) with cpus we may use; -1 when
 * none is known. */
static int first_allowed_node(const struct fy_topo *t, hwloc_obj_t obj)
{
    for (int n = obj && obj->nodeset ? hwloc_bitmap_first(obj->nodeset) : -1; n >= 0;
         n = hwloc_bitmap_next(obj->nodeset, n))
        if (fy_topo_numa_has_allowed(t, fy_topo_numa_obj(t, n)))
            return n;
    return -1;
}

static int is_nvidia_pci(hwloc_obj_t o)
{
    return o && o->type == HWLOC_OBJ_PCI_DEVICE && o->attr->pcidev.vendor_id == 0x10de &&
           (o->attr->pcidev.class_id == 0x0300 || o->attr->pcidev.class_id == 0x0302);
}

static hwloc_obj_t pci_parent(hwloc_obj_t o)
{
    while (o && o->type != HWLOC_OBJ_PCI_DEVICE)
        o = o->parent;
    return o;
}

/* The NVIDIA GPU's hwloc object: a CUDA/NVML OS device, else a DRM card whose PCI device is NVIDIA
 * (card0 alone is often the BMC's VGA on servers), else the PCI device itself. */
static hwloc_obj_t find_gpu(const struct fy_topo *t)
{
    static const char *const nv_prefixes[] = {"cuda", "nvml", "nvidia"};
    hwloc_obj_t o = NULL, card = NULL;
    while ((o = hwloc_get_next_osdev(t->topo, o)) != NULL) {
        if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_GPU &&
            o->attr->osdev.type != HWLOC_OBJ_OSDEV_COPROC)
            continue;
        if (o->name == NULL)
            continue;
        for (size_t i = 0; i < sizeof nv_prefixes / sizeof nv_prefixes[0]; i++)
            if (strncmp(o->name, nv_prefixes[i], strlen(nv_prefixes[i])) == 0)
                return o;
        if (card == NULL && strncmp(o->name, "card", 4) == 0 && is_nvidia_pci(pci_parent(o)))
            card = o;
    }
    if (card)
        return card;
    while ((o = hwloc_get_next_pcidev(t->topo, o)) != NULL)
        if (is_nvidia_pci(o))
            return o;
    return NULL;
}

/* The k-th NVIDIA GPU's hwloc object: the OS device "cudaK" (or "nvmlK"), else the k-th NVIDIA
 * PCI display device; NULL where hwloc sees fewer. */
static hwloc_obj_t find_gpu_k(const struct fy_topo *t, int k)
{
    char cuda[16], nvml[16];
    snprintf(cuda, sizeof cuda, "cuda%d", k);
    snprintf(nvml, sizeof nvml, "nvml%d", k);
    hwloc_obj_t o = NULL;
    while ((o = hwloc_get_next_osdev(t->topo, o)) != NULL)
        if (o->name != NULL && (strcmp(o->name, cuda) == 0 || strcmp(o->name, nvml) == 0))
            return o;
    int seen = 0;
    while ((o = hwloc_get_next_pcidev(t->topo, o)) != NULL)
        if (is_nvidia_pci(o) && seen++ == k)
            return o;
    return NULL;
}

int fy_topo_gpu_cpus(const struct fy_topo *t, int k, char *buf, size_t len)
{
    hwloc_obj_t gpu = find_gpu_k(t, k);
    hwloc_obj_t anc = gpu ? hwloc_get_non_io_ancestor_obj(t->topo, gpu) : NULL;
    if (anc == NULL || anc->cpuset == NULL)
        return -ENOENT;
    hwloc_bitmap_t near = hwloc_bitmap_alloc();
    if (near == NULL)
        return -ENOMEM;
    int rc = hwloc_bitmap_and(near, anc->cpuset, t->allowed) == 0 && !hwloc_bitmap_iszero(near)
                 ? fy_cpulist_of_set(near, buf, len)
                 : -ENOENT;
    hwloc_bitmap_free(near);
    return rc;
}

static void locate_gpu(struct fy_topo *t)
{
    t->gpu_numa = -1;
    t->gpu_desc[0] = 0;
    hwloc_obj_t gpu = find_gpu(t);
    if (gpu == NULL) {
        if (t->synthetic)
            fy_debug("synthetic topology: no GPU");
        else
            fy_debug("GPU locality: not visible to hwloc (no cuda/nvml/nvidia/card OS device, no "
                    "PCI device 10de class 0300/0302); workers go on the node of the first "
                    "allowed core");
        return;
    }
    hwloc_obj_t pci = pci_parent(gpu);
    char where[64] = "";
    if (pci)
        snprintf(where, sizeof where, " (PCI %04x:%02x:%02x.%01x, 10de:%04x)",
                 pci->attr->pcidev.domain, pci->attr->pcidev.bus, pci->attr->pcidev.dev,
                 pci->attr->pcidev.func, pci->attr->pcidev.device_id);
    snprintf(t->gpu_desc, sizeof t->gpu_desc, "%s%s",
             gpu->type == HWLOC_OBJ_OS_DEVICE && gpu->name ? gpu->name : "NVIDIA GPU", where);
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t->topo, gpu);
    if (anc == NULL || anc->cpuset == NULL || anc->nodeset == NULL)
        return;
    if (fy_cpulist_of_set(anc->cpuset, t->gpu_near, sizeof t->gpu_near) < 0)
        snprintf(t->gpu_near, sizeof t->gpu_near, "(long list)");
    /* An ancestor spanning several nodes means the firmware did not say; take the first node we
     * may use and let describe() show the ambiguity. */
    t->gpu_numa = first_allowed_node(t, anc);
    int nodes = hwloc_bitmap_weight(anc->nodeset);
    if (nodes > 1) {
        size_t l = strlen(t->gpu_desc);
        snprintf(t->gpu_desc + l, sizeof t->gpu_desc - l, ", attached above %d NUMA nodes", nodes);
    }
}

/* Narrows allowed to the process's current binding, so "taskset -c 0-3 fuyou-launch" is obeyed. */
static void narrow_to_binding(struct fy_topo *t)
{
    hwloc_bitmap_t cur = hwloc_bitmap_alloc();
    if (cur == NULL)
        return;
    if (hwloc_get_cpubind(t->topo, cur, HWLOC_CPUBIND_PROCESS) < 0) {
        fy_debug("hwloc_get_cpubind: %s; using the cgroup's allowed cpus only", strerror(errno));
    } else if (hwloc_bitmap_intersects(cur, t->allowed) &&
               !hwloc_bitmap_isincluded(t->allowed, cur)) {
        if (hwloc_bitmap_and(t->allowed, t->allowed, cur) == 0) {
            char l[256];
            if (fy_cpulist_of_set(t->allowed, l, sizeof l) == 0)
                fy_info("process is bound to cpus %s; placing workers within them", l);
        }
    }
    hwloc_bitmap_free(cur);
}

static int topo_load(struct fy_topo **out, const char *synthetic)
{
    int rc = 0;
    FY_REQUIRE(out != NULL, -EINVAL, "fy_topo_load: out is NULL");
    *out = NULL;
    struct fy_topo *t = calloc(1, sizeof *t);
    FY_REQUIRE(t != NULL, -ENOMEM, "fy_topo_load: out of memory");
    t->gpu_numa = -1;
    t->ssd_numa = -1;
    t->synthetic = synthetic != NULL;
    if (hwloc_topology_init(&t->topo) < 0) {
        rc = errno ? -errno : -ENOMEM;
        fy_error("hwloc_topology_init: %s", strerror(-rc));
        free(t);
        return rc;
    }
    FY_HWLOC_OUT(rc, hwloc_topology_set_io_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT),
                 "hwloc_topology_set_io_types_filter(KEEP_IMPORTANT)");
    if (synthetic)
        FY_HWLOC_OUT(rc, hwloc_topology_set_synthetic(t->topo, synthetic),
                     "synthetic topology '%s' (write it like \"numa:2 core:8 pu:1\")", synthetic);
    FY_HWLOC_OUT(rc, hwloc_topology_load(t->topo),
                 "hwloc_topology_load (check that /sys and /proc are mounted)");
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(t->topo);
    t->allowed = allowed ? hwloc_bitmap_dup(allowed) : NULL;
    if (t->allowed == NULL) {
        fy_error("hwloc_bitmap_dup: out of memory");
        rc = -ENOMEM;
        goto out;
    }
    if (!t->synthetic)
        narrow_to_binding(t);
    /* Some platforms report no cores; then each PU counts as one. */
    t->core_depth = hwloc_get_type_or_below_depth(t->topo, HWLOC_OBJ_CORE);
    FY_HWLOC_OUT(rc, t->core_depth, "hwloc_get_type_or_below_depth(CORE)");
    locate_gpu(t);
    if (fy_topo_core_count(t) == 0) {
        fy_error("no allowed cpus in the topology; check the cgroup's cpuset and taskset");
        rc = -ENODEV;
        goto out;
    }
    *out = t;
    return 0;
out:
    fy_topo_destroy(&t);
    return rc;
}

int fy_topo_load(struct fy_topo **out)
{
    return topo_load(out, NULL);
}

int fy_topo_load_synthetic(struct fy_topo **out, const char *desc)
{
    FY_REQUIRE(desc != NULL, -EINVAL, "fy_topo_load_synthetic: desc is NULL");
    return topo_load(out, desc);
}

void fy_topo_destroy(struct fy_topo **t)
{
    if (t == NULL || *t == NULL)
        return;
    if ((*t)->allowed)
        hwloc_bitmap_free((*t)->allowed);
    if ((*t)->topo)
        hwloc_topology_destroy((*t)->topo);
    free(*t);
    *t = NULL;
}

/* ---- queries ------------------------------------------------------------------------------ */

unsigned fy_topo_numa_count(const struct fy_topo *t)
{
    int n = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_NUMANODE);
    return n > 0 ? (unsigned)n : 0;
}

unsigned fy_topo_core_count(const struct fy_topo *t)
{
    unsigned n = 0;
    int total = hwloc_get_nbobjs_by_depth(t->topo, t->core_depth);
    for (int i = 0; i < total; i++)
        if (fy_topo_core_first_pu(t, hwloc_get_obj_by_depth(t->topo, t->core_depth, (unsigned)i)) >=
            0)
            n++;
    return n;
}

unsigned fy_topo_pu_count(const struct fy_topo *t)
{
    int w = hwloc_bitmap_weight(t->allowed);
    return w > 0 ? (unsigned)w : 0;
}

int fy_topo_gpu_numa_node(const struct fy_topo *t)
{
    return t->gpu_numa;
}

/* A node given for a device (what: "GPU" or "SSD") must exist and have cpus we may use. */
static int check_device_node(const struct fy_topo *t, int node, const char *what)
{
    hwloc_obj_t n = fy_topo_numa_obj(t, node);
    FY_REQUIRE(n != NULL, -EINVAL, "%s NUMA node %d does not exist (this machine has %u nodes)",
               what, node, fy_topo_numa_count(t));
    FY_REQUIRE(fy_topo_numa_has_allowed(t, n), -EINVAL,
               "%s NUMA node %d has no cpus this process may use; pick another node", what, node);
    return 0;
}

int fy_topo_set_gpu_numa_node(struct fy_topo *t, int node)
{
    if (node >= 0)
        FY_TRY(check_device_node(t, node, "GPU"));
    t->gpu_numa = node < 0 ? -1 : node;
    return 0;
}

int fy_topo_allowed_cpus(const struct fy_topo *t, char *buf, size_t len)
{
    int rc = fy_cpulist_of_set(t->allowed, buf, len);
    FY_REQUIRE(rc == 0, rc, "allowed cpu list does not fit in %zu bytes", len);
    return 0;
}

int fy_topo_cpu_allowed(const struct fy_topo *t, int cpu)
{
    return cpu >= 0 && hwloc_bitmap_isset(t->allowed, (unsigned)cpu) &&
           hwloc_get_pu_obj_by_os_index(t->topo, (unsigned)cpu) != NULL;
}

int fy_topo_restrict(struct fy_topo *t, const char *cpulist)
{
    char err[256], allowed[256];
    int rc = 0;
    hwloc_bitmap_t set = NULL;
    FY_CPUSET_ALLOC_OUT(rc, set);
    if (fy_cpulist_of_set(t->allowed, allowed, sizeof allowed) < 0)
        snprintf(allowed, sizeof allowed, "(too many to list)");
    rc = fy_cpulist_to_set(cpulist, set, err, sizeof err);
    if (rc < 0) {
        fy_error("cpu restriction '%s': %s", cpulist ? cpulist : "(null)", err);
        goto out;
    }
    if (!hwloc_bitmap_intersects(set, t->allowed)) {
        fy_error("cpu restriction '%s' leaves no allowed cpus; allowed cpus: %s", cpulist, allowed);
        rc = -EINVAL;
        goto out;
    }
    FY_HWLOC_OUT(rc, hwloc_bitmap_and(t->allowed, t->allowed, set), "restricting allowed cpus");
    if (t->gpu_numa >= 0 && !fy_topo_numa_has_allowed(t, fy_topo_numa_obj(t, t->gpu_numa)))
        fy_info("GPU NUMA node %d has no allowed cpus left; workers go elsewhere", t->gpu_numa);
out:
    hwloc_bitmap_free(set);
    return rc;
}

/* Appends to buf at *off without overflowing; truncation is fine for a log line. */
static void append(char *buf, size_t len, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
    if (*off >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *off, len - *off, fmt, ap);
    va_end(ap);
    if (n > 0)
        *off = *off + (size_t)n < len ? *off + (size_t)n : len;
}

void fy_topo_describe(const struct fy_topo *t, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    buf[0] = 0;
    size_t off = 0;
    char l[256];
    unsigned nn = fy_topo_numa_count(t);
    append(buf, len, &off, "%s%u NUMA node%s:", t->synthetic ? "synthetic topology: " : "", nn,
           nn == 1 ? "" : "s");
    hwloc_obj_t n = NULL;
    while ((n = hwloc_get_next_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, n)) != NULL) {
        if (n->cpuset == NULL || fy_cpulist_of_set(n->cpuset, l, sizeof l) < 0)
            snprintf(l, sizeof l, "?");
        append(buf, len, &off, " node %u cpus %s, %.1f GiB;", n->os_index, l,
               (double)n->attr->numanode.local_memory / (1024.0 * 1024.0 * 1024.0));
    }
    int total_cores = hwloc_get_nbobjs_by_depth(t->topo, t->core_depth);
    int total_pus = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_PU);
    append(buf, len, &off, " %d cores, %d PUs (allowed: %u cores, %u PUs);", total_cores, total_pus,
           fy_topo_core_count(t), fy_topo_pu_count(t));
    if (fy_cpulist_of_set(t->allowed, l, sizeof l) < 0)
        snprintf(l, sizeof l, "(too many to list)");
    append(buf, len, &off, " allowed cpus %s;", l);
    if (t->gpu_desc[0] == 0 && t->gpu_numa < 0)
        append(buf, len, &off, " GPU locality: not visible to hwloc");
    else if (t->gpu_desc[0] == 0)
        append(buf, len, &off, " GPU locality: set by configuration to NUMA node %d", t->gpu_numa);
    else if (t->gpu_numa < 0)
        append(buf, len, &off, " GPU locality: %s, near cpus %s, NUMA node unknown", t->gpu_desc,
               t->gpu_near[0] ? t->gpu_near : "?");
    else
        append(buf, len, &off, " GPU locality: %s, near cpus %s, NUMA node %d", t->gpu_desc,
               t->gpu_near[0] ? t->gpu_near : "?", t->gpu_numa);
    if (t->ssd_desc[0] != 0)
        append(buf, len, &off, "; SSD locality: %s", t->ssd_desc);
}

/* The disk under path as the kernel names it ("nvme0n1" for a file on nvme0n1p2), from the
 * block device's sysfs entry; -1 when path is not on a block device sysfs describes. */
static int disk_of_path(const char *path, char *disk, size_t len)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    char link[64], real[PATH_MAX], part[PATH_MAX + 16];
    snprintf(link, sizeof link, "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
    if (realpath(link, real) == NULL)
        return -1;
    snprintf(part, sizeof part, "%s/partition", real);
    char *slash = strrchr(real, '/');
    if (slash == NULL)
        return -1;
    if (access(part, F_OK) == 0) { /* a partition: its disk is the directory above */
        *slash = 0;
        slash = strrchr(real, '/');
        if (slash == NULL)
            return -1;
    }
    snprintf(disk, len, "%s", slash + 1);
    return 0;
}

static hwloc_obj_t find_block_device(const struct fy_topo *t, const char *disk)
{
    hwloc_obj_t o = NULL;
    while ((o = hwloc_get_next_osdev(t->topo, o)) != NULL)
        if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_BLOCK && o->name != NULL &&
            strcmp(o->name, disk) == 0)
            return o;
    return NULL;
}

int fy_topo_locate_ssd(struct fy_topo *t, const char *paths)
{
    FY_REQUIRE(t != NULL, -EINVAL, "fy_topo_locate_ssd: NULL topology");
    t->ssd_numa = -1;
    t->ssd_desc[0] = 0;
    if (t->synthetic || paths == NULL || *paths == 0) {
        snprintf(t->ssd_desc, sizeof t->ssd_desc, "not known");
        return 0;
    }
    char list[4096];
    snprintf(list, sizeof list, "%s", paths);
    size_t off = 0;
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        char disk[64] = "";
        hwloc_obj_t dev = disk_of_path(p, disk, sizeof disk) == 0 ? find_block_device(t, disk)
                                                                    : NULL;
        int node = dev != NULL ? first_allowed_node(t, hwloc_get_non_io_ancestor_obj(t->topo, dev))
                               : -1;
        int w;
        if (node >= 0)
            w = snprintf(t->ssd_desc + off, sizeof t->ssd_desc - off, "%s%s on %s, NUMA node %d",
                         off ? "; " : "", p, disk, node);
        else
            w = snprintf(t->ssd_desc + off, sizeof t->ssd_desc - off, "%s%s on %s, not placed by "
                         "hwloc", off ? "; " : "", p, disk[0] ? disk : "no block device");
        off = w > 0 && off + (size_t)w < sizeof t->ssd_desc ? off + (size_t)w : off;
        if (t->ssd_numa < 0)
            t->ssd_numa = node; /* the first path's disk decides: the io worker has one core */
    }
    return 0;
}

int fy_topo_ssd_numa_node(const struct fy_topo *t)
{
    return t->ssd_numa;
}

int fy_topo_set_ssd_numa_node(struct fy_topo *t, int node)
{
    if (node < 0) {
        t->ssd_numa = -1;
        return 0;
    }
    FY_TRY(check_device_node(t, node, "SSD"));
    t->ssd_numa = node;
    snprintf(t->ssd_desc, sizeof t->ssd_desc, "set to NUMA node %d", node);
    return 0;
}

/* Every cpu of set must be a PU of this machine and allowed; err names the first that is not. */
int fy_topo_check_cpus(const struct fy_topo *t, hwloc_const_bitmap_t set, char *err, size_t errlen)
{
    for (int c = hwloc_bitmap_first(set); c >= 0; c = hwloc_bitmap_next(set, c)) {
        if (hwloc_get_pu_obj_by_os_index(t->topo, (unsigned)c) == NULL) {
            snprintf(err, errlen, "cpu %d does not exist on this machine", c);
            return -EINVAL;
        }
        if (!hwloc_bitmap_isset(t->allowed, (unsigned)c)) {
            snprintf(err, errlen, "cpu %d is not allowed for this process (cgroup/taskset)", c);
            return -EINVAL;
        }
    }
    return 0;
}

struct hwloc_topology *fy_topo_hwloc(const struct fy_topo *t) { return t->topo; }

const struct hwloc_bitmap_s *fy_topo_allowed_set(const struct fy_topo *t) { return t->allowed; }

int fy_topo_core_depth(const struct fy_topo *t) { return t->core_depth; }

/* ---- binding ------------------------------------------------------------------------------ */

static int require_real(const struct fy_topo *t, const char *what)
{
    FY_REQUIRE(t != NULL, -EINVAL, "%s: topology is NULL", what);
    FY_REQUIRE(!t->synthetic && hwloc_topology_is_thissystem(t->topo), -ENOTSUP,
               "%s: topology is synthetic; bind with the one from fy_topo_load", what);
    return 0;
}

int fy_topo_get_binding(const struct fy_topo *t, char *buf, size_t len)
{
    FY_TRY(require_real(t, "fy_topo_get_binding"));
    int rc = 0;
    hwloc_bitmap_t cur = NULL;
    FY_CPUSET_ALLOC_OUT(rc, cur);
    FY_HWLOC_OUT(rc, hwloc_get_cpubind(t->topo, cur, HWLOC_CPUBIND_PROCESS),
                 "reading process binding");
    rc = fy_cpulist_of_set(cur, buf, len);
    if (rc < 0)
        fy_error("process binding does not fit in %zu bytes", len);
out:
    hwloc_bitmap_free(cur);
    return rc;
}

int fy_topo_bind_self(const struct fy_topo *t, const char *cpulist, char *actual, size_t actual_len)
{
    FY_TRY(require_real(t, "fy_topo_bind_self"));
    char err[256], allowed[256];
    int rc = 0;
    hwloc_bitmap_t set = NULL;
    FY_CPUSET_ALLOC_OUT(rc, set);
    if (fy_cpulist_of_set(t->allowed, allowed, sizeof allowed) < 0)
        snprintf(allowed, sizeof allowed, "(too many to list)");
    rc = fy_cpulist_to_set(cpulist, set, err, sizeof err);
    if (rc == 0)
        rc = fy_topo_check_cpus(t, set, err, sizeof err);
    if (rc < 0) {
        fy_error("binding to cpus '%s': %s; allowed cpus: %s", cpulist ? cpulist : "(null)", err,
                 allowed);
        goto out;
    }
    FY_HWLOC_OUT(
        rc, hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_PROCESS),
        "binding process to cpus %s (is a cgroup or seccomp forbidding sched_setaffinity?)",
        cpulist);
    if (actual != NULL && actual_len > 0) {
        FY_HWLOC_OUT(rc, hwloc_get_cpubind(t->topo, set, HWLOC_CPUBIND_PROCESS),
                     "reading process binding");
        rc = fy_cpulist_of_set(set, actual, actual_len);
        if (rc < 0) {
            fy_error("process binding does not fit in %zu bytes", actual_len);
            goto out;
        }
    }
out:
    hwloc_bitmap_free(set);
    return rc;
}

int fy_topo_bind_thread(const struct fy_topo *t, int cpu)
{
    FY_TRY(require_real(t, "fy_topo_bind_thread"));
    FY_REQUIRE(fy_topo_cpu_allowed(t, cpu), -EINVAL,
               "binding thread to cpu %d: no such cpu or not allowed for this process", cpu);
    int rc = 0;
    hwloc_bitmap_t set = NULL;
    FY_CPUSET_ALLOC_OUT(rc, set);
    FY_HWLOC_OUT(rc, hwloc_bitmap_only(set, (unsigned)cpu), "building cpuset");
    FY_HWLOC_OUT(rc, hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD),
                 "binding thread to cpu %d", cpu);
out:
    hwloc_bitmap_free(set);
    return rc;
}

int fy_topo_bind_memory(const struct fy_topo *t, void *addr, size_t len, int numa_node)
{
    FY_TRY(require_real(t, "fy_topo_bind_memory"));
    long page = sysconf(_SC_PAGESIZE);
    FY_REQUIRE(addr != NULL && len > 0 && page > 0 && (uintptr_t)addr % (uintptr_t)page == 0,
               -EINVAL, "binding memory %p+%zu: address must be page-aligned and length > 0", addr,
               len);
    hwloc_obj_t n = fy_topo_numa_obj(t, numa_node);
    FY_REQUIRE(n != NULL && n->nodeset != NULL, -EINVAL,
               "binding memory to NUMA node %d: no such node (this machine has %u)", numa_node,
               fy_topo_numa_count(t));
    errno = 0;
    if (hwloc_set_area_membind(t->topo, addr, len, n->nodeset, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET) < 0) {
        int e = errno ? errno : ENOSYS;
        if (e == ENOSYS || e == EPERM || e == EXDEV)
            fy_debug("binding %zu bytes to NUMA node %d refused: %s", len, numa_node, strerror(e));
        else
            fy_error("binding %zu bytes at %p to NUMA node %d: hwloc: %s", len, addr, numa_node,
                     strerror(e));
        return -e;
    }
    return 0;
}
