/* Fabric sessions: one per client connection that sent HELLO, keyed by client id. A
 * session holds the peer's address handle, whether the peer proved it owns that address
 * (docs/security.md, "Server module and fabric peers"), and the memory regions the peer
 * declared; transfers are confined to them. Plain data and algorithms: no module API, no
 * libfabric. Main thread only. */
#ifndef LMCV_SESSION_H
#define LMCV_SESSION_H
#include <stddef.h>
#include <stdint.h>

#include "fabric.h"

#define LMCV_NONCE_BYTES 16
#define LMCV_MAX_REGIONS 32
#define LMCV_MAX_ADDR 512 /* bytes of a peer's fabric address */

/* ACTIVE: transfers allowed. PENDING: HELLO ... PROOF answered, waiting for PROVE.
 * PROVING: the nonce is being read back. FAILED: the proof failed; nothing more allowed. */
enum { LMCV_SESSION_ACTIVE = 0, LMCV_SESSION_PENDING = 1, LMCV_SESSION_PROVING = 2, LMCV_SESSION_FAILED = 3 };

typedef struct {
    uint64_t rkey, addr, len;
} lmcv_region;

typedef struct {
    unsigned long long client_id;
    uint64_t peer;
    /* The fabric address the session was opened for: a DMA.* command names it again, and
     * must name this one (one connection, one peer). */
    unsigned char addr[LMCV_MAX_ADDR];
    size_t addr_len;
    int state;
    unsigned char nonce[LMCV_NONCE_BYTES];
    int nregions; /* 0: none declared: no triple goes, unless unconfined */
    /* 1 only for a session without regions on a `require_proof no` server: the upstream
     * dialect, whose clients cannot declare regions, so any triple goes (docs/security.md). */
    int unconfined;
    lmcv_region regions[LMCV_MAX_REGIONS];
} lmcv_session;

lmcv_session *lmcv_session_find(unsigned long long client_id);
/* A new session (state ACTIVE, no regions); NULL when out of memory. The pointer is valid
 * until the next add or remove. */
lmcv_session *lmcv_session_add(unsigned long long client_id, uint64_t peer, const unsigned char *addr,
                               size_t addr_len);
void lmcv_session_remove(lmcv_session *s);
size_t lmcv_session_count(void);
/* 1 when every segment lies inside one declared region with its key (or the session is
 * unconfined); a session that declared none covers nothing. */
int lmcv_session_covers(const lmcv_session *s, const lmcv_seg *segs, int nsegs);
/* Compares the bytes read back with the nonce (constant time) and moves PROVING to ACTIVE
 * or FAILED; 1 when proven. */
int lmcv_session_prove(lmcv_session *s, const unsigned char *proof, size_t n);
/* Fills buf from the kernel's random source; 0 on success. */
int lmcv_random(void *buf, size_t n);

#endif
