/* Session table and the checks a transfer's triples go through (see session.h). */
#include "session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static lmcv_session *table;
static size_t count, cap;

lmcv_session *lmcv_session_find(unsigned long long client_id) {
    for (size_t i = 0; i < count; i++) if (table[i].client_id == client_id) return &table[i];
    return NULL;
}

lmcv_session *lmcv_session_add(unsigned long long client_id, uint64_t peer, const unsigned char *addr,
                               size_t addr_len) {
    if (addr_len > LMCV_MAX_ADDR) return NULL;
    if (count == cap) {
        size_t ncap = cap ? cap * 2 : 16;
        lmcv_session *t = realloc(table, ncap * sizeof(*t));
        if (!t) return NULL;
        table = t;
        cap = ncap;
    }
    lmcv_session *s = &table[count++];
    memset(s, 0, sizeof(*s));
    s->client_id = client_id;
    s->peer = peer;
    memcpy(s->addr, addr, addr_len);
    s->addr_len = addr_len;
    s->state = LMCV_SESSION_ACTIVE;
    return s;
}

void lmcv_session_remove(lmcv_session *s) {
    *s = table[--count];
}

size_t lmcv_session_count(void) { return count; }

int lmcv_session_covers(const lmcv_session *s, const lmcv_seg *segs, int nsegs) {
    if (s->nregions == 0) return s->unconfined;
    for (int i = 0; i < nsegs; i++) {
        const lmcv_seg *g = &segs[i];
        int inside = 0;
        for (int r = 0; r < s->nregions && !inside; r++) {
            const lmcv_region *m = &s->regions[r];
            /* g->addr + g->len cannot wrap: the parser refused such triples. */
            inside = g->rkey == m->rkey && g->addr >= m->addr && g->addr - m->addr <= m->len &&
                     g->len <= m->len - (g->addr - m->addr);
        }
        if (!inside) return 0;
    }
    return 1;
}

int lmcv_session_prove(lmcv_session *s, const unsigned char *proof, size_t n) {
    if (s->state != LMCV_SESSION_PROVING) return 0;
    unsigned char diff = n != LMCV_NONCE_BYTES;
    for (size_t i = 0; i < LMCV_NONCE_BYTES; i++) diff |= (unsigned char)((i < n ? proof[i] : 0) ^ s->nonce[i]);
    /* One answer per nonce: a wrong proof ends the session's chance. */
    s->state = diff ? LMCV_SESSION_FAILED : LMCV_SESSION_ACTIVE;
    memset(s->nonce, 0, sizeof(s->nonce));
    return !diff;
}

int lmcv_random(void *buf, size_t n) {
    unsigned char *p = buf;
    while (n) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}
