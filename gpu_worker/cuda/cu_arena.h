/* The GPU memory arena: one cudaMalloc of exactly the budgeted bytes at start; every device buffer
 * of the backend is carved from it (256-byte aligned), so the budget is hard and the peak is known. */
#ifndef FY_CU_ARENA_H
#define FY_CU_ARENA_H

#include <stddef.h>

struct fy_cu_arena {
    char *base;
    size_t size;
    size_t used;
    size_t peak;
};

/* Allocates the arena (-ENOMEM with the free memory named when the device cannot hold it). */
int fy_cu_arena_init(struct fy_cu_arena *a, size_t bytes);
void fy_cu_arena_release(struct fy_cu_arena *a);
/* Bytes a request of n bytes takes in the arena (alignment included). */
size_t fy_cu_arena_footprint(size_t n);
/* A buffer of n bytes, or NULL when the arena is exhausted (the caller reports what did not fit). */
void *fy_cu_arena_take(struct fy_cu_arena *a, size_t n);
/* Everything taken after `mark` (a value of a->used) is released. */
void fy_cu_arena_reset(struct fy_cu_arena *a, size_t mark);

/* One buffer of a list carved together: its bytes and where its address goes. */
struct fy_cu_piece {
    size_t bytes;
    void **ptr;
};
/* Bytes the n pieces take in the arena (alignment included). */
size_t fy_cu_arena_pieces_footprint(const struct fy_cu_piece *p, int n);
/* Takes every piece in order, or none: -ENOMEM (not logged: the caller says what it was for) with
 * the arena as it was and every *ptr NULL. */
int fy_cu_arena_take_pieces(struct fy_cu_arena *a, const struct fy_cu_piece *p, int n);

#endif
