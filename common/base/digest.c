/* XXH3-64 through xxhash.h's inline implementation, so the build needs the header only (Debian's
 * libxxhash-dev) and no shared library at run time. */
#include "common/base/digest.h"

#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t fy_digest(const void *data, size_t len) { return (uint64_t)XXH3_64bits(data, len); }

uint64_t fy_digest_zeroing(const void *data, size_t len, size_t hole, size_t hole_len)
{
    static const unsigned char zero[64];
    const unsigned char *b = data;
    XXH3_state_t st; /* on the stack: nothing to allocate, nothing to fail */
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, b, hole);
    XXH3_64bits_update(&st, zero, hole_len);
    XXH3_64bits_update(&st, b + hole + hole_len, len - hole - hole_len);
    return (uint64_t)XXH3_64bits_digest(&st);
}

uint64_t fy_digest_u64s(const uint64_t *values, size_t n)
{
    unsigned char buf[8 * 64];
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (size_t i = 0; i < n; i++) {
        for (int b = 0; b < 8; b++)
            buf[8 * (i % 64) + b] = (unsigned char)(values[i] >> (8 * b));
        if (i % 64 == 63 || i == n - 1)
            XXH3_64bits_update(&st, buf, 8 * (i % 64 + 1));
    }
    return (uint64_t)XXH3_64bits_digest(&st);
}

struct fy_digest_state {
    XXH3_state_t *xxh;
};

struct fy_digest_state *fy_digest_begin(void)
{
    struct fy_digest_state *d = malloc(sizeof *d);
    if (d == NULL)
        return NULL;
    d->xxh = XXH3_createState();
    if (d->xxh == NULL || XXH3_64bits_reset(d->xxh) != XXH_OK) {
        XXH3_freeState(d->xxh);
        free(d);
        return NULL;
    }
    return d;
}

void fy_digest_update(struct fy_digest_state *d, const void *data, size_t len)
{
    XXH3_64bits_update(d->xxh, data, len);
}

uint64_t fy_digest_end(struct fy_digest_state *d)
{
    uint64_t v = (uint64_t)XXH3_64bits_digest(d->xxh);
    XXH3_freeState(d->xxh);
    free(d);
    return v;
}
