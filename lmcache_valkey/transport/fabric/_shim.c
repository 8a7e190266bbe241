/* Thin C layer compiled by cffi (API mode) against the system's libfabric headers.
 * Why a shim rather than binding every fi_* call: most fi_* calls are static inline and
 * several constants moved between libfabric 1.17 and 2.x; keeping the version-sensitive
 * bits here gives Python one small, stable surface (docs/fabric-binding.md).
 * It holds no policy: which provider, what to register, when to progress is Python's. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

struct lmcv_ep {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    int waitable;
};

static int lmcv_api_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }

static uint64_t lmcv_mode_bits(void) {
    uint64_t m = 0;
#ifdef FI_CONTEXT
    m |= FI_CONTEXT;
#endif
#ifdef FI_CONTEXT2
    m |= FI_CONTEXT2;
#endif
    return m;
}

static struct fi_info *lmcv_getinfo(const char *prov, const char *node, int hmem, int delivery, char *err,
                                    size_t errlen) {
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    if (!hints) { snprintf(err, errlen, "fi_allocinfo failed"); return NULL; }
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
    hints->mode = lmcv_mode_bits();
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                                  FI_MR_ENDPOINT | (hmem ? FI_MR_HMEM : 0);
    if (delivery) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    if (prov && *prov) hints->fabric_attr->prov_name = strdup(prov);
    int rc = fi_getinfo(lmcv_api_version(), node, NULL, node ? FI_SOURCE : 0, hints, &info);
    fi_freeinfo(hints);
    if (rc) {
        snprintf(err, errlen, "fi_getinfo(provider=%s, node=%s%s): %s", prov ? prov : "", node ? node : "",
                 hmem ? ", FI_HMEM" : "", fi_strerror(-rc));
        return NULL;
    }
    return info;
}

#define SHIM_CHECK(call, what)                                                            \
    do {                                                                                  \
        int _rc = (int)(call);                                                            \
        if (_rc) { snprintf(err, errlen, "%s: %s", what, fi_strerror(-_rc)); goto fail; } \
    } while (0)

static void lmcv_ep_close(struct lmcv_ep *e) {
    if (!e) return;
    if (e->ep) fi_close(&e->ep->fid);
    if (e->av) fi_close(&e->av->fid);
    if (e->cq) fi_close(&e->cq->fid);
    if (e->domain) fi_close(&e->domain->fid);
    if (e->fabric) fi_close(&e->fabric->fid);
    if (e->info) fi_freeinfo(e->info);
    free(e);
}

/* libfabric's shm provider installs SIGINT/SIGTERM handlers while providers initialise
 * (whichever provider is chosen), replacing the host process's own (vLLM's, Python's
 * KeyboardInterrupt). Provider discovery runs with the host's handlers put back after. */
static struct fi_info *lmcv_getinfo_keep_signals(const char *prov, const char *node, int hmem, int strict,
                                                  char *err, size_t errlen) {
    struct sigaction old_int, old_term;
    sigaction(SIGINT, NULL, &old_int);
    sigaction(SIGTERM, NULL, &old_term);
    struct fi_info *info = lmcv_getinfo(prov, node, hmem, strict, err, errlen);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return info;
}

static struct lmcv_ep *lmcv_ep_open(const char *prov, const char *node, int hmem, char *err, size_t errlen) {
    struct lmcv_ep *e = calloc(1, sizeof(*e));
    if (!e) { snprintf(err, errlen, "out of memory"); return NULL; }
    e->info = lmcv_getinfo_keep_signals(prov, node, hmem, 1, err, errlen);
    if (!e->info) e->info = lmcv_getinfo_keep_signals(prov, node, hmem, 0, err, errlen);
    if (!e->info) { free(e); return NULL; }
    SHIM_CHECK(fi_fabric(e->info->fabric_attr, &e->fabric, NULL), "fi_fabric");
    SHIM_CHECK(fi_domain(e->fabric, e->info, &e->domain, NULL), "fi_domain");
    struct fi_cq_attr cq_attr;
    memset(&cq_attr, 0, sizeof(cq_attr));
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    cq_attr.size = 1024;
    /* shm's CQ wait is a sched_yield loop that did not return in our tests: poll it. */
    int poll_only = strncmp(e->info->fabric_attr->prov_name, "shm", 3) == 0;
    cq_attr.wait_obj = poll_only ? FI_WAIT_NONE : FI_WAIT_UNSPEC;
    e->waitable = !poll_only;
    if (poll_only || fi_cq_open(e->domain, &cq_attr, &e->cq, NULL)) {
        cq_attr.wait_obj = FI_WAIT_NONE;
        e->waitable = 0;
        SHIM_CHECK(fi_cq_open(e->domain, &cq_attr, &e->cq, NULL), "fi_cq_open");
    }
    struct fi_av_attr av_attr;
    memset(&av_attr, 0, sizeof(av_attr));
    av_attr.type = e->info->domain_attr->av_type != FI_AV_UNSPEC ? e->info->domain_attr->av_type : FI_AV_TABLE;
    SHIM_CHECK(fi_av_open(e->domain, &av_attr, &e->av, NULL), "fi_av_open");
    SHIM_CHECK(fi_endpoint(e->domain, e->info, &e->ep, NULL), "fi_endpoint");
    SHIM_CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    SHIM_CHECK(fi_ep_bind(e->ep, &e->av->fid, 0), "fi_ep_bind(av)");
    SHIM_CHECK(fi_enable(e->ep), "fi_enable");
    return e;
fail:
    lmcv_ep_close(e);
    return NULL;
}

static const char *lmcv_ep_provider(struct lmcv_ep *e) { return e->info->fabric_attr->prov_name; }
static uint64_t lmcv_ep_mr_mode(struct lmcv_ep *e) { return (uint64_t)e->info->domain_attr->mr_mode; }
static uint64_t lmcv_ep_max_msg(struct lmcv_ep *e) { return e->info->ep_attr->max_msg_size; }
static int lmcv_ep_delivery_complete(struct lmcv_ep *e) { return (e->info->tx_attr->op_flags & FI_DELIVERY_COMPLETE) != 0; }
static int lmcv_ep_waitable(struct lmcv_ep *e) { return e->waitable; }
static int lmcv_ep_addr_is_str(struct lmcv_ep *e) { return e->info->addr_format == FI_ADDR_STR; }

static int lmcv_ep_name(struct lmcv_ep *e, void *buf, size_t *len) { return fi_getname(&e->ep->fid, buf, len); }

static int lmcv_ep_av_insert(struct lmcv_ep *e, const void *addr, uint64_t *out) {
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    int n = fi_av_insert(e->av, addr, 1, &a, 0, NULL);
    if (n != 1) return n < 0 ? n : -FI_EINVAL;
    *out = a;
    return 0;
}

/* iface: 0 host, 1 CUDA (FI_HMEM). */
static int lmcv_mr_reg(struct lmcv_ep *e, void *addr, size_t len, int iface, int device, uint64_t requested_key,
                       struct fid_mr **mr, uint64_t *key, void **desc) {
    struct iovec iov = {addr, len};
    struct fi_mr_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    attr.requested_key = requested_key;
    attr.iface = iface ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
    if (iface) attr.device.cuda = device;
    int rc = fi_mr_regattr(e->domain, &attr, iface ? FI_HMEM_DEVICE_ONLY : 0, mr);
    if (rc) return rc;
    if (e->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        rc = fi_mr_bind(*mr, &e->ep->fid, 0);
        if (!rc) rc = fi_mr_enable(*mr);
        if (rc) { fi_close(&(*mr)->fid); *mr = NULL; return rc; }
    }
    *key = fi_mr_key(*mr);
    *desc = fi_mr_desc(*mr);
    return 0;
}

static int lmcv_mr_close(struct fid_mr *mr) { return fi_close(&mr->fid); }

/* Initiator side, used by the raw-bandwidth benchmark and by tests. */
static ssize_t lmcv_ep_write(struct lmcv_ep *e, void *buf, size_t len, void *desc, uint64_t dest, uint64_t raddr,
                             uint64_t key, void *ctx) {
    return fi_write(e->ep, buf, len, desc, dest, raddr, key, ctx);
}
static ssize_t lmcv_ep_read(struct lmcv_ep *e, void *buf, size_t len, void *desc, uint64_t dest, uint64_t raddr,
                            uint64_t key, void *ctx) {
    return fi_read(e->ep, buf, len, desc, dest, raddr, key, ctx);
}

/* Waits up to timeout_ms for completions (blocking in fi_cq_sread, which also drives the
 * provider's progress). Fills ctxs; an error completion's context goes to ctxs with
 * errs[i] set to the provider error. Returns the count, 0 on timeout, <0 on failure. */
static ssize_t lmcv_ep_wait(struct lmcv_ep *e, int timeout_ms, void **ctxs, int *errs, int max) {
    struct fi_cq_entry ent[64];
    if (max > 64) max = 64;
    ssize_t n = e->waitable ? fi_cq_sread(e->cq, ent, (size_t)max, NULL, timeout_ms) : fi_cq_read(e->cq, ent, (size_t)max);
    if (n > 0) {
        for (ssize_t i = 0; i < n; i++) { ctxs[i] = ent[i].op_context; errs[i] = 0; }
        return n;
    }
    if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry ee;
        memset(&ee, 0, sizeof(ee));
        if (fi_cq_readerr(e->cq, &ee, 0) > 0) { ctxs[0] = ee.op_context; errs[0] = ee.err ? ee.err : FI_EIO; return 1; }
        return 0;
    }
    if (n == -FI_EAGAIN || n == -FI_EINTR || n == -FI_ECANCELED) {
        /* Without a wait object the caller passes its back-off as timeout_us via a
         * negative timeout_ms; sleeping here keeps the poll loop off the CPU. */
        if (!e->waitable && timeout_ms < 0) {
            struct timespec ts = {0, (long)(-timeout_ms) * 1000L};
            nanosleep(&ts, NULL);
        }
        return 0;
    }
    return n;
}

static int lmcv_ep_signal(struct lmcv_ep *e) { return e->waitable ? fi_cq_signal(e->cq) : 0; }

static const char *lmcv_strerror(int err) { return fi_strerror(err < 0 ? -err : err); }

