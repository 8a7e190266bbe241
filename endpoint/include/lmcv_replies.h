/* Every error reply the endpoint sends, in one file. The first word is the error code
 * the client maps to a typed exception (lmcache_valkey/transport/fabric/commands.py).
 * Messages that take arguments are printf formats. */
#ifndef LMCV_REPLIES_H
#define LMCV_REPLIES_H

#define LMCV_ERR_SYNTAX "ERR syntax error in BLOB command arguments"
#define LMCV_ERR_EXPIRE "ERR invalid expire time in 'blob.set' command"
#define LMCV_ERR_CANTBLOCK "ERR fabric sessions and transfers need a client connection that can block (not MULTI, a script, AOF loading or replication)"
#define LMCV_ERR_TRIPLES "ERR triples must be <rkey> <addr> <len> with len > 0, at most 64 of them"
#define LMCV_ERR_NOHELLO "NOHELLO send BLOB.HELLO <fabric address hex> on this connection first"
#define LMCV_ERR_HELLO_TWICE "ERR fabric session already established on this connection"
#define LMCV_ERR_BADADDR "ERR fabric address is not valid hex or was refused by the provider"
#define LMCV_ERR_PROOF_REQUIRED "NOPROOF this server requires HELLO with PROOF (require_proof yes)"
#define LMCV_ERR_NOT_PROVEN "NOPROOF the fabric session is not proven: put the HELLO nonce in registered memory and send BLOB.RDMA_PROVE"
#define LMCV_ERR_NO_PROOF_PENDING "ERR no proof is pending on this connection"
#define LMCV_ERR_PROOF_WRONG "NOPROOF the nonce was not found at the claimed fabric address"
#define LMCV_ERR_OUTSIDE_REGIONS "BADREGION a triple lies outside the regions this session declared at HELLO"
#define LMCV_ERR_NOFABRIC "NOFABRIC the endpoint was loaded without a fabric; use bulk mode"
#define LMCV_ERR_WINDOW "BADWINDOW window of %llu bytes is smaller than the object (%llu bytes)"
#define LMCV_ERR_TOOLARGE "TOOLARGE object of %llu bytes exceeds the arena (%llu bytes)"
#define LMCV_ERR_NOSPACE "NOSPACE arena has no free extent of %llu bytes"
#define LMCV_ERR_WRONGTYPE "WRONGTYPE key holds a value that is not a BLOB"
#define LMCV_ERR_TIMEOUT "TIMEOUT transfer passed its deadline (%llu ms); inflight=%llu"
#define LMCV_ERR_XFER "XFERFAILED provider reported %s; inflight=0"
#define LMCV_ERR_BUSY "ERR fabric thread is shutting down"

#endif
