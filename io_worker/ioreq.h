/* The io_uring engine's requests and their completions (io_worker/ring.h takes them), and the
 * alignment every request keeps. */
#ifndef FY_IOREQ_H
#define FY_IOREQ_H

#include <stddef.h>
#include <stdint.h>

/* O_DIRECT alignment required of every offset, length and buffer address. */
#define FY_RING_ALIGN 4096u

enum fy_io_dir { FY_IO_READ = 0, FY_IO_WRITE = 1 };

struct fy_io_req {
    enum fy_io_dir dir;
    unsigned file; /* index into the files given to fy_ring_register_files */
    uint64_t file_offset;
    void *buf;
    size_t len;
    uint64_t tag; /* returned unchanged in fy_io_done */
};

struct fy_io_done {
    uint64_t tag;
    int result; /* 0 or -errno */
};

#endif
