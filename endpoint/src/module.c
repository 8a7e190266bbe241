/* Command layer of the endpoint: parses BLOB.* arguments, owns the keyspace values and the
 * per-connection fabric sessions, and decides between a synchronous reply (bulk mode,
 * misses, refusals) and a blocked client served by the fabric thread (RMA mode).
 * Never calls libfabric directly (fabric.c does) and never waits on the network.
 * Why values are a module type over one arena: docs/fabric-keyspace.md. */
#include <pthread.h>
#include <signal.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../include/lmcv_commands.h"
#include "../include/lmcv_replies.h"
#include "arena.h"
#include "crc32c.h"
#include "fabric.h"
#include "lru.h"
#include "rm_api.h"
#include "session.h"

/* ---- values ------------------------------------------------------------------------ */

/* One stored value: an extent of the arena. Referenced by the keyspace and by every
 * transfer touching it, so DEL during a GET never frees bytes still being written out.
 * While a key holds it, it sits in the arena's LRU list under that key's name (arena
 * eviction, below). lru first: a list node is the blob. */
typedef struct blob {
    lmcv_lru_node lru;
    RMString *name; /* the key holding it (changed under the LRU lock); NULL: not evictable */
    int db;         /* and its database */
    int64_t off;
    uint64_t len;
    uint32_t crc;
    int refs;
} blob;

static struct {
    lmcv_arena *arena;
    lmcv_fabric *fabric;
    RMType *type;
    long long default_timeout_ms, max_timeout_ms;
    char provider[64], bind[64];
    unsigned long long arena_mb, chunk_kb;
    /* main-thread counters */
    unsigned long long bulk_gets, bulk_sets, rma_gets, rma_sets, misses, refused, objects;
    unsigned long long proofs_ok, proofs_failed, outside_regions, evicted, propagated;
    /* the DMA dialect: values moved, and bytes copied between Valkey strings and the arena */
    unsigned long long dma_sets, dma_gets, dma_copied_bytes;
    int evict;         /* arena_eviction lru (1) | none (0): docs/fabric-keyspace.md */
    int propagate;     /* propagate yes (1, the default) | no (0): docs/fabric-keyspace.md */
    /* 1 (the default): refuse HELLO without PROOF, and a session moves bytes only inside
     * the regions it declared. 0 (`require_proof no`, for clients that cannot prove, e.g.
     * other large-object clients): any client may claim any fabric address, and a session
     * that declared no region reaches anything its peer registered (docs/security.md). */
    int require_proof;
    int extensions;    /* 0: the upstream dialect only (HELLO takes exactly the address) */
    /* 1: this server takes our declaration that the keys may move by CLUSTER MIGRATESLOTS
     * (Valkey 9.0+); 0: it has no such option, so resharding is the legacy MIGRATE kind. */
    int atomic_slot_migration;
    /* Where an RMA command's time goes: queued+moving on the fabric thread, then waiting
     * for the main thread to run the reply callback (both summed, in microseconds). */
    unsigned long long fabric_usec, unblock_usec;
} G = {.require_proof = 1, .extensions = 1, .evict = 1, .propagate = 1, .default_timeout_ms = 5000, .max_timeout_ms = 60000, .provider = "tcp;ofi_rxm",
       .bind = "", .arena_mb = 1024, .chunk_kb = 1024};

static blob *blob_new(uint64_t len) {
    int64_t off = lmcv_arena_alloc(G.arena, len);
    if (off < 0) return NULL;
    blob *b = malloc(sizeof(*b));
    if (!b) { lmcv_arena_free(G.arena, off, len); return NULL; }
    *b = (blob){.off = off, .len = len, .refs = 1};
    return b;
}

static char *blob_ptr(const blob *b) { return (char *)lmcv_arena_base(G.arena) + b->off; }
static void blob_ref(blob *b) { __atomic_add_fetch(&b->refs, 1, __ATOMIC_ACQ_REL); }
/* May run on the fabric thread: the arena is thread-safe. */
static void blob_unref(blob *b) {
    if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        lmcv_arena_free(G.arena, b->off, b->len);
        free(b);
    }
}

/* ---- data type callbacks ------------------------------------------------------------- */

/* The keyspace lets go of b (DEL, expiry, overwrite, FLUSHALL -- ASYNC on the lazy-free
 * thread): out of the LRU list, then its reference. */
static void type_free(void *v) {
    blob *b = v;
    lmcv_lru_lock();
    RMString *name = b->name;
    b->name = NULL;
    lmcv_lru_remove_locked(&b->lru);
    lmcv_lru_unlock();
    if (name) RM_FreeString(NULL, name);
    G.objects--;
    blob_unref(b);
}

/* b is now the value of the key `name` in database db: the most recently used of the arena. */
static void lru_hold(blob *b, const RMString *name, int db) {
    size_t n;
    const char *p = RM_StringPtrLen(name, &n);
    RMString *copy = RM_CreateString(NULL, p, n);
    lmcv_lru_lock();
    RMString *old = b->name;
    b->name = copy;
    b->db = db;
    lmcv_lru_add_locked(&b->lru);
    lmcv_lru_unlock();
    if (old) RM_FreeString(NULL, old);
}
static size_t type_mem_usage(const void *v) { return sizeof(blob) + ((const blob *)v)->len; }
/* Encoding 2 saves the length and CRC32C beside the bytes so that a load can check all
 * three against each other; encoding 1 (the bytes alone) still loads. */
static void type_rdb_save(RMIO *io, void *v) {
    blob *b = v;
    RM_SaveUnsigned(io, b->len);
    RM_SaveUnsigned(io, b->crc);
    RM_SaveStringBuffer(io, blob_ptr(b), b->len);
}

/* Runs on RDB load, RESTORE and replication. Every field is checked and any doubt refuses
 * the value (NULL: "Bad data format" for RESTORE, a clean load failure for a file): with
 * RM_OPTIONS_HANDLE_IO_ERRORS set, a short or mistyped field is an IO error reported here
 * rather than a server panic. */
static void *type_rdb_load(RMIO *io, int encver) {
    if (encver != 1 && encver != LMCV_TYPE_ENCVER) return NULL;
    uint64_t want_len = 0, want_crc = 0;
    if (encver >= 2) {
        want_len = RM_LoadUnsigned(io);
        want_crc = RM_LoadUnsigned(io);
        if (RM_IsIOError(io) || want_crc > UINT32_MAX || want_len > lmcv_arena_size(G.arena)) return NULL;
    }
    size_t n = 0;
    char *buf = RM_LoadStringBuffer(io, &n);
    if (!buf || RM_IsIOError(io)) {
        if (buf) RM_Free(buf);
        return NULL;
    }
    uint32_t crc = lmcv_crc32c(0, buf, n);
    blob *b = NULL;
    if (n <= lmcv_arena_size(G.arena) && (encver < 2 || (n == want_len && crc == want_crc))) b = blob_new(n);
    if (b) {
        memcpy(blob_ptr(b), buf, n);
        b->crc = crc;
        G.objects++;
        const RMString *name = RM_GetKeyNameFromIO ? RM_GetKeyNameFromIO(io) : NULL;
        if (name && RM_GetDbIdFromIO) lru_hold(b, name, RM_GetDbIdFromIO(io)); /* else not evictable */
    }
    RM_Free(buf);
    return b;
}
static void type_aof_rewrite(RMIO *aof, RMString *key, void *v) {
    blob *b = v;
    /* The deprecated name: it also takes the empty values encoding 1 could hold. */
    RM_EmitAOF(aof, LMCV_CMD_LEGACY_SET, "sb", key, blob_ptr(b), b->len);
}

/* ---- sessions: one fabric peer per client connection, created by HELLO (session.c) -- */

static void on_client_change(RMCtx *ctx, RMEvent e, uint64_t sub, void *data) {
    (void)ctx; (void)e;
    if (sub != RM_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || !G.fabric) return;
    lmcv_session *s = lmcv_session_find(((RMClientInfoHead *)data)->id);
    if (!s) return;
    lmcv_fabric_forget_peer(G.fabric, s->peer);
    lmcv_session_remove(s);
}

/* The server is exiting: stop the fabric thread and close libfabric now. Left running, the
 * thread polls a CQ while libfabric's own destructor tears providers down at exit(), which
 * crashes the process on its way out. */
static void on_shutdown(RMCtx *ctx, RMEvent e, uint64_t sub, void *data) {
    (void)ctx; (void)e; (void)sub; (void)data;
    lmcv_fabric *f = G.fabric;
    G.fabric = NULL;
    lmcv_fabric_close(f);
}

/* Whatever ends the process (exit() from a signal handler libfabric installed at load time
 * included), stop the fabric thread before libfabric's own destructor frees the providers it
 * polls: this library is finalised before the libfabric it depends on. */
__attribute__((destructor)) static void on_unload(void) {
    lmcv_fabric *f = G.fabric;
    G.fabric = NULL;
    lmcv_fabric_close(f);
}

/* Stop signals. Loading libfabric replaces Valkey's SIGTERM/SIGINT handlers (its shm
 * provider installs its own from a library constructor, before OnLoad runs), after which a
 * SIGTERM ended the server with exit(1) and no shutdown sequence. We take the signals back
 * and do what Valkey's handler does: note the request in the handler (async-signal-safe),
 * then run SHUTDOWN from the event loop, which saves and exits as configured. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void stop_timer(RMCtx *ctx, void *data) {
    (void)data;
    if (stop_requested) {
        stop_requested = 0;
        RM_Log(ctx, RM_LOG_NOTICE, "lmcvblob: stop signal received, shutting down");
        errno = 0;
        /* NOW: a module context cannot block waiting for replicas; saving is still as configured. */
        RMCallReply *r = RM_Call(ctx, "SHUTDOWN", "c", "NOW");
        /* reached only if the shutdown was refused */
        size_t n = 0;
        const char *why = r ? RM_CallReplyStringPtr(r, &n) : NULL;
        RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: SHUTDOWN refused: %.*s (errno %d)", why ? (int)n : 0, why ? why : "", errno);
        if (r) RM_FreeCallReply(r);
    }
    RM_CreateTimer(ctx, 100, stop_timer, NULL);
}

static void take_back_stop_signals(RMCtx *ctx) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    RM_CreateTimer(ctx, 100, stop_timer, NULL);
}

/* ---- error replies, in the dialect of the command that failed ------------------------ */

/* UPSTREAM: the valkey-large-object names and strings; LEGACY: our deprecated names. */
typedef enum { UPSTREAM = 0, LEGACY = 1 } dialect;

#define LMCV_ERROR_ID(id, args, up, old) E_##id,
typedef enum { LMCV_ERRORS(LMCV_ERROR_ID) E_COUNT } error_id;
#undef LMCV_ERROR_ID
#define LMCV_ERROR_TEXT(id, args, up, old) {up, old},
static const char *const ERROR_TEXT[E_COUNT][2] = {LMCV_ERRORS(LMCV_ERROR_TEXT)};
#undef LMCV_ERROR_TEXT

/* Formats (a, b) into the message; a column may use fewer of them (lmcv_replies.h). */
static int reply_err(RMCtx *ctx, dialect d, error_id e, unsigned long long a, unsigned long long b) {
    char msg[256];
    snprintf(msg, sizeof(msg), ERROR_TEXT[e][d], a, b);
    return RM_ReplyWithError(ctx, msg);
}

static int reply_err_s(RMCtx *ctx, dialect d, error_id e, const char *detail) {
    char msg[256];
    snprintf(msg, sizeof(msg), ERROR_TEXT[e][d], detail);
    return RM_ReplyWithError(ctx, msg);
}

static int refuse(RMCtx *ctx, dialect d, error_id e) {
    G.refused++;
    return reply_err(ctx, d, e, 0, 0);
}

/* ---- argument parsing ---------------------------------------------------------------- */

static int parse_u64(RMString *s, uint64_t *out) {
    size_t n;
    const char *p = RM_StringPtrLen(s, &n);
    if (n == 0 || n > 20) return -1;
    char buf[24];
    memcpy(buf, p, n);
    buf[n] = 0;
    for (size_t i = 0; i < n; i++) if (buf[i] < '0' || buf[i] > '9') return -1;
    errno = 0;
    unsigned long long v = strtoull(buf, NULL, 10);
    if (errno) return -1;
    *out = v;
    return 0;
}

static int is_word(RMString *s, const char *w) {
    size_t n;
    const char *p = RM_StringPtrLen(s, &n);
    return n == strlen(w) && strncasecmp(p, w, n) == 0;
}

typedef struct {
    lmcv_seg segs[LMCV_MAX_SEGS];
    int nsegs;
    uint64_t window;
    long long px_ms, timeout_ms;
    int partial;
    int has_crc; /* RDMA_SET ... CRC <crc32c>: what the payload must hash to */
    uint32_t want_crc;
    int dma; /* DMA_NONE, or how a DMA.* transfer replies */
} req_args;

/* Triples from argv[i] (each field checked, as valkey-large-object names its refusals),
 * then our keyword options: PX, TIMEOUT, PARTIAL. E_COUNT when all is well. */
static error_id parse_tail(RMString **argv, int argc, int i, req_args *a) {
    memset(a, 0, sizeof(*a));
    a->timeout_ms = G.default_timeout_ms;
    while (i < argc) {
        uint64_t k, ad, ln;
        if (parse_u64(argv[i], &k)) {
            if (a->nsegs || is_word(argv[i], LMCV_OPT_PX) || is_word(argv[i], LMCV_OPT_TIMEOUT) ||
                is_word(argv[i], LMCV_OPT_PARTIAL))
                break; /* the options (after the triples, if any) */
            return i + 2 < argc ? E_RKEY : E_TRIPLES;
        }
        if (i + 2 >= argc) return E_TRIPLES;
        if (a->nsegs == LMCV_MAX_SEGS) return E_TOO_MANY;
        if (parse_u64(argv[i + 1], &ad)) return E_ADDR;
        if (parse_u64(argv[i + 2], &ln) || ln == 0 || ad + ln < ad || a->window + ln < a->window) return E_ADDRLEN;
        a->segs[a->nsegs++] = (lmcv_seg){k, ad, ln};
        a->window += ln;
        i += 3;
    }
    while (i < argc) {
        uint64_t v;
        if (!G.extensions) return a->nsegs ? E_TRIPLES : E_SYNTAX;
        if (is_word(argv[i], LMCV_OPT_PARTIAL)) { a->partial = 1; i++; continue; }
        if (i + 1 >= argc || parse_u64(argv[i + 1], &v)) return E_SYNTAX;
        if (is_word(argv[i], LMCV_OPT_PX)) {
            /* As the core SET: positive, and now + ms must not overflow (the expiry pass
             * asserts on a negative absolute time). */
            long long now = RM_Milliseconds();
            if (v == 0 || v > (uint64_t)(LLONG_MAX - now)) return E_EXPIRE;
            a->px_ms = (long long)v;
        } else if (is_word(argv[i], LMCV_OPT_TIMEOUT) && v > 0) {
            a->timeout_ms = (long long)v < G.max_timeout_ms ? (long long)v : G.max_timeout_ms;
        } else {
            return E_SYNTAX;
        }
        i += 2;
    }
    return E_COUNT;
}

/* Opens a key and classifies it: 1 ours, 0 empty, -1 another type (key stays open). */
static int open_blob_key(RMCtx *ctx, RMString *name, int mode, RMKey **key, blob **b) {
    *key = RM_OpenKey(ctx, name, mode);
    *b = NULL;
    int t = RM_KeyType(*key);
    if (t == RM_KEYTYPE_EMPTY) return 0;
    if (t != RM_KEYTYPE_MODULE || RM_ModuleTypeGetType(*key) != G.type) return -1;
    *b = RM_ModuleTypeGetValue(*key);
    return 1;
}

/* 1 when name holds a value of another type (which the upstream dialect never replaces). */
static int other_type(RMCtx *ctx, RMString *name) {
    RMKey *key;
    blob *b;
    int kind = open_blob_key(ctx, name, RM_READ, &key, &b);
    RM_CloseKey(key);
    return kind < 0;
}

/* ---- propagation: what replicas and the AOF must redo ------------------------------------ */

/* 1 when this write must reach replicas or the AOF. Valkey propagates nothing a module does
 * unless told, and an RMA SET's bytes sit in a peer's memory that no replica or AOF loader can
 * reach: so a stored value goes out as the inline BLOB.SET with its bytes, a copy of the value
 * into the replication stream. That copy is paid only where something reads the stream: the
 * AOF is on, or this primary keeps a replication backlog (a replica attached, or one that may
 * resync from it). A replica that attaches later gets the values by full sync (RDB). On a
 * replica, its own replicas get the primary's stream, so only its AOF counts. A cluster
 * primary always propagates: while CLUSTER MIGRATESLOTS moves a slot, the target learns of
 * the writes made meanwhile only from this stream, and no context flag or INFO field says
 * that a move is running (a primary without replicas pays one discarded copy per write). */
static int should_propagate(RMCtx *ctx) {
    if (!G.propagate) return 0; /* `propagate no`: replicas and the AOF lack fabric-written values */
    int f = RM_GetContextFlags(ctx);
    if (f & RM_CTX_FLAGS_LOADING) return 0;
    if (f & RM_CTX_FLAGS_AOF) return 1;
    if (!(f & RM_CTX_FLAGS_MASTER)) return 0;
    if (f & RM_CTX_FLAGS_CLUSTER) return 1;
    RMServerInfoData *info = RM_GetServerInfo(ctx, "replication");
    if (!info) return 1; /* unknown: propagate, the safe side */
    int err = 0;
    unsigned long long backlog = RM_ServerInfoGetFieldUnsigned(info, "repl_backlog_active", &err);
    RM_FreeServerInfo(ctx, info);
    return err || backlog;
}

/* The value of key (just stored, ttl_ms left or RM_NO_EXPIRE) as replicas must apply it: the
 * deprecated inline BLOB.SET (it takes any value, empty ones included, and replaces any type,
 * which the primary already decided) and an absolute expiry, so that a replica's copy expires
 * when the primary's does however late it applies the stream. Two commands: Valkey wraps them
 * in MULTI/EXEC. */
static void propagate_store(RMCtx *ctx, RMString *name, const blob *b, long long ttl_ms) {
    if (!should_propagate(ctx)) return;
    RM_Replicate(ctx, LMCV_CMD_LEGACY_SET, "sb", name, blob_ptr(b), (size_t)b->len);
    if (ttl_ms != RM_NO_EXPIRE) RM_Replicate(ctx, "PEXPIREAT", "sl", name, RM_Milliseconds() + ttl_ms);
    G.propagated++;
}

/* Stores b (taking over one reference) under name, replacing whatever was there, and
 * propagates the value where replicas or the AOF need it. */
static void store_blob(RMCtx *ctx, RMString *name, blob *b, long long px_ms) {
    RMKey *key = RM_OpenKey(ctx, name, RM_READ | RM_WRITE);
    int t = RM_KeyType(key);
    if (t != RM_KEYTYPE_EMPTY && (t != RM_KEYTYPE_MODULE || RM_ModuleTypeGetType(key) != G.type))
        RM_DeleteKey(key);
    RM_ModuleTypeSetValue(key, G.type, b);
    G.objects++;
    lru_hold(b, name, RM_GetSelectedDb(ctx));
    if (px_ms > 0) {
        /* Checked at parse time; an RMA SET stores later, so check again (clamping a value
         * that would now overflow rather than storing it without expiry). */
        long long room = LLONG_MAX - RM_Milliseconds();
        RM_SetExpire(key, px_ms < room ? px_ms : room);
    }
    long long ttl = RM_GetExpire(key);
    RM_CloseKey(key);
    propagate_store(ctx, name, b, ttl);
}

/* ---- arena eviction ------------------------------------------------------------------- */

#define EVICT_MAX 64 /* values one command may evict (or find gone) while looking for room */

/* A new value of len bytes, evicting others when the arena has no room. The arena is a cache,
 * as the keyspace is under an allkeys maxmemory policy, and maxmemory cannot see it (mmap):
 * without eviction, values stored without expiry filled it for good, and one tenant that
 * filled it refused every other tenant's writes (and fabric address proofs) with NOSPACE.
 * Victims go least recently used first (stored or read); a value a transfer still reads
 * frees its extent when that transfer ends. `arena_eviction none` keeps NOSPACE. */
static blob *blob_new_evicting(RMCtx *ctx, uint64_t len) {
    blob *b = blob_new(len);
    int propagate = -1; /* asked once, at the first victim */
    for (int tries = 0; !b && G.evict && len <= lmcv_arena_size(G.arena) && tries < EVICT_MAX; tries++) {
        lmcv_lru_lock();
        blob *v = (blob *)lmcv_lru_rotate_locked();
        RMString *name = NULL;
        int db = 0;
        if (v && v->name) { /* copied under the lock: a lazy-free thread may free v meanwhile */
            size_t n;
            const char *p = RM_StringPtrLen(v->name, &n);
            name = RM_CreateString(ctx, p, n);
            db = v->db;
        }
        lmcv_lru_unlock();
        if (!v) break;
        if (!name) continue;
        int here = RM_GetSelectedDb(ctx);
        if (db != here && RM_SelectDb(ctx, db) != RM_OK) { RM_FreeString(ctx, name); continue; }
        RMKey *key = RM_OpenKey(ctx, name, RM_READ | RM_WRITE);
        /* The key may hold another value by now (or none, or live in another database):
         * only ever delete the value we picked. v is compared, never dereferenced. */
        if (RM_KeyType(key) == RM_KEYTYPE_MODULE && RM_ModuleTypeGetType(key) == G.type &&
            RM_ModuleTypeGetValue(key) == v) {
            RM_DeleteKey(key); /* type_free: out of the list, the keyspace's reference dropped */
            G.evicted++;
            /* Replicas evict nothing by themselves: they follow the primary's DELs (in the
             * victim's database, selected here). */
            if (propagate < 0) propagate = should_propagate(ctx);
            if (propagate) RM_Replicate(ctx, "DEL", "s", name);
        }
        RM_CloseKey(key);
        if (db != here) RM_SelectDb(ctx, here);
        RM_FreeString(ctx, name);
        b = blob_new(len);
    }
    return b;
}

/* ---- RMA transfers: blocked client <-> fabric thread --------------------------------- */

/* What a transfer is for, which decides its reply. */
enum { KIND_GET = 1, KIND_SET = 2, KIND_PROVE = 3 };

/* How a transfer of the DMA dialect replies (0: the large-object shapes). */
enum { DMA_NONE = 0, DMA_REPLY_LEN = 1, DMA_REPLY_LEN_CRC = 2 };

typedef struct {
    int kind, status, has_crc, dma;
    dialect d;
    uint64_t inflight, obj_len, timeout_ms, finished_ns;
    uint32_t crc, want_crc;
    long long px_ms;
    blob *obj; /* SET success: the reference the keyspace takes over */
    unsigned char proof[LMCV_NONCE_BYTES]; /* PROVE: what the peer's memory held */
    char errmsg[96];
} xfer_result;

typedef struct {
    lmcv_xfer x;
    int kind, has_crc, dma;
    dialect d;
    uint32_t want_crc;
    uint64_t submitted_ns;
    RMBlockedClient *bc;
    blob *obj; /* the transfer's own reference */
    uint64_t obj_len, timeout_ms;
    long long px_ms;
} pending;

static void xfer_finished(lmcv_xfer *x, int status, uint64_t inflight) {
    pending *p = (pending *)x;
    xfer_result *r = calloc(1, sizeof(*r));
    if (!r) abort(); /* cannot reply without it; a lost reply would hang the client */
    r->kind = p->kind;
    r->dma = p->dma;
    r->d = p->d;
    r->has_crc = p->has_crc;
    r->want_crc = p->want_crc;
    r->status = status;
    r->inflight = inflight;
    r->obj_len = p->obj_len;
    r->timeout_ms = p->timeout_ms;
    r->px_ms = p->px_ms;
    r->finished_ns = lmcv_now_ns();
    __atomic_add_fetch(&G.fabric_usec, (r->finished_ns - p->submitted_ns) / 1000, __ATOMIC_RELAXED);
    memcpy(r->errmsg, x->errmsg, sizeof(r->errmsg));
    if (status == LMCV_XFER_OK && p->kind == KIND_PROVE) {
        /* The bytes read back from the peer: compared with the nonce on the main thread. */
        memcpy(r->proof, blob_ptr(p->obj), LMCV_NONCE_BYTES);
    }
    if (status == LMCV_XFER_OK && p->kind == KIND_SET) {
        /* CRC folded in on the fabric thread as chunks landed (fabric.c): the main
         * thread never scans large values. */
        p->obj->crc = x->crc;
        blob_ref(p->obj);
        r->obj = p->obj;
    }
    r->crc = p->obj->crc;
    RM_UnblockClient(p->bc, r);
}

static void xfer_release(lmcv_xfer *x) {
    pending *p = (pending *)x;
    blob_unref(p->obj);
    free(p);
}

static int prove_reply(RMCtx *ctx, xfer_result *r);
static int dma_xfer_reply(RMCtx *ctx, RMString **argv, xfer_result *r);

static int reply_server_addresses(RMCtx *ctx) {
    /* The server's fabric addresses (one per device; this endpoint has one). */
    RM_ReplyWithArray(ctx, 1);
    const char *me = lmcv_fabric_name_hex(G.fabric);
    return RM_ReplyWithStringBuffer(ctx, me, strlen(me));
}

static int xfer_reply(RMCtx *ctx, RMString **argv, int argc) {
    (void)argc;
    xfer_result *r = RM_GetBlockedClientPrivateData(ctx);
    G.unblock_usec += (lmcv_now_ns() - r->finished_ns) / 1000;
    if (r->kind == KIND_PROVE) return prove_reply(ctx, r);
    if (r->status == LMCV_XFER_TIMEDOUT) return reply_err(ctx, r->d, E_TIMEOUT, r->timeout_ms, r->inflight);
    if (r->status == LMCV_XFER_SHUTDOWN) return reply_err(ctx, r->d, E_BUSY, 0, 0);
    if (r->status != LMCV_XFER_OK)
        return reply_err_s(ctx, r->d, r->kind == KIND_SET ? E_XFER_READ : E_XFER_WRITE, r->errmsg);
    /* A SET's bytes arrived while the server pauses writes (CLIENT PAUSE WRITE, a manual
     * failover, the cut-over of CLUSTER MIGRATESLOTS): a normal command would wait for the
     * pause to end, but this callback runs now. Storing would change a keyspace the
     * replica or the slot's new owner is taking over as final (and propagating during the
     * pause aborts the server): refuse instead; the client may put again. */
    if (r->kind == KIND_SET && RM_AvoidReplicaTraffic()) return refuse(ctx, r->d, E_PAUSED);
    if (r->dma) return dma_xfer_reply(ctx, argv, r);
    if (r->kind == KIND_SET) {
        if (r->has_crc && r->crc != r->want_crc) return refuse(ctx, r->d, E_CRC); /* xfer_free drops it */
        if (r->d == UPSTREAM && other_type(ctx, argv[1])) return reply_err(ctx, r->d, E_WRONGTYPE, 0, 0);
        store_blob(ctx, argv[1], r->obj, r->px_ms);
        r->obj = NULL;
        return RM_ReplyWithSimpleString(ctx, "OK");
    }
    RM_ReplyWithArray(ctx, 2);
    RM_ReplyWithLongLong(ctx, (long long)r->obj_len);
    return RM_ReplyWithLongLong(ctx, (long long)r->crc);
}

static void xfer_free(RMCtx *ctx, void *priv) {
    (void)ctx;
    xfer_result *r = priv;
    if (r->obj) blob_unref(r->obj); /* client went away (or CRC refused) before a SET was stored */
    free(r);
}

/* Hands obj (one reference taken over) to the fabric thread and blocks the client. */
static int start_xfer(RMCtx *ctx, dialect d, int kind, lmcv_session *s, blob *obj, uint64_t len, req_args *a) {
    pending *p = calloc(1, sizeof(*p));
    if (!p) { blob_unref(obj); return reply_err(ctx, d, E_OOM, 0, 0); }
    int op = kind == KIND_GET ? LMCV_XFER_WRITE : LMCV_XFER_READ;
    p->kind = kind;
    p->dma = a->dma;
    p->d = d;
    p->has_crc = a->has_crc;
    p->want_crc = a->want_crc;
    p->obj = obj;
    p->obj_len = obj->len;
    p->timeout_ms = (uint64_t)a->timeout_ms;
    p->px_ms = a->px_ms;
    p->x.op = op;
    p->x.peer = s->peer;
    p->x.local_off = (uint64_t)obj->off;
    p->x.len = len;
    memcpy(p->x.segs, a->segs, sizeof(a->segs[0]) * (size_t)a->nsegs);
    p->x.nsegs = a->nsegs;
    p->submitted_ns = lmcv_now_ns();
    p->x.deadline_ns = p->submitted_ns + (uint64_t)a->timeout_ms * 1000000ull;
    p->x.want_crc = kind == KIND_SET;
    p->x.quiet = kind == KIND_PROVE;
    p->x.finished = xfer_finished;
    p->x.release = xfer_release;
    /* No timeout callback: the reply comes only from xfer_finished, once the fabric thread
     * is done with the transfer. (With one, CLIENT UNBLOCK could end the block and answer
     * the client while the server still writes into its buffer.) */
    p->bc = RM_BlockClient(ctx, xfer_reply, NULL, xfer_free, 0);
    if (lmcv_fabric_submit(G.fabric, &p->x)) {
        p->x.finished(&p->x, LMCV_XFER_SHUTDOWN, 0);
        p->x.release(&p->x);
    }
    return RM_OK;
}

/* ---- commands ------------------------------------------------------------------------ */

/* A fabric session and a blocked transfer belong to a real client connection: not a
 * transaction or script (no blocking there), not the AOF loader or a replication link
 * (their "client" is no peer of ours). */
static int cannot_block(RMCtx *ctx) {
    return (RM_GetContextFlags(ctx) & (RM_CTX_FLAGS_LUA | RM_CTX_FLAGS_MULTI | RM_CTX_FLAGS_REPLICATED |
                                        RM_CTX_FLAGS_LOADING | RM_CTX_FLAGS_DENY_BLOCKING)) != 0;
}

static int hex_nibble(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Hides argument i (a remote key, an address or a proof) from SLOWLOG and MONITOR. */
static void redact(RMCtx *ctx, int i) {
    if (RM_RedactClientCommandArgument) RM_RedactClientCommandArgument(ctx, i);
}

/* Hides arguments first..argc-1: a triple list the parser refused, whose keys and
 * addresses are not known apart. */
static void redact_from(RMCtx *ctx, int first, int argc) {
    for (int i = first; i < argc; i++) redact(ctx, i);
}

/* 0, or the refusal: E_EMPTY_ADDR, E_BADHEX. */
static error_id parse_hex(RMString *s, unsigned char *out, size_t cap, size_t *len) {
    size_t n;
    const char *hex = RM_StringPtrLen(s, &n);
    if (n == 0) return E_EMPTY_ADDR;
    if (n % 2 || n / 2 > cap) return E_BADHEX;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return E_BADHEX;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    *len = n / 2;
    return E_COUNT;
}

/* RDMA_HELLO <address hex> [PROOF] [REGION <rkey> <addr> <len>]...
 * PROOF: the reply carries a fresh nonce and the session stays pending until the connection
 * has the server read that nonce back from memory at the claimed address (PROVE): only
 * the owner of the address can put it there, and nothing is ever written to an address that
 * is not proven. REGION: the memory the peer lends; every later triple must lie inside one.
 * Both are extensions: without them the command is the upstream one. */
static int do_hello(RMCtx *ctx, RMString **argv, int argc, dialect d) {
    if (argc < 2 || (argc > 2 && !G.extensions)) return RM_WrongArity(ctx);
    if (!G.fabric) return reply_err(ctx, d, E_NOFABRIC, 0, 0);
    if (cannot_block(ctx)) return refuse(ctx, d, E_CANTBLOCK);
    unsigned long long id = RM_GetClientId(ctx);
    if (lmcv_session_find(id)) return reply_err(ctx, d, E_HELLO_TWICE, 0, 0);
    unsigned char addr[512];
    size_t alen = 0;
    error_id e = parse_hex(argv[1], addr, sizeof(addr), &alen);
    if (e != E_COUNT) return refuse(ctx, d, e);
    int proof = 0, nregions = 0;
    lmcv_region regions[LMCV_MAX_REGIONS];
    for (int i = 2; i < argc;) {
        uint64_t k, ad, ln;
        if (is_word(argv[i], LMCV_OPT_PROOF) && !proof) {
            proof = 1;
            i++;
        } else if (is_word(argv[i], LMCV_OPT_REGION) && nregions < LMCV_MAX_REGIONS && i + 3 < argc &&
                   !parse_u64(argv[i + 1], &k) && !parse_u64(argv[i + 2], &ad) && !parse_u64(argv[i + 3], &ln) &&
                   ln > 0 && ad + ln > ad) {
            regions[nregions++] = (lmcv_region){k, ad, ln};
            redact(ctx, i + 1);
            redact(ctx, i + 2);
            i += 4;
        } else {
            return refuse(ctx, d, E_SYNTAX);
        }
    }
    if (!proof && G.require_proof) return refuse(ctx, d, E_PROOF_REQUIRED);
    unsigned char nonce[LMCV_NONCE_BYTES];
    if (proof && lmcv_random(nonce, sizeof(nonce))) return reply_err(ctx, d, E_OOM, 0, 0);
    uint64_t peer;
    if (lmcv_fabric_add_peer(G.fabric, addr, alen, &peer)) return refuse(ctx, d, E_BADADDR);
    lmcv_session *s = lmcv_session_add(id, peer, addr, alen);
    if (!s) { lmcv_fabric_forget_peer(G.fabric, peer); return reply_err(ctx, d, E_OOM, 0, 0); }
    memcpy(s->regions, regions, sizeof(regions[0]) * (size_t)nregions);
    s->nregions = nregions;
    s->unconfined = nregions == 0 && !G.require_proof; /* the upstream dialect declares none */
    if (!proof) return reply_server_addresses(ctx);
    s->state = LMCV_SESSION_PENDING;
    memcpy(s->nonce, nonce, sizeof(nonce));
    /* [[server addresses...], nonce] */
    RM_ReplyWithArray(ctx, 2);
    reply_server_addresses(ctx);
    return RM_ReplyWithStringBuffer(ctx, (const char *)nonce, sizeof(nonce));
}

static int cmd_rdma_hello(RMCtx *ctx, RMString **argv, int argc) { return do_hello(ctx, argv, argc, UPSTREAM); }
static int cmd_legacy_hello(RMCtx *ctx, RMString **argv, int argc) { return do_hello(ctx, argv, argc, LEGACY); }

/* PROVE <rkey> <addr>: the server reads LMCV_NONCE_BYTES there, at the session's address,
 * and compares them with the nonce of HELLO ... PROOF. One attempt per session. */
static int cmd_prove(RMCtx *ctx, RMString **argv, int argc) {
    if (argc != 3 || !G.extensions) return RM_WrongArity(ctx);
    if (!G.fabric) return reply_err(ctx, UPSTREAM, E_NOFABRIC, 0, 0);
    if (cannot_block(ctx)) return refuse(ctx, UPSTREAM, E_CANTBLOCK);
    redact(ctx, 1);
    redact(ctx, 2);
    lmcv_session *s = lmcv_session_find(RM_GetClientId(ctx));
    if (!s) return refuse(ctx, UPSTREAM, E_NOHELLO);
    if (s->state != LMCV_SESSION_PENDING) return refuse(ctx, UPSTREAM, E_NO_PROOF_PENDING);
    req_args a;
    memset(&a, 0, sizeof(a));
    if (parse_u64(argv[1], &a.segs[0].rkey)) return refuse(ctx, UPSTREAM, E_RKEY);
    if (parse_u64(argv[2], &a.segs[0].addr) || a.segs[0].addr + LMCV_NONCE_BYTES < a.segs[0].addr)
        return refuse(ctx, UPSTREAM, E_ADDR);
    a.segs[0].len = LMCV_NONCE_BYTES;
    a.nsegs = 1;
    a.timeout_ms = G.default_timeout_ms;
    if (!lmcv_session_covers(s, a.segs, 1)) {
        G.outside_regions++;
        return refuse(ctx, UPSTREAM, E_OUTSIDE_REGIONS);
    }
    blob *b = blob_new_evicting(ctx, LMCV_NONCE_BYTES);
    if (!b) return reply_err(ctx, UPSTREAM, E_NOSPACE, LMCV_NONCE_BYTES, 0);
    s->state = LMCV_SESSION_PROVING;
    return start_xfer(ctx, UPSTREAM, KIND_PROVE, s, b, LMCV_NONCE_BYTES, &a);
}

static int prove_reply(RMCtx *ctx, xfer_result *r) {
    lmcv_session *s = lmcv_session_find(RM_GetClientId(ctx));
    if (!s) return reply_err(ctx, UPSTREAM, E_NOHELLO, 0, 0);
    int ok = r->status == LMCV_XFER_OK && lmcv_session_prove(s, r->proof, sizeof(r->proof));
    if (!ok) {
        s->state = LMCV_SESSION_FAILED;
        G.proofs_failed++;
        RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: client %llu failed to prove it owns the fabric address it claimed",
               (unsigned long long)s->client_id);
        return reply_err(ctx, UPSTREAM, E_PROOF_WRONG, 0, 0);
    }
    G.proofs_ok++;
    return RM_ReplyWithSimpleString(ctx, "OK");
}

/* s, when it may move a's triples: proven, and every triple inside its regions. NULL after
 * replying the refusal. */
static lmcv_session *session_admits(RMCtx *ctx, dialect d, lmcv_session *s, const req_args *a) {
    if (s->state != LMCV_SESSION_ACTIVE) { refuse(ctx, d, E_NOT_PROVEN); return NULL; }
    if (!lmcv_session_covers(s, a->segs, a->nsegs)) {
        G.outside_regions++;
        refuse(ctx, d, E_OUTSIDE_REGIONS);
        return NULL;
    }
    return s;
}

/* The session behind an RMA command, checked: present, proven, triples inside its
 * regions. NULL after replying the refusal. Redacts the triples' keys and addresses. */
static lmcv_session *rma_session(RMCtx *ctx, dialect d, int first_triple, req_args *a) {
    if (!G.fabric) { reply_err(ctx, d, E_NOFABRIC, 0, 0); return NULL; }
    if (cannot_block(ctx)) { refuse(ctx, d, E_CANTBLOCK); return NULL; }
    for (int i = 0; i < a->nsegs; i++) {
        redact(ctx, first_triple + 3 * i);
        redact(ctx, first_triple + 3 * i + 1);
    }
    lmcv_session *s = lmcv_session_find(RM_GetClientId(ctx));
    if (!s) { refuse(ctx, d, E_NOHELLO); return NULL; }
    return session_admits(ctx, d, s, a);
}

/* Stores an inline value. The upstream dialect refuses an empty value and another type's key. */
static int store_inline(RMCtx *ctx, dialect d, RMString *name, RMString *value, long long px_ms) {
    size_t n;
    const char *v = RM_StringPtrLen(value, &n);
    if (d == UPSTREAM && n == 0) return refuse(ctx, d, E_ZERO_LENGTH);
    if (n > lmcv_arena_size(G.arena)) { G.refused++; return reply_err(ctx, d, E_TOOLARGE, n, lmcv_arena_size(G.arena)); }
    if (d == UPSTREAM && other_type(ctx, name)) return reply_err(ctx, d, E_WRONGTYPE, 0, 0);
    blob *b = blob_new_evicting(ctx, n);
    if (!b) { G.refused++; return reply_err(ctx, d, E_NOSPACE, n, 0); }
    memcpy(blob_ptr(b), v, n);
    b->crc = lmcv_crc32c(0, v, n);
    store_blob(ctx, name, b, px_ms);
    G.bulk_sets++;
    return RM_ReplyWithSimpleString(ctx, "OK");
}

/* Starts an RMA SET of total bytes read from the triples in a (argv[first_triple]...). */
static int start_rma_set(RMCtx *ctx, dialect d, RMString **argv, int first_triple, uint64_t total, req_args *a) {
    lmcv_session *s = rma_session(ctx, d, first_triple, a);
    if (!s) return RM_OK;
    if (d == UPSTREAM && total == 0) return refuse(ctx, d, E_ZERO_LENGTH);
    if (total > lmcv_arena_size(G.arena)) { G.refused++; return reply_err(ctx, d, E_TOOLARGE, total, lmcv_arena_size(G.arena)); }
    if (a->window < total) { G.refused++; return reply_err(ctx, d, E_WINDOW, a->window, total); }
    if (d == UPSTREAM && other_type(ctx, argv[1])) return reply_err(ctx, d, E_WRONGTYPE, 0, 0);
    blob *b = blob_new_evicting(ctx, total);
    if (!b) { G.refused++; return reply_err(ctx, d, E_NOSPACE, total, 0); }
    G.rma_sets++;
    return start_xfer(ctx, d, KIND_SET, s, b, total, a);
}

/* BLOB.TCP_SET key value [PX ms] */
static int cmd_tcp_set(RMCtx *ctx, RMString **argv, int argc) {
    if (argc != 3 && !(argc == 5 && G.extensions)) return RM_WrongArity(ctx);
    req_args a;
    error_id e = parse_tail(argv, argc, 3, &a);
    if (e != E_COUNT || a.nsegs) return refuse(ctx, UPSTREAM, e != E_COUNT ? e : E_SYNTAX);
    return store_inline(ctx, UPSTREAM, argv[1], argv[2], a.px_ms);
}

/* BLOB.RDMA_SET key total-len [CRC crc32c] (rkey addr len)+ [PX ms] [TIMEOUT ms] */
static int cmd_rdma_set(RMCtx *ctx, RMString **argv, int argc) {
    if (argc < 6) return RM_WrongArity(ctx);
    uint64_t total, crc = 0;
    if (parse_u64(argv[2], &total)) return refuse(ctx, UPSTREAM, E_LEN);
    int first = 3, has_crc = 0;
    if (is_word(argv[3], LMCV_OPT_CRC)) {
        if (argc < 8 || parse_u64(argv[4], &crc) || crc > UINT32_MAX) return refuse(ctx, UPSTREAM, E_SYNTAX);
        has_crc = 1;
        first = 5;
    }
    req_args a;
    error_id e = parse_tail(argv, argc, first, &a);
    if (e != E_COUNT) return redact_from(ctx, first, argc), refuse(ctx, UPSTREAM, e);
    if (!a.nsegs || a.partial) return refuse(ctx, UPSTREAM, E_TRIPLES);
    a.has_crc = has_crc;
    a.want_crc = (uint32_t)crc;
    return start_rma_set(ctx, UPSTREAM, argv, first, total, &a);
}

/* Deprecated BLOB.SET: key value [PX ms] (bulk) or key total (rkey addr len)+ [PX] [TIMEOUT]. */
static int cmd_legacy_set(RMCtx *ctx, RMString **argv, int argc) {
    if (argc < 3) return RM_WrongArity(ctx);
    req_args a;
    error_id e = parse_tail(argv, argc, 3, &a);
    if (e != E_COUNT) return refuse(ctx, LEGACY, e);
    if (a.nsegs == 0) return store_inline(ctx, LEGACY, argv[1], argv[2], a.px_ms);
    uint64_t total;
    if (parse_u64(argv[2], &total)) return refuse(ctx, LEGACY, E_SYNTAX);
    return start_rma_set(ctx, LEGACY, argv, 3, total, &a);
}

/* GET of key: inline when a has no triples, else RMA into them. */
static int do_get(RMCtx *ctx, RMString **argv, dialect d, req_args *a) {
    lmcv_session *s = NULL;
    if (a->nsegs && !(s = rma_session(ctx, d, 2, a))) return RM_OK; /* refused before the key is looked at */
    RMKey *key;
    blob *b;
    int kind = open_blob_key(ctx, argv[1], RM_READ, &key, &b);
    if (kind <= 0) {
        RM_CloseKey(key);
        if (kind < 0) return reply_err(ctx, d, E_WRONGTYPE, 0, 0);
        G.misses++;
        return RM_ReplyWithNull(ctx);
    }
    lmcv_lru_touch(&b->lru); /* read: the most recently used */
    if (!a->nsegs) {
        G.bulk_gets++;
        RM_ReplyWithStringBuffer(ctx, blob_ptr(b), b->len);
        RM_CloseKey(key);
        return RM_OK;
    }
    RM_CloseKey(key);
    if (a->window < b->len && !a->partial) { G.refused++; return reply_err(ctx, d, E_WINDOW, a->window, b->len); }
    blob_ref(b); /* the transfer's reference: DEL meanwhile leaves the bytes intact */
    G.rma_gets++;
    return start_xfer(ctx, d, KIND_GET, s, b, a->window < b->len ? a->window : b->len, a);
}

/* BLOB.TCP_GET key */
static int cmd_tcp_get(RMCtx *ctx, RMString **argv, int argc) {
    if (argc != 2) return RM_WrongArity(ctx);
    req_args a;
    memset(&a, 0, sizeof(a));
    return do_get(ctx, argv, UPSTREAM, &a);
}

/* BLOB.RDMA_GET key (rkey addr len)+ [TIMEOUT ms] [PARTIAL] */
static int cmd_rdma_get(RMCtx *ctx, RMString **argv, int argc) {
    if (argc < 5) return RM_WrongArity(ctx);
    req_args a;
    error_id e = parse_tail(argv, argc, 2, &a);
    if (e != E_COUNT) return redact_from(ctx, 2, argc), refuse(ctx, UPSTREAM, e);
    if (!a.nsegs) return refuse(ctx, UPSTREAM, E_TRIPLES);
    return do_get(ctx, argv, UPSTREAM, &a);
}

/* Deprecated BLOB.GET: key (bulk) or key (rkey addr len)+ [TIMEOUT ms] [PARTIAL]. */
static int cmd_legacy_get(RMCtx *ctx, RMString **argv, int argc) {
    if (argc < 2) return RM_WrongArity(ctx);
    req_args a;
    error_id e = parse_tail(argv, argc, 2, &a);
    if (e != E_COUNT) return refuse(ctx, LEGACY, e);
    return do_get(ctx, argv, LEGACY, &a);
}

/* ---- Momento's DMA dialect --------------------------------------------------------------
 * DMA.SET/DMA.GET keep values as plain Valkey strings (a GET reads what DMA.SET wrote; a SET
 * by a RESP worker is served by DMA.GET), and name the client's fabric address in every
 * command. The module API of released Valkey cannot hand a string's memory to another
 * thread safely, nor adopt memory as a string, so each transfer goes through the arena:
 * DMA.SET reads into it and copies into a new string; DMA.GET copies the string into it and
 * writes from there (one copy each way, counted in dma_copied_bytes; a value written by
 * BLOB.* is served from the arena with no copy). Momento's module does without the copies
 * through API that Valkey has not released (docs/fabric-dma-dialect.md). */

/* The connection's session for the address a DMA command names, checked: with
 * require_proof yes it must be a session this connection opened and proved for that
 * address (DMA.HELLO <addr> PROOF, DMA.PROVE); with require_proof no, a connection without
 * one gets an unconfined session for the address it names, as Momento's module does. NULL
 * after replying the refusal. (The caller redacted the address and the region.) */
static lmcv_session *dma_session(RMCtx *ctx, RMString **argv, req_args *a) {
    if (!G.fabric) { reply_err(ctx, UPSTREAM, E_NOFABRIC, 0, 0); return NULL; }
    if (cannot_block(ctx)) { refuse(ctx, UPSTREAM, E_CANTBLOCK); return NULL; }
    unsigned char addr[LMCV_MAX_ADDR];
    size_t alen = 0;
    if (parse_hex(argv[1], addr, sizeof(addr), &alen) != E_COUNT) { refuse(ctx, UPSTREAM, E_DMA_HEX); return NULL; }
    unsigned long long id = RM_GetClientId(ctx);
    lmcv_session *s = lmcv_session_find(id);
    if (!s) {
        if (G.require_proof) { refuse(ctx, UPSTREAM, E_PROOF_REQUIRED); return NULL; }
        uint64_t peer;
        if (lmcv_fabric_add_peer(G.fabric, addr, alen, &peer)) { refuse(ctx, UPSTREAM, E_BADADDR); return NULL; }
        s = lmcv_session_add(id, peer, addr, alen);
        if (!s) { lmcv_fabric_forget_peer(G.fabric, peer); reply_err(ctx, UPSTREAM, E_OOM, 0, 0); return NULL; }
        s->unconfined = 1;
    } else if (s->addr_len != alen || memcmp(s->addr, addr, alen) != 0) {
        refuse(ctx, UPSTREAM, E_DMA_ADDR);
        return NULL;
    }
    return session_admits(ctx, UPSTREAM, s, a);
}

/* argv[2..4]: <rkey> <remote address> <length or capacity>, as one segment of a. 0, or the
 * refusal already sent. */
static int dma_segment(RMCtx *ctx, RMString **argv, req_args *a) {
    memset(a, 0, sizeof(*a));
    a->timeout_ms = G.default_timeout_ms;
    uint64_t rkey, raddr, len;
    if (parse_u64(argv[2], &rkey) || parse_u64(argv[3], &raddr)) return refuse(ctx, UPSTREAM, E_DMA_INT), -1;
    if (parse_u64(argv[4], &len) || raddr + len < raddr) return refuse(ctx, UPSTREAM, E_DMA_LEN), -1;
    a->segs[0] = (lmcv_seg){rkey, raddr, len};
    a->nsegs = len > 0;
    a->window = len;
    return 0;
}

/* Stores len bytes at p as the string value of name (any old value and its TTL go, as with
 * SET) and sends SET to replicas and the AOF where they read the stream. */
static void dma_store_string(RMCtx *ctx, RMString *name, const char *p, size_t len) {
    RMString *v = RM_CreateString(ctx, p, len);
    RMKey *key = RM_OpenKey(ctx, name, RM_WRITE);
    RM_StringSet(key, v);
    RM_CloseKey(key);
    if (should_propagate(ctx)) {
        RM_Replicate(ctx, "SET", "ss", name, v);
        G.propagated++;
    }
    RM_FreeString(ctx, v);
}

/* DMA.GET's reply: n, or [n, crc] when the flag asked for the CRC. */
static int dma_get_reply(RMCtx *ctx, int shape, uint64_t n, uint32_t crc) {
    if (shape == DMA_REPLY_LEN) return RM_ReplyWithLongLong(ctx, (long long)n);
    RM_ReplyWithArray(ctx, 2);
    RM_ReplyWithLongLong(ctx, (long long)n);
    return RM_ReplyWithLongLong(ctx, (long long)crc);
}

/* DMA.HELLO: the server's fabric addresses, and no session (Momento's form: the address
 * travels with each command; with `extensions no` any arguments are ignored, as there).
 * DMA.HELLO <addr hex> [PROOF] [REGION ...]: our extension, BLOB.RDMA_HELLO's session. */
static int cmd_dma_hello(RMCtx *ctx, RMString **argv, int argc) {
    if (argc > 1 && G.extensions) return do_hello(ctx, argv, argc, UPSTREAM);
    if (!G.fabric) return reply_err(ctx, UPSTREAM, E_NOFABRIC, 0, 0);
    RM_ReplyWithArray(ctx, 1);
    return RM_ReplyWithSimpleString(ctx, lmcv_fabric_name_hex(G.fabric));
}

/* DMA.SET <addr hex> <rkey> <remote address> <length> <key> [<crc32c>] -> length */
static int cmd_dma_set(RMCtx *ctx, RMString **argv, int argc) {
    if (argc != 6 && argc != 7) return RM_WrongArity(ctx);
    for (int i = 1; i <= 3; i++) redact(ctx, i); /* address, rkey, remote address: refused or not */
    req_args a;
    if (dma_segment(ctx, argv, &a)) return RM_OK;
    uint64_t crc = 0;
    if (argc == 7) {
        if (parse_u64(argv[6], &crc) || crc > UINT32_MAX) return refuse(ctx, UPSTREAM, E_DMA_CRCARG);
        a.has_crc = 1;
        a.want_crc = (uint32_t)crc;
    }
    a.dma = DMA_REPLY_LEN;
    lmcv_session *s = dma_session(ctx, argv, &a);
    if (!s) return RM_OK;
    uint64_t total = a.window;
    if (total == 0) { /* nothing to read: the empty string (its CRC is 0) */
        if (a.has_crc && a.want_crc != 0) return reply_err(ctx, UPSTREAM, E_DMA_CRC, a.want_crc, 0);
        dma_store_string(ctx, argv[5], "", 0);
        G.dma_sets++;
        return RM_ReplyWithLongLong(ctx, 0);
    }
    if (total > lmcv_arena_size(G.arena)) { G.refused++; return reply_err(ctx, UPSTREAM, E_TOOLARGE, total, 0); }
    /* The arena only passes the bytes on to a string: never evict stored values for it. */
    blob *b = blob_new(total);
    if (!b) { G.refused++; return reply_err(ctx, UPSTREAM, E_NOSPACE, total, 0); }
    G.dma_sets++;
    return start_xfer(ctx, UPSTREAM, KIND_SET, s, b, total, &a);
}

/* DMA.GET <addr hex> <rkey> <remote address> <capacity> <key> [<crc-flag>] -> n | [n, crc] | nil.
 * The flag's presence asks for the CRC; its value is not read (as in Momento's module). */
static int cmd_dma_get(RMCtx *ctx, RMString **argv, int argc) {
    if (argc != 6 && argc != 7) return RM_WrongArity(ctx);
    for (int i = 1; i <= 3; i++) redact(ctx, i); /* address, rkey, remote address: refused or not */
    req_args a;
    if (dma_segment(ctx, argv, &a)) return RM_OK;
    a.dma = argc == 7 ? DMA_REPLY_LEN_CRC : DMA_REPLY_LEN;
    lmcv_session *s = dma_session(ctx, argv, &a);
    if (!s) return RM_OK;
    RMKey *key = RM_OpenKey(ctx, argv[5], RM_READ);
    int t = RM_KeyType(key);
    blob *b = NULL;
    if (t == RM_KEYTYPE_EMPTY) {
        RM_CloseKey(key);
        G.misses++;
        return RM_ReplyWithNull(ctx);
    }
    if (t == RM_KEYTYPE_MODULE && RM_ModuleTypeGetType(key) == G.type) {
        b = RM_ModuleTypeGetValue(key); /* written by BLOB.*: served in place */
        lmcv_lru_touch(&b->lru);
        if (b->len > a.window) { RM_CloseKey(key); G.refused++; return reply_err(ctx, UPSTREAM, E_DMA_CAPACITY, b->len, a.window); }
        blob_ref(b);
    } else if (t == RM_KEYTYPE_STRING) {
        size_t n = 0;
        const char *p = RM_StringDMA(key, &n, RM_READ);
        if (n > a.window) { RM_CloseKey(key); G.refused++; return reply_err(ctx, UPSTREAM, E_DMA_CAPACITY, n, a.window); }
        /* The string may change or go once this command returns: the transfer's bytes are a
         * copy in the arena. A read evicts nothing for it (it would delete values the caller
         * may not even write, and make a replica diverge): no room is NOSPACE, and the
         * client reads over TCP instead. */
        if (n > 0 && !(b = blob_new(n))) { RM_CloseKey(key); G.refused++; return reply_err(ctx, UPSTREAM, E_NOSPACE, n, 0); }
        if (b) {
            memcpy(blob_ptr(b), p, n);
            b->crc = lmcv_crc32c(0, p, n);
            G.dma_copied_bytes += n;
        }
    } else {
        RM_CloseKey(key);
        return reply_err(ctx, UPSTREAM, E_WRONGTYPE, 0, 0);
    }
    RM_CloseKey(key);
    G.dma_gets++;
    if (!b) return dma_get_reply(ctx, a.dma, 0, 0); /* the empty string: nothing to write */
    return start_xfer(ctx, UPSTREAM, KIND_GET, s, b, b->len, &a);
}

/* The reply of a DMA.SET or DMA.GET transfer. */
static int dma_xfer_reply(RMCtx *ctx, RMString **argv, xfer_result *r) {
    /* (A failed transfer was answered by xfer_reply, as in the other dialect.) */
    if (r->kind == KIND_SET) {
        /* xfer_free drops the arena copy in every case */
        if (r->has_crc && r->crc != r->want_crc) return reply_err(ctx, UPSTREAM, E_DMA_CRC, r->want_crc, r->crc);
        dma_store_string(ctx, argv[5], blob_ptr(r->obj), (size_t)r->obj_len);
        G.dma_copied_bytes += r->obj_len;
        return RM_ReplyWithLongLong(ctx, (long long)r->obj_len);
    }
    return dma_get_reply(ctx, r->dma, r->obj_len, r->crc);
}

/* DMA.INFO: the fabric as Momento's module describes it, one "field: value" line each. */
static int cmd_dma_info(RMCtx *ctx, RMString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RM_WrongArity(ctx);
    if (!G.fabric) return reply_err(ctx, UPSTREAM, E_NOFABRIC, 0, 0);
    lmcv_fabric_desc d;
    lmcv_fabric_describe(G.fabric, &d);
    static const char *const mr_names[] = {"LOCAL", "VIRT_ADDR", "ALLOCATED", "PROV_KEY", "ENDPOINT", "HMEM"};
    static const char *const cap_names[] = {"MSG", "RMA", "READ", "WRITE", "REMOTE_READ", "REMOTE_WRITE"};
    char mr[160], caps[160], line[256];
    mr[0] = caps[0] = 0;
    for (unsigned i = 0; i < 6; i++) {
        if (d.mr_flags & (1u << i)) snprintf(mr + strlen(mr), sizeof(mr) - strlen(mr), "%s%s", mr[0] ? "|" : "", mr_names[i]);
        if (d.cap_flags & (1u << i)) snprintf(caps + strlen(caps), sizeof(caps) - strlen(caps), "%s%s", caps[0] ? "|" : "", cap_names[i]);
    }
    RM_ReplyWithArray(ctx, 6);
    snprintf(line, sizeof(line), "provider: %s", lmcv_fabric_provider(G.fabric));
    RM_ReplyWithSimpleString(ctx, line);
    snprintf(line, sizeof(line), "addr_format: %u", d.addr_format);
    RM_ReplyWithSimpleString(ctx, line);
    snprintf(line, sizeof(line), "mr_mode: 0x%llx [%s]", (unsigned long long)d.mr_mode, mr);
    RM_ReplyWithSimpleString(ctx, line);
    snprintf(line, sizeof(line), "caps: 0x%llx [%s]", (unsigned long long)d.caps, caps);
    RM_ReplyWithSimpleString(ctx, line);
    RM_ReplyWithSimpleString(ctx, d.requires_local_mr ? "requires_local_mr: true" : "requires_local_mr: false");
    return RM_ReplyWithSimpleString(ctx, d.virt_addr ? "uses_virtual_addressing: true" : "uses_virtual_addressing: false");
}

/* BLOB.INFO key [LEN | CRC | TIER]: all fields as a flat name/value array, or one value. */
static int cmd_info(RMCtx *ctx, RMString **argv, int argc) {
    if (argc != 2 && argc != 3) return RM_WrongArity(ctx);
    RMKey *key;
    blob *b;
    int kind = open_blob_key(ctx, argv[1], RM_READ, &key, &b);
    RM_CloseKey(key);
    if (kind < 0) return reply_err(ctx, UPSTREAM, E_WRONGTYPE, 0, 0);
    if (argc == 3 && !is_word(argv[2], LMCV_INFO_LEN) && !is_word(argv[2], LMCV_INFO_CRC) &&
        !is_word(argv[2], LMCV_INFO_TIER))
        return refuse(ctx, UPSTREAM, E_INFO_FIELD);
    if (kind == 0) return RM_ReplyWithNull(ctx);
    if (argc == 3) {
        if (is_word(argv[2], LMCV_INFO_LEN)) return RM_ReplyWithLongLong(ctx, (long long)b->len);
        if (is_word(argv[2], LMCV_INFO_CRC)) return RM_ReplyWithLongLong(ctx, (long long)b->crc);
        return RM_ReplyWithSimpleString(ctx, "dram");
    }
    RM_ReplyWithArray(ctx, 6);
    RM_ReplyWithSimpleString(ctx, "len");
    RM_ReplyWithLongLong(ctx, (long long)b->len);
    RM_ReplyWithSimpleString(ctx, "crc");
    RM_ReplyWithLongLong(ctx, (long long)b->crc);
    RM_ReplyWithSimpleString(ctx, "tier");
    return RM_ReplyWithSimpleString(ctx, "dram"); /* one tier: the arena is DRAM */
}

static void info_func(RMInfoCtx *ctx, int for_crash_report) {
    (void)for_crash_report;
    lmcv_fabric_stats st = {0};
    if (G.fabric) lmcv_fabric_stats_get(G.fabric, &st);
    RM_InfoAddSection(ctx, "stats");
    RM_InfoAddFieldCString(ctx, "provider", G.fabric ? lmcv_fabric_provider(G.fabric) : "none");
    RM_InfoAddFieldULongLong(ctx, "arena_bytes", lmcv_arena_size(G.arena));
    RM_InfoAddFieldULongLong(ctx, "arena_used_bytes", lmcv_arena_used(G.arena));
    RM_InfoAddFieldULongLong(ctx, "objects", G.objects);
    RM_InfoAddFieldULongLong(ctx, "sessions", lmcv_session_count());
    RM_InfoAddFieldULongLong(ctx, "peers", st.peers);
    RM_InfoAddFieldULongLong(ctx, "bulk_gets", G.bulk_gets);
    RM_InfoAddFieldULongLong(ctx, "bulk_sets", G.bulk_sets);
    RM_InfoAddFieldULongLong(ctx, "rma_gets", G.rma_gets);
    RM_InfoAddFieldULongLong(ctx, "rma_sets", G.rma_sets);
    RM_InfoAddFieldULongLong(ctx, "misses", G.misses);
    RM_InfoAddFieldULongLong(ctx, "refused", G.refused);
    RM_InfoAddFieldULongLong(ctx, "require_proof", (unsigned long long)G.require_proof);
    /* Which mode, in words (doctor reads it): the weak one says what it leaves open. */
    RM_InfoAddFieldCString(ctx, "peer_mode", G.require_proof ? LMCV_PEER_MODE_PROVEN : LMCV_PEER_MODE_UNPROVEN);
    if (!G.require_proof) RM_InfoAddFieldCString(ctx, "peer_warning", LMCV_PEER_WARNING);
    RM_InfoAddFieldULongLong(ctx, "extensions", (unsigned long long)G.extensions);
    /* 1: CLUSTER MIGRATESLOTS moves our keys; 0: only legacy MIGRATE does (doctor reads it) */
    RM_InfoAddFieldULongLong(ctx, "atomic_slot_migration", (unsigned long long)G.atomic_slot_migration);
    RM_InfoAddFieldULongLong(ctx, "proofs_ok", G.proofs_ok);
    RM_InfoAddFieldULongLong(ctx, "proofs_failed", G.proofs_failed);
    RM_InfoAddFieldULongLong(ctx, "outside_regions", G.outside_regions);
    RM_InfoAddFieldULongLong(ctx, "evicted", G.evicted);
    RM_InfoAddFieldULongLong(ctx, "propagate", (unsigned long long)G.propagate);
    RM_InfoAddFieldULongLong(ctx, "propagated", G.propagated); /* values sent to replicas/AOF */
    RM_InfoAddFieldULongLong(ctx, "dma_sets", G.dma_sets);
    RM_InfoAddFieldULongLong(ctx, "dma_gets", G.dma_gets);
    RM_InfoAddFieldULongLong(ctx, "dma_copied_bytes", G.dma_copied_bytes); /* strings <-> arena */
    RM_InfoAddFieldULongLong(ctx, "xfers_ok", st.xfers_ok);
    RM_InfoAddFieldULongLong(ctx, "xfers_failed", st.xfers_failed);
    RM_InfoAddFieldULongLong(ctx, "xfers_timedout", st.xfers_timedout);
    RM_InfoAddFieldULongLong(ctx, "bytes_to_peers", st.bytes_to_peers);
    RM_InfoAddFieldULongLong(ctx, "bytes_from_peers", st.bytes_from_peers);
    RM_InfoAddFieldULongLong(ctx, "ops_posted", st.ops_posted);
    RM_InfoAddFieldULongLong(ctx, "op_errors", st.op_errors);
    RM_InfoAddFieldULongLong(ctx, "fabric_usec", __atomic_load_n(&G.fabric_usec, __ATOMIC_RELAXED));
    RM_InfoAddFieldULongLong(ctx, "unblock_usec", G.unblock_usec);
}

/* ---- command table -------------------------------------------------------------------- */

/* Every command the module registers, with what ACL rules need to confine it: core flags
 * (hence @read/@write/@fast), the key argument's access (key specs: ~pattern confines it,
 * %R~/%W~ by access), and the module's own category (docs/fabric-acl.md). The ACL categories
 * are valkey-large-object 0.1.0's (each page: @read, @write or @connection, @fast, @largeobj),
 * so one rule by category serves either module; our own commands take those of their BLOB
 * counterpart. They are named here because a module command gets none from its flags (a
 * "readonly" one is not in @read unless listed). @fast is the ACL category alone where the
 * command flag is off: the transfers block on the fabric, and the server must not take them
 * for O(1) commands (latency monitor, slowlog). */
typedef struct {
    const char *name;
    RMCmdFunc fn;
    const char *flags;
    int has_key; /* 0, or the position of the one key argument */
    uint64_t key_flags;
    int arity;
    const char *acl;
    const char *summary;
} command_def;

#define RO_ACCESS (RM_CMD_KEY_RO | RM_CMD_KEY_ACCESS)
#define OW_UPDATE (RM_CMD_KEY_OW | RM_CMD_KEY_UPDATE)
static const command_def COMMANDS[] = {
    {LMCV_CMD_RDMA_HELLO, cmd_rdma_hello, "fast", 0, 0, -2, LMCV_ACL_CATEGORY " connection fast",
     "Establishes an RDMA session for the current connection"},
    {LMCV_CMD_RDMA_SET, cmd_rdma_set, "write deny-oom", 1, OW_UPDATE, -6, LMCV_ACL_CATEGORY " write fast",
     "Stores a large object read by the server from client memory with RDMA"},
    {LMCV_CMD_RDMA_GET, cmd_rdma_get, "readonly", 1, RO_ACCESS, -5, LMCV_ACL_CATEGORY " read fast",
     "Writes a large object into client memory with RDMA"},
    {LMCV_CMD_TCP_SET, cmd_tcp_set, "write deny-oom", 1, OW_UPDATE, -3, LMCV_ACL_CATEGORY " write fast",
     "Stores a large object sent inline"},
    {LMCV_CMD_TCP_GET, cmd_tcp_get, "readonly", 1, RO_ACCESS, 2, LMCV_ACL_CATEGORY " read fast",
     "Returns a large object inline"},
    {LMCV_CMD_INFO, cmd_info, "readonly fast", 1, RM_CMD_KEY_RO, -2, LMCV_ACL_CATEGORY " read fast",
     "Length, CRC32C and tier of a large object"},
    {LMCV_CMD_PROVE, cmd_prove, "fast", 0, 0, 3, LMCV_ACL_CATEGORY " connection fast",
     "Extension: completes RDMA_HELLO PROOF; the server reads its nonce back from the claimed address"},
    {LMCV_CMD_DMA_HELLO, cmd_dma_hello, "fast", 0, 0, -1, LMCV_ACL_CATEGORY " connection fast",
     "Momento's DMA dialect: the server's fabric addresses (with arguments: an RDMA session, as BLOB.RDMA_HELLO)"},
    {LMCV_CMD_DMA_SET, cmd_dma_set, "write deny-oom", 5, OW_UPDATE, -6, LMCV_ACL_CATEGORY " write fast",
     "Momento's DMA dialect: stores a string read by the server from client memory with RDMA"},
    {LMCV_CMD_DMA_GET, cmd_dma_get, "readonly", 5, RO_ACCESS, -6, LMCV_ACL_CATEGORY " read fast",
     "Momento's DMA dialect: writes a string into client memory with RDMA"},
    {LMCV_CMD_DMA_INFO, cmd_dma_info, "readonly fast", 0, 0, 1, LMCV_ACL_CATEGORY " read fast",
     "Momento's DMA dialect: what the fabric provider was opened with"},
    {LMCV_CMD_DMA_PROVE, cmd_prove, "fast", 0, 0, 3, LMCV_ACL_CATEGORY " connection fast",
     "Extension: completes DMA.HELLO PROOF, as BLOB.RDMA_PROVE"},
    {LMCV_CMD_LEGACY_HELLO, cmd_legacy_hello, "fast", 0, 0, -2, LMCV_ACL_CATEGORY " connection fast",
     "Deprecated name of BLOB.RDMA_HELLO"},
    {LMCV_CMD_LEGACY_SET, cmd_legacy_set, "write deny-oom", 1, OW_UPDATE, -3, LMCV_ACL_CATEGORY " write fast",
     "Deprecated: BLOB.TCP_SET or BLOB.RDMA_SET by the shape of the arguments"},
    {LMCV_CMD_LEGACY_GET, cmd_legacy_get, "readonly", 1, RO_ACCESS, -2, LMCV_ACL_CATEGORY " read fast",
     "Deprecated: BLOB.TCP_GET or BLOB.RDMA_GET by the shape of the arguments"},
};

static const RMCommandInfoVersion COMMAND_INFO_VERSION = {
    1, sizeof(RMCommandHistoryEntry), sizeof(RMCommandKeySpec), sizeof(RMCommandArg)};

/* Registers the commands. Key specs and the ACL category need API that Redis 7.0 lacks
 * (categories) or that a server may refuse: the commands then keep their first/last/step
 * key positions, which ACL key patterns also check, and the category is logged missing. */
static int create_commands(RMCtx *ctx) {
    int categories = RM_AddACLCategory && RM_SetCommandACLCategories;
    if (categories && RM_AddACLCategory(ctx, LMCV_ACL_CATEGORY) != RM_OK) categories = 0;
    if (!categories)
        RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: this server has no module ACL categories; allow the "
                                    "BLOB.* commands by name in ACL rules");
    for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++) {
        const command_def *d = &COMMANDS[i];
        int k = d->has_key;
        if (RM_CreateCommand(ctx, d->name, d->fn, d->flags, k, k, k ? 1 : 0) != RM_OK) return RM_ERR;
        RMCommand *cmd = RM_GetCommand ? RM_GetCommand(ctx, d->name) : NULL;
        if (!cmd) continue;
        if (RM_SetCommandInfo) {
            RMCommandKeySpec specs[2];
            memset(specs, 0, sizeof(specs));
            specs[0].flags = d->key_flags;
            specs[0].begin_search_type = RM_KSPEC_BS_INDEX;
            specs[0].bs.index.pos = k;
            specs[0].find_keys_type = RM_KSPEC_FK_RANGE;
            specs[0].fk.range.lastkey = 0;
            specs[0].fk.range.keystep = 1;
            RMCommandInfo info = {.version = &COMMAND_INFO_VERSION, .summary = d->summary, .since = "1.0.0",
                                  .arity = d->arity, .key_specs = k ? specs : NULL};
            if (RM_SetCommandInfo(cmd, &info) != RM_OK) {
                RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: %s: command info refused", d->name);
                return RM_ERR;
            }
        }
        if (categories && RM_SetCommandACLCategories(cmd, d->acl) != RM_OK) {
            RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: %s: ACL categories '%s' refused", d->name, d->acl);
            return RM_ERR;
        }
    }
    return RM_OK;
}

/* ---- load ---------------------------------------------------------------------------- */

static int parse_module_args(RMCtx *ctx, RMString **argv, int argc) {
    for (int i = 0; i + 1 < argc; i += 2) {
        size_t kn, vn;
        const char *k = RM_StringPtrLen(argv[i], &kn);
        const char *v = RM_StringPtrLen(argv[i + 1], &vn);
        uint64_t num = 0;
        int isnum = parse_u64(argv[i + 1], &num) == 0;
        if (!strcasecmp(k, "provider") && vn < sizeof(G.provider)) snprintf(G.provider, sizeof(G.provider), "%s", v);
        else if (!strcasecmp(k, "bind") && vn < sizeof(G.bind)) snprintf(G.bind, sizeof(G.bind), "%s", v);
        else if (!strcasecmp(k, "arena_mb") && isnum && num > 0) G.arena_mb = num;
        else if (!strcasecmp(k, "chunk_kb") && isnum && num > 0) G.chunk_kb = num;
        else if (!strcasecmp(k, "timeout_ms") && isnum && num > 0) G.default_timeout_ms = (long long)num;
        else if (!strcasecmp(k, "max_timeout_ms") && isnum && num > 0) G.max_timeout_ms = (long long)num;
        else if (!strcasecmp(k, "require_proof") && (!strcasecmp(v, "yes") || !strcasecmp(v, "no")))
            G.require_proof = !strcasecmp(v, "yes");
        else if (!strcasecmp(k, "extensions") && (!strcasecmp(v, "yes") || !strcasecmp(v, "no")))
            G.extensions = !strcasecmp(v, "yes");
        else if (!strcasecmp(k, "arena_eviction") && (!strcasecmp(v, "lru") || !strcasecmp(v, "none")))
            G.evict = !strcasecmp(v, "lru");
        else if (!strcasecmp(k, "propagate") && (!strcasecmp(v, "yes") || !strcasecmp(v, "no")))
            G.propagate = !strcasecmp(v, "yes");
        else { RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: bad module argument %s=%s", k, v); return -1; }
    }
    if (argc % 2) { RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: module arguments come in key value pairs"); return -1; }
    return 0;
}

__attribute__((visibility("default"))) int RedisModule_OnLoad(RMCtx *ctx, RMString **argv, int argc) {
    if (rm_api_init(ctx, LMCV_MODULE_NAME, LMCV_MODULE_VERSION) != RM_OK) return RM_ERR;
    if (parse_module_args(ctx, argv, argc)) return RM_ERR;
    if (G.require_proof && !G.extensions) {
        /* The upstream dialect has no PROOF: say so rather than weaken the default quietly. */
        RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: extensions no speaks only the upstream dialect, whose clients "
                                    "cannot prove their fabric address: add require_proof no (docs/security.md)");
        return RM_ERR;
    }
    if (!G.require_proof) RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: require_proof no: %s", LMCV_PEER_WARNING);
    RMTypeMethods tm = {.version = RM_TYPE_METHOD_VERSION, .rdb_load = type_rdb_load, .rdb_save = type_rdb_save,
                        .aof_rewrite = type_aof_rewrite, .mem_usage = type_mem_usage, .free = type_free};
    RMType *type = RM_CreateDataType(ctx, LMCV_TYPE_NAME, LMCV_TYPE_ENCVER, &tm);
    if (!type) return RM_ERR;
    /* Without HANDLE_IO_ERRORS a malformed value in RESTORE or an RDB panics the server (issue:
     * crafted RESTORE payloads); with it type_rdb_load sees the error and refuses the value.
     * Atomic slot migration needs nothing more of us than aof_rewrite (the snapshot) and
     * should_propagate (the writes during the move); declared only where the server knows
     * the option, so that INFO and doctor can say which resharding this server offers. */
    int options = RM_OPTIONS_HANDLE_IO_ERRORS;
    G.atomic_slot_migration =
        RM_GetModuleOptionsAll && (RM_GetModuleOptionsAll() & RM_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION) != 0;
    if (G.atomic_slot_migration) options |= RM_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION;
    RM_SetModuleOptions(ctx, options);
    lmcv_arena *arena = lmcv_arena_create((size_t)G.arena_mb << 20);
    if (!arena) { RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: cannot map %llu MiB arena", G.arena_mb); return RM_ERR; }
    lmcv_fabric *fabric = NULL;
    if (strcasecmp(G.provider, "none") != 0) {
        char err[256];
        /* Threads that libfabric's providers start while we open the fabric inherit this
         * mask: none of them may take SIGTERM/SIGINT, which belong to Valkey's main thread. */
        sigset_t all, prev;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &prev);
        fabric = lmcv_fabric_open(G.provider, G.bind, lmcv_arena_base(arena), lmcv_arena_size(arena),
                                  (size_t)G.chunk_kb << 10, err, sizeof(err));
        pthread_sigmask(SIG_SETMASK, &prev, NULL);
        if (!fabric) {
            RM_Log(ctx, RM_LOG_WARNING, "lmcvblob: fabric unavailable: %s", err);
            lmcv_arena_destroy(arena);
            return RM_ERR;
        }
    }
    if (create_commands(ctx) != RM_OK ||
        RM_RegisterInfoFunc(ctx, info_func) != RM_OK ||
        RM_SubscribeToServerEvent(ctx, (RMEvent){RM_EVENT_CLIENT_CHANGE, 1}, on_client_change) != RM_OK ||
        RM_SubscribeToServerEvent(ctx, (RMEvent){RM_EVENT_SHUTDOWN, 1}, on_shutdown) != RM_OK) {
        lmcv_fabric_close(fabric);
        lmcv_arena_destroy(arena);
        return RM_ERR;
    }
    take_back_stop_signals(ctx);
    /* Publish only when every step succeeded. */
    G.type = type;
    G.arena = arena;
    G.fabric = fabric;
    RM_Log(ctx, RM_LOG_NOTICE, "lmcvblob: provider=%s addr=%s arena=%llu MiB",
           fabric ? lmcv_fabric_provider(fabric) : "none", fabric ? lmcv_fabric_name_hex(fabric) : "-", G.arena_mb);
    return RM_OK;
}
