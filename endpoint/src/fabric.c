/* libfabric side of the endpoint (see fabric.h). Threading: the module's main thread only
 * calls submit/add_peer/forget_peer/stats; everything that waits on the network runs on
 * the one fabric thread (docs/fabric-threading.md). */
#include <signal.h>
#include "fabric.h"

#include "crc32c.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define MAX_PEER_REMOVALS 1024

struct peer {
    unsigned char addr[256];
    size_t len;
    uint64_t fi_addr;
    unsigned refs;
};

/* One posted fi_read/fi_write. fi_context2 first: providers needing FI_CONTEXT(2) use it. */
typedef struct op_ctx {
    struct fi_context2 fctx;
    lmcv_xfer *x;
    uint64_t off, len; /* range within the value */
} op_ctx;

/* A completed range that arrived before the ranges in front of it. */
struct crc_pending {
    uint64_t off, len;
    struct crc_pending *next;
};

struct lmcv_fabric {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_mr *mr;
    void *desc;
    char *arena;
    /* The window: operations in flight, shared by every transfer (max_inflight) so that
     * concurrent transfers do not flood the provider. A peer that stops making progress
     * (paused, hostile) keeps its operations in flight until its connection ends, so the
     * shared window alone would let one stopped client stop every other peer's transfers
     * and address proofs. Hence: each transfer may always have MIN_OPS_PER_XFER in flight,
     * whatever the others hold, and the operations of a transfer past its deadline leave the
     * shared count (they stay on the transfer until they complete). */
    size_t chunk, max_inflight, inflight;
    int cq_waitable;
    char name_hex[1024];
    size_t name_len;
    char provider[64];

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stopping;
    lmcv_xfer *queue_head, *queue_tail; /* submitted, not yet seen by the thread */
    lmcv_xfer *active;                  /* owned by the thread */
    uint64_t removals[MAX_PEER_REMOVALS];
    int nremovals;
    /* Distinct peer addresses and how many sessions use each (under lock). Several
     * connections of one client share its fabric address: it is inserted once and
     * removed when its last session ends (shm crashes on a removed, still-used peer). */
    struct peer *peers;
    size_t npeers, cappeers;

    lmcv_fabric_stats stats; /* updated with __atomic builtins */
};

uint64_t lmcv_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define STAT_ADD(f, field, n) __atomic_add_fetch(&(f)->stats.field, (n), __ATOMIC_RELAXED)

static void to_hex(const unsigned char *in, size_t n, char *out, size_t cap) {
    static const char d[] = "0123456789abcdef";
    size_t i = 0;
    for (; i < n && 2 * i + 2 < cap; i++) { out[2 * i] = d[in[i] >> 4]; out[2 * i + 1] = d[in[i] & 15]; }
    out[2 * i] = 0;
}

/* ---- transfer engine (fabric thread only) ---------------------------------------- */

static void fail_xfer(lmcv_xfer *x, int status, const char *why) {
    if (x->failed) return;
    x->failed = 1;
    x->status = status;
    snprintf(x->errmsg, sizeof(x->errmsg), "%s", why);
}

#define MIN_OPS_PER_XFER 4

/* Posts the next operations of x while the window allows (or x holds fewer than its
 * guaranteed share). Returns ops posted. A full provider queue (-FI_EAGAIN) stops only x:
 * the caller moves on to the other transfers. */
static int post_some(lmcv_fabric *f, lmcv_xfer *x) {
    int posted = 0;
    while (!x->failed && x->posted < x->len && x->inflight < f->max_inflight &&
           (f->inflight < f->max_inflight || x->inflight < MIN_OPS_PER_XFER)) {
        lmcv_seg *s = &x->segs[x->seg_i];
        uint64_t left_in_seg = s->len - x->seg_off, left = x->len - x->posted;
        uint64_t n = left_in_seg < left ? left_in_seg : left;
        if (n > f->chunk) n = f->chunk;
        op_ctx *c = malloc(sizeof(*c));
        if (!c) { fail_xfer(x, LMCV_XFER_FAILED, "out of memory"); break; }
        c->x = x;
        c->off = x->posted;
        c->len = n;
        char *local = f->arena + x->local_off + x->posted;
        uint64_t raddr = s->addr + x->seg_off;
        ssize_t rc = x->op == LMCV_XFER_WRITE
                         ? fi_write(f->ep, local, n, f->desc, x->peer, raddr, s->rkey, &c->fctx)
                         : fi_read(f->ep, local, n, f->desc, x->peer, raddr, s->rkey, &c->fctx);
        if (rc == -FI_EAGAIN) { free(c); break; } /* queue full: reap completions first */
        if (rc) {
            free(c);
            char why[96];
            snprintf(why, sizeof(why), "post: %s", fi_strerror((int)-rc));
            fail_xfer(x, LMCV_XFER_FAILED, why);
            STAT_ADD(f, op_errors, 1);
            break;
        }
        x->inflight++;
        f->inflight++;
        x->posted += n;
        x->seg_off += n;
        if (x->seg_off == s->len) { x->seg_i++; x->seg_off = 0; }
        posted++;
        STAT_ADD(f, ops_posted, 1);
    }
    return posted;
}

/* Folds the landed range [off, off+len) into x->crc, in value order. */
static void crc_advance(lmcv_fabric *f, lmcv_xfer *x, uint64_t off, uint64_t len) {
    if (off != x->crc_off) { /* out of order: park it (ranges are few: <= the window) */
        struct crc_pending *p = malloc(sizeof(*p));
        if (!p) { fail_xfer(x, LMCV_XFER_FAILED, "out of memory"); return; }
        *p = (struct crc_pending){off, len, x->crc_pending};
        x->crc_pending = p;
        return;
    }
    const char *base = f->arena + x->local_off;
    x->crc = lmcv_crc32c(x->crc, base + off, len);
    x->crc_off += len;
    for (int moved = 1; moved;) {
        moved = 0;
        for (struct crc_pending **pp = &x->crc_pending; *pp; pp = &(*pp)->next) {
            if ((*pp)->off != x->crc_off) continue;
            struct crc_pending *p = *pp;
            x->crc = lmcv_crc32c(x->crc, base + p->off, p->len);
            x->crc_off += p->len;
            *pp = p->next;
            free(p);
            moved = 1;
            break;
        }
    }
}

static void crc_discard(lmcv_xfer *x) {
    for (struct crc_pending *p = x->crc_pending, *n; p; p = n) { n = p->next; free(p); }
    x->crc_pending = NULL;
}

static void complete_op(lmcv_fabric *f, op_ctx *c, int ok, const char *why) {
    lmcv_xfer *x = c->x;
    x->inflight--;
    if (!x->overdue) f->inflight--;
    if (ok) {
        x->done_bytes += c->len;
        if (x->want_crc && !x->failed) crc_advance(f, x, c->off, c->len);
    } else {
        fail_xfer(x, LMCV_XFER_FAILED, why);
        STAT_ADD(f, op_errors, 1);
    }
    free(c);
}

static void handle_cq_result(lmcv_fabric *f, ssize_t n, struct fi_cq_entry *ent) {
    if (n > 0) {
        for (ssize_t i = 0; i < n; i++) complete_op(f, ent[i].op_context, 1, NULL);
    } else if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry e;
        memset(&e, 0, sizeof(e));
        if (fi_cq_readerr(f->cq, &e, 0) > 0 && e.op_context) {
            char why[96];
            snprintf(why, sizeof(why), "%s", fi_strerror(e.err));
            complete_op(f, e.op_context, 0, why);
        }
    }
}

/* Reports finished transfers and releases drained ones; returns the nearest deadline. */
static uint64_t sweep(lmcv_fabric *f, uint64_t now) {
    uint64_t nearest = UINT64_MAX;
    for (lmcv_xfer **pp = &f->active; *pp;) {
        lmcv_xfer *x = *pp;
        if (!x->reported) {
            if (x->done_bytes == x->len && !x->failed) {
                x->reported = 1;
                if (!x->quiet) {
                    STAT_ADD(f, xfers_ok, 1);
                    if (x->op == LMCV_XFER_WRITE) STAT_ADD(f, bytes_to_peers, x->len);
                    else STAT_ADD(f, bytes_from_peers, x->len);
                }
                x->finished(x, LMCV_XFER_OK, 0);
            } else if (x->failed && x->inflight == 0) {
                /* An error is reported only once the posted ops drained, so the reply
                 * tells the client its memory is no longer touched. */
                x->reported = 1;
                STAT_ADD(f, xfers_failed, 1);
                x->finished(x, x->status, 0);
            } else if (now >= x->deadline_ns) {
                x->reported = 1;
                fail_xfer(x, LMCV_XFER_TIMEDOUT, "deadline");
                STAT_ADD(f, xfers_timedout, 1);
                x->finished(x, LMCV_XFER_TIMEDOUT, x->inflight);
                /* Its operations may never complete (a stopped peer): out of the window. */
                x->overdue = 1;
                f->inflight -= x->inflight;
            } else if (x->deadline_ns < nearest) {
                nearest = x->deadline_ns;
            }
        }
        if (x->reported && x->inflight == 0) {
            *pp = x->next;
            crc_discard(x);
            x->release(x);
            continue;
        }
        pp = &x->next;
    }
    return nearest;
}

static struct peer *peer_by_fi_addr(lmcv_fabric *f, uint64_t a) {
    for (size_t i = 0; i < f->npeers; i++) if (f->peers[i].fi_addr == a) return &f->peers[i];
    return NULL;
}

static void apply_removals(lmcv_fabric *f, uint64_t *rm, int n) {
    for (int i = 0; i < n; i++) {
        int busy = 0;
        for (lmcv_xfer *x = f->active; x; x = x->next) busy |= x->peer == rm[i];
        pthread_mutex_lock(&f->lock);
        struct peer *p = peer_by_fi_addr(f, rm[i]);
        if (busy && p && p->refs == 0) { /* retry later: an op to this peer may be in flight */
            if (f->nremovals < MAX_PEER_REMOVALS) f->removals[f->nremovals++] = rm[i];
        } else if (p && p->refs == 0) {
            /* Under the lock: a HELLO re-adding this address waits, then inserts anew. */
            fi_addr_t a = rm[i];
            fi_av_remove(f->av, &a, 1, 0);
            *p = f->peers[--f->npeers];
            __atomic_store_n(&f->stats.peers, f->npeers, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&f->lock);
    }
}

static void *fabric_main(void *arg) {
    lmcv_fabric *f = arg;
    struct fi_cq_entry ent[32];
    unsigned idle_us = 20;
    for (;;) {
        uint64_t rm[MAX_PEER_REMOVALS];
        int nrm = 0;
        pthread_mutex_lock(&f->lock);
        while (!f->active && !f->queue_head && !f->stopping && !f->nremovals)
            pthread_cond_wait(&f->cond, &f->lock);
        int stopping = f->stopping;
        lmcv_xfer *q = f->queue_head;
        f->queue_head = f->queue_tail = NULL;
        if (f->nremovals) { nrm = f->nremovals; memcpy(rm, f->removals, nrm * sizeof(uint64_t)); f->nremovals = 0; }
        pthread_mutex_unlock(&f->lock);
        while (q) { lmcv_xfer *n = q->next; q->next = f->active; f->active = q; q = n; }
        if (stopping) /* no new posts; in-flight ops still drain or time out below */
            for (lmcv_xfer *x = f->active; x; x = x->next) fail_xfer(x, LMCV_XFER_SHUTDOWN, "shutdown");
        if (stopping && !f->active) break;

        int posted = 0;
        for (lmcv_xfer *x = f->active; x; x = x->next) posted += post_some(f, x);
        ssize_t n = fi_cq_read(f->cq, ent, 32);
        handle_cq_result(f, n, ent);
        uint64_t now = lmcv_now_ns();
        uint64_t nearest = sweep(f, now);
        if (nrm) apply_removals(f, rm, nrm);
        if (n > 0 || n == -FI_EAVAIL || posted || !f->active) { idle_us = 20; continue; }
        /* Nothing moved: wait for a completion, a new submission (fi_cq_signal) or the
         * nearest deadline, whichever comes first. The wait also drives the provider's
         * progress, which manual-progress providers need. */
        uint64_t wait_ns = nearest > now ? nearest - now : 0;
        int timeout_ms = wait_ns > 50000000ull ? 50 : (int)(wait_ns / 1000000ull) + 1;
        if (f->cq_waitable) {
            n = fi_cq_sread(f->cq, ent, 32, NULL, timeout_ms);
            handle_cq_result(f, n, ent);
        } else {
            /* No wait object: sleep, backing off to 1 ms while nothing moves, so an op
             * that never completes (shm, bad key) cannot turn this loop into a spin. */
            struct timespec ts = {0, (long)idle_us * 1000L};
            nanosleep(&ts, NULL);
            if (idle_us < 1000) idle_us *= 2;
        }
    }
    return NULL;
}

/* ---- set-up and API -------------------------------------------------------------- */

static struct fi_info *get_info(const char *provider, const char *bind_addr, int delivery, char *err,
                                size_t errlen) {
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    if (!hints) { snprintf(err, errlen, "fi_allocinfo failed"); return NULL; }
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    /* Our op contexts start with a fi_context2, so either mode bit is satisfied.
     * libfabric 2.x dropped FI_CONTEXT: use what the headers define. */
    hints->mode = 0;
#ifdef FI_CONTEXT
    hints->mode |= FI_CONTEXT;
#endif
#ifdef FI_CONTEXT2
    hints->mode |= FI_CONTEXT2;
#endif
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    if (delivery) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    hints->fabric_attr->prov_name = strdup(provider);
    /* shm names endpoints itself (an IP would make every process collide) and efa picks
     * its device, not an IP: only IP-based providers get the bind address. */
    int use_node = bind_addr && *bind_addr && strncmp(provider, "shm", 3) != 0 && strncmp(provider, "efa", 3) != 0;
    int rc = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), use_node ? bind_addr : NULL,
                        NULL, use_node ? FI_SOURCE : 0, hints, &info);
    fi_freeinfo(hints);
    if (rc) {
        snprintf(err, errlen, "fi_getinfo(provider=%s, bind=%s): %s", provider, bind_addr ? bind_addr : "",
                 fi_strerror(-rc));
        return NULL;
    }
    return info;
}

#define CHECK(call, what)                                                                  \
    do {                                                                                   \
        int _rc = (int)(call);                                                             \
        if (_rc) { snprintf(err, errlen, "%s: %s", what, fi_strerror(-_rc)); goto fail; }  \
    } while (0)

lmcv_fabric *lmcv_fabric_open(const char *provider, const char *bind_addr, void *arena, size_t len,
                              size_t chunk, char *err, size_t errlen) {
    lmcv_fabric *f = calloc(1, sizeof(*f));
    if (!f) { snprintf(err, errlen, "out of memory"); return NULL; }
    f->info = get_info(provider, bind_addr, 1, err, errlen);
    if (!f->info) f->info = get_info(provider, bind_addr, 0, err, errlen); /* see docs/fabric-delivery-complete.md */
    if (!f->info) { free(f); return NULL; }
    struct fi_info *info = f->info;
    snprintf(f->provider, sizeof(f->provider), "%s", info->fabric_attr->prov_name);
    CHECK(fi_fabric(info->fabric_attr, &f->fabric, NULL), "fi_fabric");
    CHECK(fi_domain(f->fabric, info, &f->domain, NULL), "fi_domain");
    /* shm's CQ wait is a sched_yield loop that never returned in our tests: poll it
     * (docs/fabric-threading.md). */
    int poll_only = strncmp(f->provider, "shm", 3) == 0;
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 1024,
                                 .wait_obj = poll_only ? FI_WAIT_NONE : FI_WAIT_UNSPEC};
    f->cq_waitable = !poll_only;
    if (poll_only || fi_cq_open(f->domain, &cq_attr, &f->cq, NULL)) {
        cq_attr.wait_obj = FI_WAIT_NONE;
        f->cq_waitable = 0;
        CHECK(fi_cq_open(f->domain, &cq_attr, &f->cq, NULL), "fi_cq_open");
    }
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    if (info->domain_attr->av_type != FI_AV_UNSPEC) av_attr.type = info->domain_attr->av_type;
    CHECK(fi_av_open(f->domain, &av_attr, &f->av, NULL), "fi_av_open");
    CHECK(fi_endpoint(f->domain, info, &f->ep, NULL), "fi_endpoint");
    CHECK(fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    CHECK(fi_ep_bind(f->ep, &f->av->fid, 0), "fi_ep_bind(av)");
    CHECK(fi_enable(f->ep), "fi_enable");
    CHECK(fi_mr_reg(f->domain, arena, len, FI_READ | FI_WRITE, 0, 0, 0, &f->mr, NULL), "fi_mr_reg(arena)");
    if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        CHECK(fi_mr_bind(f->mr, &f->ep->fid, 0), "fi_mr_bind");
        CHECK(fi_mr_enable(f->mr), "fi_mr_enable");
    }
    f->desc = fi_mr_desc(f->mr);
    unsigned char name[512];
    size_t nlen = sizeof(name);
    CHECK(fi_getname(&f->ep->fid, name, &nlen), "fi_getname");
    to_hex(name, nlen, f->name_hex, sizeof(f->name_hex));
    f->name_len = nlen;
    f->arena = arena;
    f->chunk = chunk;
    if (info->ep_attr->max_msg_size && f->chunk > info->ep_attr->max_msg_size) f->chunk = info->ep_attr->max_msg_size;
    f->max_inflight = info->tx_attr->size ? info->tx_attr->size : 64;
    if (f->max_inflight > 64) f->max_inflight = 64;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    /* The fabric thread takes no signals: SIGTERM/SIGINT must reach Valkey's main thread,
     * whose handler schedules a clean shutdown. */
    sigset_t all, prev;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &prev);
    int prc = pthread_create(&f->thread, NULL, fabric_main, f);
    pthread_sigmask(SIG_SETMASK, &prev, NULL);
    if (prc) { snprintf(err, errlen, "pthread_create failed"); goto fail; }
    return f;
fail:
    if (f->mr) fi_close(&f->mr->fid);
    if (f->ep) fi_close(&f->ep->fid);
    if (f->av) fi_close(&f->av->fid);
    if (f->cq) fi_close(&f->cq->fid);
    if (f->domain) fi_close(&f->domain->fid);
    if (f->fabric) fi_close(&f->fabric->fid);
    fi_freeinfo(f->info);
    free(f);
    return NULL;
}

void lmcv_fabric_close(lmcv_fabric *f) {
    if (!f) return;
    pthread_mutex_lock(&f->lock);
    f->stopping = 1;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock);
    if (f->cq_waitable) fi_cq_signal(f->cq);
    pthread_join(f->thread, NULL);
    fi_close(&f->ep->fid);
    fi_close(&f->mr->fid);
    fi_close(&f->av->fid);
    fi_close(&f->cq->fid);
    fi_close(&f->domain->fid);
    fi_close(&f->fabric->fid);
    fi_freeinfo(f->info);
    free(f->peers);
    free(f);
}

const char *lmcv_fabric_name_hex(const lmcv_fabric *f) { return f->name_hex; }
const char *lmcv_fabric_provider(const lmcv_fabric *f) { return f->provider; }

void lmcv_fabric_describe(const lmcv_fabric *f, lmcv_fabric_desc *out) {
    const struct fi_info *i = f->info;
    out->addr_format = i->addr_format;
    out->mr_mode = (uint64_t)(unsigned)i->domain_attr->mr_mode;
    out->caps = i->caps;
    out->requires_local_mr = (i->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
    out->virt_addr = (i->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    out->mr_flags = 0;
    if (i->domain_attr->mr_mode & FI_MR_LOCAL) out->mr_flags |= LMCV_MR_LOCAL;
    if (i->domain_attr->mr_mode & FI_MR_VIRT_ADDR) out->mr_flags |= LMCV_MR_VIRT_ADDR;
    if (i->domain_attr->mr_mode & FI_MR_ALLOCATED) out->mr_flags |= LMCV_MR_ALLOCATED;
    if (i->domain_attr->mr_mode & FI_MR_PROV_KEY) out->mr_flags |= LMCV_MR_PROV_KEY;
    if (i->domain_attr->mr_mode & FI_MR_ENDPOINT) out->mr_flags |= LMCV_MR_ENDPOINT;
    if (i->domain_attr->mr_mode & FI_MR_HMEM) out->mr_flags |= LMCV_MR_HMEM;
    out->cap_flags = 0;
    if (i->caps & FI_MSG) out->cap_flags |= LMCV_CAP_MSG;
    if (i->caps & FI_RMA) out->cap_flags |= LMCV_CAP_RMA;
    if (i->caps & FI_READ) out->cap_flags |= LMCV_CAP_READ;
    if (i->caps & FI_WRITE) out->cap_flags |= LMCV_CAP_WRITE;
    if (i->caps & FI_REMOTE_READ) out->cap_flags |= LMCV_CAP_REMOTE_READ;
    if (i->caps & FI_REMOTE_WRITE) out->cap_flags |= LMCV_CAP_REMOTE_WRITE;
}

/* A peer address must have the form this provider's own addresses have: the family and
 * size of a socket address, a printable name, or (other formats) our own name's length.
 * The provider is never handed bytes of another shape to interpret. */
static int peer_addr_valid(const lmcv_fabric *f, const unsigned char *addr, size_t len) {
    if (len == 0 || len > sizeof(((struct peer *)0)->addr)) return 0;
    sa_family_t family;
    switch (f->info->addr_format) {
    case FI_SOCKADDR_IN:
    case FI_SOCKADDR_IN6:
    case FI_SOCKADDR:
        if (len < sizeof(family)) return 0;
        memcpy(&family, addr, sizeof(family));
        if (family == AF_INET && len == sizeof(struct sockaddr_in)) return f->info->addr_format != FI_SOCKADDR_IN6;
        if (family == AF_INET6 && len == sizeof(struct sockaddr_in6)) return f->info->addr_format != FI_SOCKADDR_IN;
        return 0;
    case FI_ADDR_STR: {
        size_t n = 0;
        while (n < len && addr[n] >= 0x20 && addr[n] < 0x7f) n++;
        if (n == 0) return 0;
        for (size_t i = n; i < len; i++) if (addr[i]) return 0;
        return 1;
    }
    default:
        return len == f->name_len;
    }
}

int lmcv_fabric_add_peer(lmcv_fabric *f, const void *addr, size_t len, uint64_t *peer) {
    if (!peer_addr_valid(f, addr, len)) return -1;
    int rc = -1;
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->npeers; i++) {
        struct peer *p = &f->peers[i];
        if (p->len == len && memcmp(p->addr, addr, len) == 0) {
            p->refs++;
            *peer = p->fi_addr;
            rc = 0;
            goto out;
        }
    }
    if (f->npeers == f->cappeers) {
        size_t cap = f->cappeers ? 2 * f->cappeers : 16;
        struct peer *np = realloc(f->peers, cap * sizeof(*np));
        if (!np) goto out;
        f->peers = np;
        f->cappeers = cap;
    }
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    if (fi_av_insert(f->av, addr, 1, &a, 0, NULL) != 1 || a == FI_ADDR_NOTAVAIL) goto out;
    struct peer *p = &f->peers[f->npeers++];
    memcpy(p->addr, addr, len);
    p->len = len;
    p->fi_addr = a;
    p->refs = 1;
    *peer = a;
    __atomic_store_n(&f->stats.peers, f->npeers, __ATOMIC_RELAXED);
    rc = 0;
out:
    pthread_mutex_unlock(&f->lock);
    return rc;
}

void lmcv_fabric_forget_peer(lmcv_fabric *f, uint64_t peer) {
    pthread_mutex_lock(&f->lock);
    struct peer *p = peer_by_fi_addr(f, peer);
    if (p && p->refs && --p->refs == 0 && f->nremovals < MAX_PEER_REMOVALS) {
        f->removals[f->nremovals++] = peer;
        pthread_cond_signal(&f->cond);
    }
    pthread_mutex_unlock(&f->lock);
}

int lmcv_fabric_submit(lmcv_fabric *f, lmcv_xfer *x) {
    x->seg_i = 0;
    x->seg_off = x->posted = x->done_bytes = x->inflight = 0;
    x->status = x->failed = x->reported = x->overdue = 0;
    x->crc = 0;
    x->crc_off = 0;
    x->crc_pending = NULL;
    x->next = NULL;
    pthread_mutex_lock(&f->lock);
    if (f->stopping) { pthread_mutex_unlock(&f->lock); return -1; }
    if (f->queue_tail) f->queue_tail->next = x; else f->queue_head = x;
    f->queue_tail = x;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock);
    if (f->cq_waitable) fi_cq_signal(f->cq); /* wake a thread parked in fi_cq_sread */
    return 0;
}

void lmcv_fabric_stats_get(lmcv_fabric *f, lmcv_fabric_stats *out) {
    unsigned long long *src = (unsigned long long *)&f->stats, *dst = (unsigned long long *)out;
    for (size_t i = 0; i < sizeof(*out) / sizeof(unsigned long long); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}
