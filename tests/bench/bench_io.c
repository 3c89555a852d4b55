/* Sequential bandwidth of the fy_ring engine (fixed buffers, registered O_DIRECT file), for a
 * side-by-side comparison with fio's io_uring engine (tests/bench/bench_io.sh). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "io_worker/ring.h"

static void usage(void)
{
    fprintf(stderr, "usage: bench_io --file PATH --size BYTES --block BYTES --qd N --rw read|write "
                    "[--seconds S]\n  sizes take K, M, G, T suffixes (powers of 1024)\n");
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -EINVAL;
    uint64_t mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    case 't': case 'T': mul = 1ull << 40; end++; break;
    default: break;
    }
    if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end != '\0' || v > UINT64_MAX / mul)
        return -EINVAL;
    *out = v * mul;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    fy_log_init("bench", FY_LOG_WARN);
    const char *file = NULL, *rw = NULL;
    uint64_t size = 0, block = 1 << 20;
    unsigned long qd = 32;
    double seconds = 5.0;
    static const struct option longopts[] = {
        {"file", required_argument, 0, 'f'}, {"size", required_argument, 0, 's'},
        {"block", required_argument, 0, 'b'}, {"qd", required_argument, 0, 'q'},
        {"rw", required_argument, 0, 'r'},    {"seconds", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'f': file = optarg; break;
        case 's':
            if (parse_size(optarg, &size) < 0) {
                fprintf(stderr, "bench_io: --size %s is not a size such as 4G\n", optarg);
                return 2;
            }
            break;
        case 'b':
            if (parse_size(optarg, &block) < 0) {
                fprintf(stderr, "bench_io: --block %s is not a size such as 1M\n", optarg);
                return 2;
            }
            break;
        case 'q': qd = strtoul(optarg, NULL, 10); break;
        case 'r': rw = optarg; break;
        case 't': seconds = strtod(optarg, NULL); break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (file == NULL || rw == NULL || size == 0 || (strcmp(rw, "read") && strcmp(rw, "write"))) {
        usage();
        return 2;
    }
    if (block == 0 || block % 4096 || size % block || qd == 0 || qd > 4096) {
        fprintf(stderr, "bench_io: --block must be a non-zero multiple of 4096 dividing --size, "
                        "and --qd between 1 and 4096\n");
        return 2;
    }
    int writing = strcmp(rw, "write") == 0;
    int fd = open(file, O_RDWR | O_DIRECT | (writing ? O_CREAT : 0), 0644);
    if (fd < 0) {
        fprintf(stderr, "bench_io: open %s with O_DIRECT: %s\n", file, strerror(errno));
        return 1;
    }
    if (!writing) {
        off_t end = lseek(fd, 0, SEEK_END);
        if (end < (off_t)size) {
            fprintf(stderr, "bench_io: %s holds %lld bytes, fewer than --size %" PRIu64
                            ": lay it out first with --rw write\n",
                    file, (long long)end, size);
            return 1;
        }
    }
    /* Twice the queue depth in slots, so the ring refills from its own queue without a gap. */
    unsigned slots = (unsigned)qd * 2;
    size_t mem_len = (size_t)slots * block;
    char *mem = mmap(NULL, mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        fprintf(stderr, "bench_io: mmap %zu bytes: %s\n", mem_len, strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < mem_len; i += 8)
        *(uint64_t *)(mem + i) = i * 0x9e3779b97f4a7c15ull;

    struct fy_ring *r = NULL;
    struct fy_ring_opts ro = {.queue_depth = (unsigned)qd, .block_size = block};
    const char *names[1] = {file};
    if (fy_ring_new(&r, &ro) < 0 || fy_ring_register_memory(r, mem, mem_len) < 0 ||
        fy_ring_register_files(r, &fd, names, 1) < 0)
        return 1;

    uint64_t nblocks = size / block, next = 0, issued = 0, completed = 0, passes_blocks = 0;
    unsigned outstanding = 0;
    struct fy_io_done done[64];
    int rc = 0;
    double t0 = now_s(), elapsed = 0;
    int stop = 0;
    for (;;) {
        while (!stop && outstanding < slots) {
            struct fy_io_req q = {.dir = writing ? FY_IO_WRITE : FY_IO_READ,
                                  .file = 0,
                                  .file_offset = next * block,
                                  .buf = mem + (size_t)(issued % slots) * block,
                                  .len = block,
                                  .tag = issued};
            if ((rc = fy_ring_submit(r, &q)) < 0)
                goto out;
            issued++;
            outstanding++;
            if (++next == nblocks)
                next = 0;
        }
        if (outstanding == 0)
            break;
        int n = fy_ring_poll(r, done, 64, 10000);
        if (n < 0) {
            rc = n;
            goto out;
        }
        for (int i = 0; i < n; i++) {
            if (done[i].result < 0) {
                rc = done[i].result;
                goto out;
            }
        }
        outstanding -= (unsigned)n;
        completed += (uint64_t)n;
        passes_blocks += (uint64_t)n;
        elapsed = now_s() - t0;
        if (!stop && elapsed >= seconds && passes_blocks >= nblocks)
            stop = 1;
    }
    elapsed = now_s() - t0;
    double bytes = (double)completed * (double)block;
    printf("fuyou-io rw=%s bs=%" PRIu64 " qd=%lu bytes=%.0f seconds=%.3f GBps=%.3f\n", rw, block,
           qd, bytes, elapsed, bytes / elapsed / 1e9);
out:
    fy_ring_destroy(&r);
    close(fd);
    munmap(mem, mem_len);
    if (rc < 0) {
        fprintf(stderr, "bench_io: %s failed: %s\n", rw, strerror(-rc));
        return 1;
    }
    return 0;
}
