/* Tests of common/ipc/topo: loading and describing this machine, cpu list parsing, default worker
 * placement (on this machine and on synthetic 2-node machines), the --affinity override, and
 * process/thread/memory binding. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "common/ipc/affinity.h"
#include "common/ipc/topo.h"
#include "testutil.h"

static struct fy_topo *topo; /* this machine, loaded once */

static int setup(void **state)
{
    return fy_topo_load(&topo) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    fy_topo_destroy(&topo);
    return 0;
}

/* Every cpu of list is allowed; returns how many there are. */
static int assert_all_allowed(const struct fy_topo *t, const char *list)
{
    int cpus[1024];
    int n = fy_cpulist_parse(list, cpus, 1024);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++)
        assert_true(fy_topo_cpu_allowed(t, cpus[i]));
    return n;
}

static void test_load_describe(void **state)
{
    char buf[4096];
    fy_topo_describe(topo, buf, sizeof buf);
    printf("# %s\n", buf);
    assert_true(strlen(buf) > 0);
    assert_non_null(strstr(buf, "NUMA"));
    assert_non_null(strstr(buf, "GPU locality"));
    assert_true(fy_topo_numa_count(topo) >= 1);
    assert_true(fy_topo_core_count(topo) >= 1);
    assert_true(fy_topo_pu_count(topo) >= fy_topo_core_count(topo));
    char allowed[256];
    assert_int_equal(fy_topo_allowed_cpus(topo, allowed, sizeof allowed), 0);
    assert_true(assert_all_allowed(topo, allowed) == (int)fy_topo_pu_count(topo));

    /* A tiny buffer truncates rather than overflowing. */
    char small[8];
    memset(small, 'x', sizeof small);
    fy_topo_describe(topo, small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);

    fy_topo_destroy(NULL);
    struct fy_topo *null_topo = NULL;
    fy_topo_destroy(&null_topo);
}

static void test_cpulist_valid(void **state)
{
    int c[64];
    assert_int_equal(fy_cpulist_parse("0", c, 64), 1);
    assert_int_equal(c[0], 0);
    assert_int_equal(fy_cpulist_parse("2-15", c, 64), 14);
    assert_int_equal(c[0], 2);
    assert_int_equal(c[13], 15);
    assert_int_equal(fy_cpulist_parse("0,2,4-6", c, 64), 5);
    int want[] = {0, 2, 4, 5, 6};
    for (int i = 0; i < 5; i++)
        assert_int_equal(c[i], want[i]);
    /* Unordered input comes back ascending. */
    assert_int_equal(fy_cpulist_parse("7,3", c, 64), 2);
    assert_int_equal(c[0], 3);
    assert_int_equal(c[1], 7);
    assert_int_equal(fy_cpulist_parse("5-5", c, 64), 1);
    assert_int_equal(c[0], 5);
    /* Spaces around items and around the dash are accepted. */
    assert_int_equal(fy_cpulist_parse(" 1 , 3 - 4 ", c, 64), 3);
    assert_int_equal(c[0], 1);
    assert_int_equal(c[2], 4);
    /* Count only. */
    assert_int_equal(fy_cpulist_parse("0-99", NULL, 0), 100);
}

static void test_cpulist_errors(void **state)
{
    int c[8];
    assert_int_equal(fy_cpulist_parse("3-1", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("a", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("   ", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse(NULL, c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("1,,2", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("1,", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse(",1", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("1-", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("-1", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("+1", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("1 2", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("1x", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("1-2-3", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("1,1", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("0-3,2", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("99999999999999999999999", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("0-4294967296", c, 8), -EINVAL);
    /* More cpus than the caller has room for. */
    assert_int_equal(fy_cpulist_parse("0-8", c, 8), -EINVAL);
    assert_int_equal(fy_cpulist_parse("0-7", c, 8), 8);
}

static void test_default_this_machine(void **state)
{
    struct fy_affinity a;
    assert_int_equal(fy_affinity_default(topo, &a), 0);
    printf("# default: gpu=%s io=%s opt=%s numa=%d\n", a.gpu, a.io, a.opt, a.numa_node);
    assert_int_equal(assert_all_allowed(topo, a.gpu), 1);
    assert_int_equal(assert_all_allowed(topo, a.io), 1);
    int nopt = assert_all_allowed(topo, a.opt);
    assert_true(a.numa_node >= 0);
    unsigned cores = fy_topo_core_count(topo);
    if (cores < 3) {
        assert_string_equal(a.gpu, a.io);
        assert_int_equal(nopt, (int)cores);
    } else {
        assert_string_not_equal(a.gpu, a.io);
        int g, i, opt[1024];
        assert_int_equal(fy_cpulist_parse(a.gpu, &g, 1), 1);
        assert_int_equal(fy_cpulist_parse(a.io, &i, 1), 1);
        assert_int_equal(fy_cpulist_parse(a.opt, opt, 1024), nopt);
        for (int k = 0; k < nopt; k++)
            assert_true(opt[k] != g && opt[k] != i);
    }
}

/* The io worker goes near the store's disk when that hangs off another node than the GPU, as
 * long as the GPU's node keeps three cores; otherwise the usual placement. */
static void test_default_io_near_ssd(void **state)
{
    struct fy_topo *t = NULL;
    struct fy_affinity a;
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:2 core:8 pu:1"), 0);
    assert_int_equal(fy_topo_set_gpu_numa_node(t, 0), 0);
    assert_int_equal(fy_topo_ssd_numa_node(t), -1);
    assert_int_equal(fy_topo_set_ssd_numa_node(t, 1), 0);
    assert_int_equal(fy_topo_ssd_numa_node(t), 1);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "0");
    assert_string_equal(a.io, "8");
    assert_string_equal(a.opt, "1-7");
    assert_int_equal(a.numa_node, 0);
    assert_int_equal(a.io_near_ssd, 1);
    char buf[2048];
    fy_topo_describe(t, buf, sizeof buf);
    assert_non_null(strstr(buf, "SSD locality: set to NUMA node 1"));

    /* the disk on the GPU's node: nothing moves */
    assert_int_equal(fy_topo_set_ssd_numa_node(t, 0), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.io, "1");
    assert_string_equal(a.opt, "2-7");
    assert_int_equal(a.io_near_ssd, 0);

    /* the GPU's node left with two cores: AdamW would lose a core, so io stays beside the gpu */
    assert_int_equal(fy_topo_set_ssd_numa_node(t, 1), 0);
    assert_int_equal(fy_topo_restrict(t, "6-15"), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "6");
    assert_string_equal(a.io, "7");
    assert_string_equal(a.opt, "8-15");
    assert_int_equal(a.io_near_ssd, 0);

    assert_int_equal(fy_topo_set_ssd_numa_node(t, 2), -EINVAL);
    assert_int_equal(fy_topo_set_ssd_numa_node(t, -1), 0);
    assert_int_equal(fy_topo_ssd_numa_node(t), -1);
    fy_topo_destroy(&t);
}

/* On this machine: the store's disk is looked up through sysfs and hwloc; whatever it finds (a
 * virtual disk is usually not placed), it says so for every path and never fails. */
static void test_locate_ssd_this_machine(void **state)
{
    assert_int_equal(fy_topo_locate_ssd(topo, "/tmp,/nonexistent-fuyou-path"), 0);
    char buf[4096];
    fy_topo_describe(topo, buf, sizeof buf);
    printf("# %s\n", strstr(buf, "SSD locality"));
    assert_non_null(strstr(buf, "SSD locality: /tmp on "));
    assert_non_null(strstr(buf, "/nonexistent-fuyou-path on no block device, not placed by hwloc"));
    int node = fy_topo_ssd_numa_node(topo);
    assert_true(node >= -1 && node < (int)fy_topo_numa_count(topo) + 64);
}

static void test_default_synthetic_two_nodes(void **state)
{
    struct fy_topo *t = NULL;
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:2 core:8 pu:1"), 0);
    assert_int_equal(fy_topo_numa_count(t), 2);
    assert_int_equal(fy_topo_core_count(t), 16);
    assert_int_equal(fy_topo_gpu_numa_node(t), -1);
    char buf[2048];
    /* no GPU k either: a gpu worker of rank k keeps the gpu worker's cpus (--gpus) */
    assert_int_equal(fy_topo_gpu_cpus(t, 0, buf, sizeof buf), -ENOENT);
    assert_int_equal(fy_topo_gpu_cpus(t, 1, buf, sizeof buf), -ENOENT);
    fy_topo_describe(t, buf, sizeof buf);
    printf("# %s\n", buf);
    assert_non_null(strstr(buf, "GPU locality: not visible to hwloc"));

    /* No GPU seen: node of the first allowed core. */
    struct fy_affinity a;
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "0");
    assert_string_equal(a.io, "1");
    assert_string_equal(a.opt, "2-7");
    assert_int_equal(a.numa_node, 0);

    /* GPU on node 1: everything moves there. */
    assert_int_equal(fy_topo_set_gpu_numa_node(t, 1), 0);
    assert_int_equal(fy_topo_gpu_numa_node(t), 1);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "8");
    assert_string_equal(a.io, "9");
    assert_string_equal(a.opt, "10-15");
    assert_int_equal(a.numa_node, 1);
    assert_int_equal(fy_topo_set_gpu_numa_node(t, 2), -EINVAL);
    assert_int_equal(fy_topo_set_gpu_numa_node(t, 0), 0);

    /* A cgroup that leaves part of node 0. */
    assert_int_equal(fy_topo_restrict(t, "3-15"), 0);
    assert_int_equal(fy_topo_core_count(t), 13);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "3");
    assert_string_equal(a.io, "4");
    assert_string_equal(a.opt, "5-7");
    assert_int_equal(a.numa_node, 0);

    /* Node 0 with 2 cores left: opt spills onto node 1 rather than sharing. */
    assert_int_equal(fy_topo_restrict(t, "6-15"), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "6");
    assert_string_equal(a.io, "7");
    assert_string_equal(a.opt, "8-15");

    /* GPU's node fully disallowed: falls back to the first allowed core's node. */
    assert_int_equal(fy_topo_restrict(t, "8-15"), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "8");
    assert_string_equal(a.io, "9");
    assert_string_equal(a.opt, "10-15");
    assert_int_equal(a.numa_node, 1);
    assert_int_equal(fy_topo_restrict(t, "0-7"), -EINVAL); /* would leave nothing */

    /* Binding with a synthetic topology is refused. */
    assert_int_equal(fy_topo_bind_self(t, "8", NULL, 0), -ENOTSUP);
    assert_int_equal(fy_topo_bind_thread(t, 8), -ENOTSUP);
    fy_topo_destroy(&t);
    assert_null(t);
}

static void test_default_synthetic_small_and_smt(void **state)
{
    struct fy_topo *t = NULL;
    struct fy_affinity a;

    /* Two cores, as in CI: gpu and io share, opt gets both. */
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:1 core:2 pu:1"), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "0");
    assert_string_equal(a.io, "0");
    assert_string_equal(a.opt, "0-1");
    fy_topo_destroy(&t);

    assert_int_equal(fy_topo_load_synthetic(&t, "numa:1 core:1 pu:1"), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "0");
    assert_string_equal(a.io, "0");
    assert_string_equal(a.opt, "0");
    fy_topo_destroy(&t);

    /* Two PUs per core: one worker thread per core, on the core's first PU. */
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:2 core:4 pu:2"), 0);
    assert_int_equal(fy_topo_core_count(t), 8);
    assert_int_equal(fy_topo_pu_count(t), 16);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "0");
    assert_string_equal(a.io, "2");
    assert_string_equal(a.opt, "4,6");
    /* A core whose first PU is disallowed uses its second. */
    assert_int_equal(fy_topo_restrict(t, "1-15"), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);
    assert_string_equal(a.gpu, "1");
    assert_string_equal(a.io, "2");
    fy_topo_destroy(&t);

    assert_int_equal(fy_topo_load_synthetic(&t, "not a topology"), -EINVAL);
    assert_null(t);
}

/* The CPU backend's gpu worker computes the model: it gets the opt worker's cores too, the io
 * worker keeps its own; the other lists are those of the CUDA placement, which does not change. */
static void test_default_cpu_backend(void **state)
{
    struct fy_topo *t = NULL;
    struct fy_affinity a, cuda;

    /* Two cores, as in CI: the gpu worker computes on both instead of on cpu 0 alone. */
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:1 core:2 pu:1"), 0);
    assert_int_equal(fy_affinity_default_cpu_backend(t, &a), 0);
    assert_string_equal(a.gpu, "0-1");
    assert_string_equal(a.io, "0");
    assert_string_equal(a.opt, "0-1");
    assert_int_equal(a.numa_node, 0);
    assert_int_equal(fy_affinity_default(t, &cuda), 0);
    assert_string_equal(cuda.gpu, "0");
    fy_topo_destroy(&t);

    assert_int_equal(fy_topo_load_synthetic(&t, "numa:1 core:1 pu:1"), 0);
    assert_int_equal(fy_affinity_default_cpu_backend(t, &a), 0);
    assert_string_equal(a.gpu, "0");
    assert_string_equal(a.io, "0");
    assert_string_equal(a.opt, "0");
    fy_topo_destroy(&t);

    /* Sixteen cores on one node: every core but the io worker's. */
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:1 core:16 pu:1"), 0);
    assert_int_equal(fy_affinity_default_cpu_backend(t, &a), 0);
    assert_string_equal(a.gpu, "0,2-15");
    assert_string_equal(a.io, "1");
    assert_string_equal(a.opt, "2-15");
    assert_int_equal(fy_affinity_default(t, &cuda), 0);
    assert_string_equal(cuda.gpu, "0");
    assert_string_equal(cuda.io, "1");
    assert_string_equal(cuda.opt, "2-15");
    fy_topo_destroy(&t);

    /* Two nodes: the placement node's cores, not the other node's; with the store's disk on the
     * other node the io worker goes there and the gpu worker has the whole node. */
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:2 core:8 pu:1"), 0);
    assert_int_equal(fy_affinity_default_cpu_backend(t, &a), 0);
    assert_string_equal(a.gpu, "0,2-7");
    assert_string_equal(a.io, "1");
    assert_string_equal(a.opt, "2-7");
    assert_int_equal(a.numa_node, 0);
    assert_int_equal(fy_topo_set_ssd_numa_node(t, 1), 0);
    assert_int_equal(fy_affinity_default_cpu_backend(t, &a), 0);
    assert_string_equal(a.gpu, "0-7");
    assert_string_equal(a.io, "8");
    assert_string_equal(a.opt, "1-7");
    assert_int_equal(a.io_near_ssd, 1);
    fy_topo_destroy(&t);

    /* Two PUs per core: one thread per core, on its first PU. */
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:1 core:4 pu:2"), 0);
    assert_int_equal(fy_affinity_default_cpu_backend(t, &a), 0);
    assert_string_equal(a.gpu, "0,4,6");
    assert_string_equal(a.io, "2");
    assert_string_equal(a.opt, "4,6");
    /* --affinity on top of it: the workers it does not name keep these lists */
    assert_int_equal(fy_affinity_parse(t, "io=6", &a), 0);
    assert_string_equal(a.gpu, "0,4,6");
    assert_string_equal(a.io, "6");
    fy_topo_destroy(&t);
}

static void test_parse_override(void **state)
{
    struct fy_topo *t = NULL;
    struct fy_affinity a, before;
    assert_int_equal(fy_topo_load_synthetic(&t, "numa:2 core:8 pu:1"), 0);
    assert_int_equal(fy_affinity_default(t, &a), 0);

    assert_int_equal(fy_affinity_parse(t, "gpu=8,io=9,opt=10-15", &a), 0);
    assert_string_equal(a.gpu, "8");
    assert_string_equal(a.io, "9");
    assert_string_equal(a.opt, "10-15");
    assert_int_equal(a.numa_node, 1); /* follows opt */

    /* Partial: others keep their lists. */
    assert_int_equal(fy_affinity_parse(t, "io=3", &a), 0);
    assert_string_equal(a.gpu, "8");
    assert_string_equal(a.io, "3");
    assert_string_equal(a.opt, "10-15");

    /* Continued list, normalized. */
    assert_int_equal(fy_affinity_parse(t, "opt=2,3,4-6", &a), 0);
    assert_string_equal(a.opt, "2-6");
    assert_int_equal(a.numa_node, 0);
    assert_int_equal(fy_affinity_parse(t, "opt=0,1", &a), 0);
    assert_string_equal(a.opt, "0-1");
    assert_int_equal(fy_affinity_parse(t, " gpu = 5 , opt=1, 7 ", &a), 0);
    assert_string_equal(a.gpu, "5");
    assert_string_equal(a.opt, "1,7");

    /* Errors, usage errors of --affinity, leave *inout untouched. */
    before = a;
    const char *bad[] = {
        "cpu=1",                    /* unknown worker */
        "gpu=",                     /* empty list */
        "opt=1,,2",                 /* empty item */
        "gpu=3-1",                  /* backwards */
        "gpu=x",                    /* not a number */
        "1,gpu=2",                  /* no worker before the token */
        "gpu=0,gpu=1",              /* twice */
        "opt=1,1",                  /* duplicate cpu */
        "gpu=100000",               /* no such cpu */
        "opt=0-16",                 /* 16 does not exist */
        "",                         /* empty spec */
        "gpu=0,io=1,",              /* trailing comma */
        "gpu=99999999999999999999", /* overflow */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(fy_affinity_parse(t, bad[i], &a), -FY_EUSAGE);
        assert_memory_equal(&a, &before, sizeof a);
    }
    assert_int_equal(fy_affinity_parse(t, NULL, &a), -FY_EUSAGE);

    /* Not allowed for this process. */
    assert_int_equal(fy_topo_restrict(t, "2-15"), 0);
    assert_int_equal(fy_affinity_parse(t, "gpu=1", &a), -FY_EUSAGE);
    assert_int_equal(fy_affinity_parse(t, "gpu=2", &a), 0);
    fy_topo_destroy(&t);

    /* This machine: cpu 100000 does not exist, the first allowed cpu works. */
    assert_int_equal(fy_affinity_default(topo, &a), 0);
    before = a;
    assert_int_equal(fy_affinity_parse(topo, "opt=100000", &a), -FY_EUSAGE);
    assert_memory_equal(&a, &before, sizeof a);
    char spec[600];
    snprintf(spec, sizeof spec, "gpu=%s,io=%s", a.io, a.gpu);
    assert_int_equal(fy_affinity_parse(topo, spec, &a), 0);
    assert_string_equal(a.gpu, before.io);
    assert_string_equal(a.io, before.gpu);
}

static void test_bind_self(void **state)
{
    if (!fy_topo_cpu_allowed(topo, 0)) {
        printf("# skip: cpu 0 is not allowed for this process\n");
        skip();
    }
    char orig[256], actual[256];
    assert_int_equal(fy_topo_get_binding(topo, orig, sizeof orig), 0);
    int rc = fy_topo_bind_self(topo, "0", actual, sizeof actual);
    if (rc == -EPERM || rc == -ENOSYS) {
        printf("# skip: this system refuses cpu binding (%s)\n", strerror(-rc));
        skip();
    }
    assert_int_equal(rc, 0);
    assert_string_equal(actual, "0");
    char now[256];
    assert_int_equal(fy_topo_get_binding(topo, now, sizeof now), 0);
    assert_string_equal(now, "0");

    assert_int_equal(fy_topo_bind_self(topo, "100000", actual, sizeof actual), -EINVAL);
    assert_int_equal(fy_topo_bind_self(topo, "bogus", actual, sizeof actual), -EINVAL);

    assert_int_equal(fy_topo_bind_thread(topo, 0), 0);
    assert_int_equal(fy_topo_bind_thread(topo, 100000), -EINVAL);
    assert_int_equal(fy_topo_bind_thread(topo, -1), -EINVAL);

    assert_int_equal(fy_topo_bind_self(topo, orig, actual, sizeof actual), 0);
    assert_string_equal(actual, orig);
}

static void test_bind_memory(void **state)
{
    const size_t len = 2u << 20;
    /* Over-allocate to carve a 2 MiB aligned range. */
    uint8_t *raw = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(raw != MAP_FAILED);
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + len - 1) & ~(uintptr_t)(len - 1));
    struct fy_affinity a;
    assert_int_equal(fy_affinity_default(topo, &a), 0);

    assert_int_equal(fy_topo_bind_memory(topo, p + 1, len - 4096, a.numa_node), -EINVAL);
    assert_int_equal(fy_topo_bind_memory(topo, p, len, 100000), -EINVAL);
    int rc = fy_topo_bind_memory(topo, p, len, a.numa_node);
    if (rc == 0) {
        memset(p, 1, len); /* pages fault in under the binding */
        assert_int_equal(p[len - 1], 1);
    }
    munmap(raw, 2 * len);
    if (rc < 0) {
        assert_true(rc == -ENOSYS || rc == -EPERM || rc == -EXDEV || rc == -EINVAL);
        printf("# skip: memory binding refused here (%s); callers warn and continue\n",
               strerror(-rc));
        skip();
    }
}

int main(void)
{
    fy_log_init("test", FY_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_describe),
        cmocka_unit_test(test_cpulist_valid),
        cmocka_unit_test(test_cpulist_errors),
        cmocka_unit_test(test_default_this_machine),
        cmocka_unit_test(test_default_synthetic_two_nodes),
        cmocka_unit_test(test_default_io_near_ssd),
        cmocka_unit_test(test_locate_ssd_this_machine),
        cmocka_unit_test(test_default_synthetic_small_and_smt),
        cmocka_unit_test(test_default_cpu_backend),
        cmocka_unit_test(test_parse_override),
        cmocka_unit_test(test_bind_self),
        cmocka_unit_test(test_bind_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
