/* Extent allocator over one contiguous arena (the memory registered once with the fabric).
 * Thread-safe: extents are freed from the fabric thread when a transfer's last
 * reference drops. Knows nothing of the module API or libfabric. */
#ifndef LMCV_ARENA_H
#define LMCV_ARENA_H
#include <stddef.h>
#include <stdint.h>

typedef struct lmcv_arena lmcv_arena;

lmcv_arena *lmcv_arena_create(size_t bytes);
void lmcv_arena_destroy(lmcv_arena *a);
void *lmcv_arena_base(const lmcv_arena *a);
size_t lmcv_arena_size(const lmcv_arena *a);
/* Offset of a free extent of at least len bytes, or -1 when none is large enough. */
int64_t lmcv_arena_alloc(lmcv_arena *a, size_t len);
void lmcv_arena_free(lmcv_arena *a, int64_t off, size_t len);
size_t lmcv_arena_used(lmcv_arena *a);

#endif
