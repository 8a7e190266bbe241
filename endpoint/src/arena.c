/* First-fit allocator with an address-ordered free list and coalescing. Extents are
 * rounded to 4 KiB so that page-aligned RMA and O(values) free-list length hold; the
 * reference endpoint stores few, large values, so first-fit is adequate. */
#include "arena.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#define ARENA_ALIGN 4096u

typedef struct extent {
    size_t off, len;
    struct extent *next;
} extent;

struct lmcv_arena {
    void *base;
    size_t size, used;
    extent *free_list;
    pthread_mutex_t lock;
};

static size_t round_up(size_t n) { return (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1); }

lmcv_arena *lmcv_arena_create(size_t bytes) {
    lmcv_arena *a = calloc(1, sizeof(*a));
    if (!a) return NULL;
    a->size = round_up(bytes);
    /* mmap: page-aligned, lazily backed, and not counted by the server's allocator. */
    a->base = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    a->free_list = malloc(sizeof(extent));
    if (a->base == MAP_FAILED || !a->free_list) {
        if (a->base != MAP_FAILED) munmap(a->base, a->size);
        free(a->free_list);
        free(a);
        return NULL;
    }
    *a->free_list = (extent){0, a->size, NULL};
    pthread_mutex_init(&a->lock, NULL);
    return a;
}

void lmcv_arena_destroy(lmcv_arena *a) {
    if (!a) return;
    for (extent *e = a->free_list, *n; e; e = n) { n = e->next; free(e); }
    munmap(a->base, a->size);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

void *lmcv_arena_base(const lmcv_arena *a) { return a->base; }
size_t lmcv_arena_size(const lmcv_arena *a) { return a->size; }

size_t lmcv_arena_used(lmcv_arena *a) {
    pthread_mutex_lock(&a->lock);
    size_t u = a->used;
    pthread_mutex_unlock(&a->lock);
    return u;
}

int64_t lmcv_arena_alloc(lmcv_arena *a, size_t len) {
    size_t need = round_up(len ? len : 1);
    int64_t off = -1;
    pthread_mutex_lock(&a->lock);
    for (extent **pp = &a->free_list; *pp; pp = &(*pp)->next) {
        extent *e = *pp;
        if (e->len < need) continue;
        off = (int64_t)e->off;
        e->off += need;
        e->len -= need;
        if (!e->len) { *pp = e->next; free(e); }
        a->used += need;
        break;
    }
    pthread_mutex_unlock(&a->lock);
    return off;
}

void lmcv_arena_free(lmcv_arena *a, int64_t off, size_t len) {
    size_t need = round_up(len ? len : 1), o = (size_t)off;
    pthread_mutex_lock(&a->lock);
    extent *prev = NULL, *cur = a->free_list;
    while (cur && cur->off < o) { prev = cur; cur = cur->next; }
    if (prev && prev->off + prev->len == o) {
        prev->len += need; /* merge left, then maybe right */
        if (cur && prev->off + prev->len == cur->off) { prev->len += cur->len; prev->next = cur->next; free(cur); }
    } else if (cur && o + need == cur->off) {
        cur->off = o;
        cur->len += need;
    } else {
        extent *e = malloc(sizeof(*e));
        if (e) { /* on OOM the extent leaks: safe, merely lost capacity */
            *e = (extent){o, need, cur};
            if (prev) prev->next = e; else a->free_list = e;
        }
    }
    a->used -= need;
    pthread_mutex_unlock(&a->lock);
}
