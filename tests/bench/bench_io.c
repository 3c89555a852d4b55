/* Sequential bandwidth of the fy_ring engine (fixed buffers, registered O_DIRECT file), for a
 * side-by-side comparison with fio's io_uring engine (tests/bench/bench_io.sh); and, with --rw
 * alternate, the rates of reads and writes that take turns chunk by chunk as the io worker's
 * state traffic does, back to back or with the disk left idle between (--gap-ms): a virtual
 * disk's rates depend on the pattern (and drift over minutes), and the pipeline's bound uses them. */
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

#include "common/base/log.h"
#include "io_worker/ring.h"

static void usage(void)
{
    fprintf(stderr, "usage: bench_io --file PATH --size BYTES --block BYTES --qd N --rw read|write "
                    "[--seconds S]\n"
                    "       bench_io --file PATH --size BYTES --block BYTES --qd N --rw alternate "
                    "--chunk BYTES [--gap-ms MS] [--seconds S]\n"
                    "  alternate: read a chunk, write it back, go on to the next, for at least S "
                    "seconds\n  and one pass over the file (laid out first with --rw write), "
                    "idle MS ms after each write\n"
                    "  sizes take K, M, G, T suffixes (powers of 1024)\n");
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

/* Moves `count` blocks from block `first` on (the buffers taken in turn), all queued at once up to
 * the ring's slots; returns when the last is done. */
static int transfer_span(struct fy_ring *r, char *mem, unsigned slots, uint64_t block,
                         enum fy_io_dir dir, uint64_t first, uint64_t count)
{
    struct fy_io_done done[64];
    uint64_t issued = 0, completed = 0;
    while (completed < count) {
        while (issued < count && issued - completed < slots) {
            struct fy_io_req q = {.dir = dir,
                                  .file = 0,
                                  .file_offset = (first + issued) * block,
                                  .buf = mem + (size_t)(issued % slots) * block,
                                  .len = block,
                                  .tag = issued};
            int rc = fy_ring_submit(r, &q);
            if (rc < 0)
                return rc;
            issued++;
        }
        int n = fy_ring_poll(r, done, 64, 10000);
        if (n < 0)
            return n;
        for (int i = 0; i < n; i++)
            if (done[i].result < 0)
                return done[i].result;
        completed += (uint64_t)n;
    }
    return 0;
}

/* --rw alternate: per chunk, a read then a write of the same bytes; each direction timed alone. */
static int alternate(struct fy_ring *r, char *mem, unsigned slots, uint64_t size, uint64_t block,
                     uint64_t chunk, double seconds, long gap_ms, unsigned long qd)
{
    uint64_t per_chunk = chunk / block, chunks = size / chunk, moved = 0;
    double busy[2] = {0, 0}, t0 = now_s();
    struct timespec gap = {.tv_sec = gap_ms / 1000, .tv_nsec = (gap_ms % 1000) * 1000000};
    for (; moved < chunks || now_s() - t0 < seconds; moved++) {
        for (int w = 0; w < 2; w++) {
            double t = now_s();
            int rc = transfer_span(r, mem, slots, block, w ? FY_IO_WRITE : FY_IO_READ,
                                   (moved % chunks) * per_chunk, per_chunk);
            if (rc < 0)
                return rc;
            busy[w] += now_s() - t;
        }
        struct timespec left = gap;
        while (gap_ms > 0 && nanosleep(&left, &left) != 0)
            if (errno != EINTR)
                return -errno;
    }
    double bytes = (double)moved * (double)chunk;
    printf("fuyou-io rw=alternate bs=%" PRIu64 " qd=%lu chunk=%" PRIu64 " gap_ms=%ld bytes=%.0f "
           "each way, seconds=%.3f, read_GBps=%.3f write_GBps=%.3f both_GBps=%.3f\n",
           block, qd, chunk, gap_ms, bytes, now_s() - t0, bytes / busy[0] / 1e9,
           bytes / busy[1] / 1e9, 2 * bytes / (busy[0] + busy[1]) / 1e9);
    return 0;
}

/* The command line. */
struct bench_args {
    const char *file, *rw;
    uint64_t size, block, chunk;
    unsigned long qd;
    long gap_ms;
    double seconds;
    int alternating, writing;
};

/* Reads and checks the options into a; -1 to go on, else the exit code (0 after --help). */
static int parse_args(int argc, char **argv, struct bench_args *a)
{
    *a = (struct bench_args){.block = 1 << 20, .qd = 32, .seconds = 5.0};
    static const struct option longopts[] = {
        {"file", required_argument, 0, 'f'}, {"size", required_argument, 0, 's'},
        {"block", required_argument, 0, 'b'}, {"qd", required_argument, 0, 'q'},
        {"rw", required_argument, 0, 'r'},    {"seconds", required_argument, 0, 't'},
        {"chunk", required_argument, 0, 'c'}, {"gap-ms", required_argument, 0, 'g'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'f': a->file = optarg; break;
        case 's':
            if (parse_size(optarg, &a->size) < 0) {
                fprintf(stderr, "bench_io: --size %s is not a size such as 4G\n", optarg);
                return 2;
            }
            break;
        case 'b':
            if (parse_size(optarg, &a->block) < 0) {
                fprintf(stderr, "bench_io: --block %s is not a size such as 1M\n", optarg);
                return 2;
            }
            break;
        case 'c':
            if (parse_size(optarg, &a->chunk) < 0) {
                fprintf(stderr, "bench_io: --chunk %s is not a size such as 256M\n", optarg);
                return 2;
            }
            break;
        case 'g': a->gap_ms = strtol(optarg, NULL, 10); break;
        case 'q': a->qd = strtoul(optarg, NULL, 10); break;
        case 'r': a->rw = optarg; break;
        case 't': a->seconds = strtod(optarg, NULL); break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    a->alternating = a->rw != NULL && strcmp(a->rw, "alternate") == 0;
    if (a->file == NULL || a->rw == NULL || a->size == 0 ||
        (strcmp(a->rw, "read") && strcmp(a->rw, "write") && !a->alternating)) {
        usage();
        return 2;
    }
    if (a->alternating &&
        (a->chunk == 0 || a->chunk % a->block || a->size % a->chunk || a->gap_ms < 0)) {
        fprintf(stderr, "bench_io: --rw alternate needs a --chunk that is a multiple of --block "
                        "and divides --size, and a --gap-ms of 0 or more\n");
        return 2;
    }
    if (a->block == 0 || a->block % 4096 || a->size % a->block || a->qd == 0 || a->qd > 4096) {
        fprintf(stderr, "bench_io: --block must be a non-zero multiple of 4096 dividing --size, "
                        "and --qd between 1 and 4096\n");
        return 2;
    }
    a->writing = strcmp(a->rw, "write") == 0;
    return -1;
}

/* --rw read|write: the file's blocks in order, round and round, every slot kept busy, for at
 * least a->seconds and one pass; prints the rate. */
static int sequential(struct fy_ring *r, char *mem, unsigned slots, const struct bench_args *a)
{
    uint64_t block = a->block, nblocks = a->size / block, next = 0, issued = 0, completed = 0;
    uint64_t passes_blocks = 0;
    unsigned outstanding = 0;
    struct fy_io_done done[64];
    int rc = 0;
    double t0 = now_s(), elapsed = 0;
    int stop = 0;
    for (;;) {
        while (!stop && outstanding < slots) {
            struct fy_io_req q = {.dir = a->writing ? FY_IO_WRITE : FY_IO_READ,
                                  .file = 0,
                                  .file_offset = next * block,
                                  .buf = mem + (size_t)(issued % slots) * block,
                                  .len = block,
                                  .tag = issued};
            if ((rc = fy_ring_submit(r, &q)) < 0)
                return rc;
            issued++;
            outstanding++;
            if (++next == nblocks)
                next = 0;
        }
        if (outstanding == 0)
            break;
        int n = fy_ring_poll(r, done, 64, 10000);
        if (n < 0)
            return n;
        for (int i = 0; i < n; i++)
            if (done[i].result < 0)
                return done[i].result;
        outstanding -= (unsigned)n;
        completed += (uint64_t)n;
        passes_blocks += (uint64_t)n;
        elapsed = now_s() - t0;
        if (!stop && elapsed >= a->seconds && passes_blocks >= nblocks)
            stop = 1;
    }
    elapsed = now_s() - t0;
    double bytes = (double)completed * (double)block;
    printf("fuyou-io rw=%s bs=%" PRIu64 " qd=%lu bytes=%.0f seconds=%.3f GBps=%.3f\n", a->rw,
           block, a->qd, bytes, elapsed, bytes / elapsed / 1e9);
    return 0;
}

int main(int argc, char **argv)
{
    fy_log_init("bench", FY_LOG_WARN);
    struct bench_args a;
    int exit_code = parse_args(argc, argv, &a);
    if (exit_code >= 0)
        return exit_code;
    int fd = open(a.file, O_RDWR | O_DIRECT | (a.writing ? O_CREAT : 0), 0644);
    if (fd < 0) {
        fprintf(stderr, "bench_io: open %s with O_DIRECT: %s\n", a.file, strerror(errno));
        return 1;
    }
    if (!a.writing) { /* reading, or alternating: the file holds data already */
        off_t end = lseek(fd, 0, SEEK_END);
        if (end < (off_t)a.size) {
            fprintf(stderr, "bench_io: %s holds %lld bytes, fewer than --size %" PRIu64
                            ": lay it out first with --rw write\n",
                    a.file, (long long)end, a.size);
            return 1;
        }
    }
    /* Twice the queue depth in slots, so the ring refills from its own queue without a gap. */
    unsigned slots = (unsigned)a.qd * 2;
    size_t mem_len = (size_t)slots * a.block;
    char *mem = mmap(NULL, mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        fprintf(stderr, "bench_io: mmap %zu bytes: %s\n", mem_len, strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < mem_len; i += 8)
        *(uint64_t *)(mem + i) = i * 0x9e3779b97f4a7c15ull;

    struct fy_ring *r = NULL;
    struct fy_ring_opts ro = {.queue_depth = (unsigned)a.qd, .block_size = a.block};
    const char *names[1] = {a.file};
    if (fy_ring_new(&r, &ro) < 0 || fy_ring_register_memory(r, mem, mem_len) < 0 ||
        fy_ring_register_files(r, &fd, names, 1) < 0)
        return 1;

    int rc = a.alternating ? alternate(r, mem, slots, a.size, a.block, a.chunk, a.seconds,
                                       a.gap_ms, a.qd)
                           : sequential(r, mem, slots, &a);
    fy_ring_destroy(&r);
    close(fd);
    munmap(mem, mem_len);
    if (rc < 0) { /* "alternate failed" for --rw alternate, as rw says */
        fprintf(stderr, "bench_io: %s failed: %s\n", a.rw, strerror(-rc));
        return 1;
    }
    return 0;
}
