/* See lru.h. */
#include "lru.h"

#include <pthread.h>
#include <stddef.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static lmcv_lru_node *head, *tail; /* head: least recently used */

void lmcv_lru_lock(void) { pthread_mutex_lock(&lock); }
void lmcv_lru_unlock(void) { pthread_mutex_unlock(&lock); }

void lmcv_lru_add_locked(lmcv_lru_node *n) {
    if (n->linked) lmcv_lru_remove_locked(n);
    n->prev = tail;
    n->next = NULL;
    if (tail) tail->next = n; else head = n;
    tail = n;
    n->linked = 1;
}

void lmcv_lru_remove_locked(lmcv_lru_node *n) {
    if (!n->linked) return;
    if (n->prev) n->prev->next = n->next; else head = n->next;
    if (n->next) n->next->prev = n->prev; else tail = n->prev;
    n->prev = n->next = NULL;
    n->linked = 0;
}

void lmcv_lru_touch(lmcv_lru_node *n) {
    pthread_mutex_lock(&lock);
    if (n->linked && n != tail) {
        lmcv_lru_add_locked(n);
    }
    pthread_mutex_unlock(&lock);
}

lmcv_lru_node *lmcv_lru_rotate_locked(void) {
    lmcv_lru_node *n = head;
    if (n && n != tail) {
        lmcv_lru_add_locked(n);
    }
    return n;
}
