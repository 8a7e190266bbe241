/* The endpoint's libfabric side: one RDM endpoint, the arena registered once, and one
 * fabric thread that posts fi_write/fi_read for queued transfers and reaps completions.
 * Never includes the module API: it reports back through the callbacks in lmcv_xfer,
 * which module.c turns into UnblockClient calls. */
#ifndef LMCV_FABRIC_H
#define LMCV_FABRIC_H
#include <stddef.h>
#include <stdint.h>

#define LMCV_MAX_SEGS 256 /* regions per command, as valkey-large-object allows */

enum { LMCV_XFER_WRITE = 1, /* arena -> peer memory (GET) */
       LMCV_XFER_READ = 2 /* peer memory -> arena (SET) */ };

enum { LMCV_XFER_OK = 0, LMCV_XFER_TIMEDOUT = 1, LMCV_XFER_FAILED = 2, LMCV_XFER_SHUTDOWN = 3 };

typedef struct lmcv_seg {
    uint64_t rkey, addr, len;
} lmcv_seg;

typedef struct lmcv_xfer lmcv_xfer;
struct lmcv_xfer {
    /* Filled by the submitter. */
    int op;
    uint64_t peer;        /* fi_addr_t returned by lmcv_fabric_add_peer */
    uint64_t local_off;   /* offset of the value in the arena */
    uint64_t len;         /* bytes to move, consumed from segs in order */
    lmcv_seg segs[LMCV_MAX_SEGS];
    int nsegs;
    uint64_t deadline_ns; /* CLOCK_MONOTONIC */
    /* Called once on the fabric thread: status, and how many posted operations may still
     * touch peer or arena memory (non-zero only for TIMEDOUT). */
    void (*finished)(lmcv_xfer *x, int status, uint64_t inflight);
    /* Called once on the fabric thread after finished, when no operation is in flight:
     * the arena extent and the xfer may be released now. */
    void (*release)(lmcv_xfer *x);
    void *user;
    /* READ only: CRC32C of the bytes landed, computed chunk by chunk as completions
     * arrive so it overlaps the transfer instead of following it. Valid on LMCV_XFER_OK. */
    int want_crc;
    /* Handshake traffic (the HELLO proof nonce): not counted in the transfer statistics. */
    int quiet;
    uint32_t crc;
    char errmsg[96];
    /* Private to fabric.c. */
    int seg_i;
    uint64_t seg_off, posted, done_bytes, inflight;
    int status, failed, reported, overdue; /* overdue: past its deadline, out of the window */
    uint64_t crc_off;       /* bytes [0, crc_off) of the value are folded into crc */
    struct crc_pending *crc_pending; /* completed ranges beyond crc_off */
    lmcv_xfer *next;
};

typedef struct lmcv_fabric lmcv_fabric;

typedef struct {
    unsigned long long xfers_ok, xfers_failed, xfers_timedout, bytes_to_peers, bytes_from_peers,
        ops_posted, op_errors, peers;
} lmcv_fabric_stats;

/* Opens provider/domain/endpoint/CQ/AV, registers [arena, arena+len) and starts the thread.
 * On failure returns NULL and writes a reason to err. Everything is built in locals and
 * only returned when all steps succeeded. */
lmcv_fabric *lmcv_fabric_open(const char *provider, const char *bind_addr, void *arena, size_t len,
                              size_t chunk, char *err, size_t errlen);
void lmcv_fabric_close(lmcv_fabric *f);
/* Hex of the endpoint's own fabric address. */
const char *lmcv_fabric_name_hex(const lmcv_fabric *f);
const char *lmcv_fabric_provider(const lmcv_fabric *f);
/* What the provider was opened with, for DMA.INFO: libfabric's values, and the bits of
 * them that the reply names (so module.c needs no libfabric header). */
enum { LMCV_MR_LOCAL = 1, LMCV_MR_VIRT_ADDR = 2, LMCV_MR_ALLOCATED = 4, LMCV_MR_PROV_KEY = 8,
       LMCV_MR_ENDPOINT = 16, LMCV_MR_HMEM = 32 };
enum { LMCV_CAP_MSG = 1, LMCV_CAP_RMA = 2, LMCV_CAP_READ = 4, LMCV_CAP_WRITE = 8, LMCV_CAP_REMOTE_READ = 16,
       LMCV_CAP_REMOTE_WRITE = 32 };
typedef struct {
    uint32_t addr_format;
    uint64_t mr_mode, caps;
    unsigned mr_flags, cap_flags;
    int requires_local_mr, virt_addr;
} lmcv_fabric_desc;
void lmcv_fabric_describe(const lmcv_fabric *f, lmcv_fabric_desc *out);
/* Inserts a peer's raw address; 0 and *peer set on success. */
int lmcv_fabric_add_peer(lmcv_fabric *f, const void *addr, size_t len, uint64_t *peer);
/* Removes the peer once no queued or running transfer uses it (done by the thread). */
void lmcv_fabric_forget_peer(lmcv_fabric *f, uint64_t peer);
/* Queues a transfer; 0 on success, -1 when the thread is shutting down. */
int lmcv_fabric_submit(lmcv_fabric *f, lmcv_xfer *x);
void lmcv_fabric_stats_get(lmcv_fabric *f, lmcv_fabric_stats *out);
uint64_t lmcv_now_ns(void);

#endif
