/* The arena's values in least-recently-used order, for arena eviction
 * (docs/fabric-keyspace.md): an intrusive doubly linked list behind a mutex. Values are
 * freed on the main thread, and by the server's lazy-free thread after FLUSHALL ASYNC, so
 * every change takes the lock. Plain data: no module API, no libfabric. */
#ifndef LMCV_LRU_H
#define LMCV_LRU_H

typedef struct lmcv_lru_node {
    struct lmcv_lru_node *prev, *next;
    int linked;
} lmcv_lru_node;

void lmcv_lru_lock(void);
void lmcv_lru_unlock(void);
/* Calls ending in _locked need the lock held; lmcv_lru_touch takes it. */
void lmcv_lru_add_locked(lmcv_lru_node *n);    /* as the most recently used */
void lmcv_lru_remove_locked(lmcv_lru_node *n); /* no-op when not linked */
void lmcv_lru_touch(lmcv_lru_node *n);         /* most recently used now (when linked) */
/* The least recently used node, moved to the most recent end (so a caller that cannot
 * evict it moves on to the next); NULL when empty. */
lmcv_lru_node *lmcv_lru_rotate_locked(void);

#endif
