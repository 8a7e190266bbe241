/* Every error reply the endpoint sends, in one file, in both dialects it speaks:
 *   - the valkey-large-object dialect (BLOB.RDMA_*, BLOB.TCP_*, BLOB.INFO): the error
 *     strings that module documents and sends, so a client written for it reads ours;
 *   - the deprecated names (BLOB.HELLO, BLOB.SET, BLOB.GET), kept for one release: the
 *     first word is a code the client maps to a typed exception.
 * Conditions only our extensions can raise (address proof, regions, TIMEOUT) read the same
 * in both. lmcache_valkey/transport/fabric/commands.py maps both; tests/fabric/
 * test_fabric_dialect.py checks that every string here is mapped.
 * A format takes either nothing, two unsigned long longs (the "n" entries) or one string
 * (the "s" entries): one column may use fewer of them than the other. */
#ifndef LMCV_REPLIES_H
#define LMCV_REPLIES_H

/* X(id, arguments, upstream dialect, deprecated names) */
#define LMCV_ERRORS(X)                                                                                            \
    X(SYNTAX, n, "ERR syntax error", "ERR syntax error in BLOB command arguments")                               \
    X(TRIPLES, n, "ERR memory address args must be rkey, addr, len triples",                                      \
      "ERR triples must be <rkey> <addr> <len> with len > 0, at most 256 of them")                               \
    X(TOO_MANY, n, "ERR too many memory addresses (max 256)",                                                     \
      "ERR triples must be <rkey> <addr> <len> with len > 0, at most 256 of them")                               \
    X(RKEY, n, "ERR invalid rkey", "ERR triples must be <rkey> <addr> <len> with len > 0, at most 256 of them")   \
    X(ADDR, n, "ERR invalid memory address",                                                                      \
      "ERR triples must be <rkey> <addr> <len> with len > 0, at most 256 of them")                               \
    X(ADDRLEN, n, "ERR invalid memory address len",                                                               \
      "ERR triples must be <rkey> <addr> <len> with len > 0, at most 256 of them")                               \
    X(LEN, n, "ERR invalid len", "ERR syntax error in BLOB command arguments")                                   \
    X(ZERO_LENGTH, n, "ERR object length must be > 0", "ERR object length must be > 0")                          \
    X(EXPIRE, n, "ERR invalid expire time in 'blob' command", "ERR invalid expire time in 'blob.set' command")   \
    X(INFO_FIELD, n, "ERR invalid information field", "ERR invalid information field")                           \
    X(NOHELLO, n, "ERR no RDMA session (call BLOB.RDMA_HELLO first)",                                             \
      "NOHELLO send BLOB.HELLO <fabric address hex> on this connection first")                                   \
    X(HELLO_TWICE, n, "ERR RDMA session already established",                                                     \
      "ERR fabric session already established on this connection")                                               \
    X(BADHEX, n, "ERR invalid rdma address hex", "ERR fabric address is not valid hex or was refused by the provider") \
    X(EMPTY_ADDR, n, "ERR rdma address must not be empty",                                                        \
      "ERR fabric address is not valid hex or was refused by the provider")                                      \
    X(BADADDR, n, "ERR rdma address is not an address of this server's provider",                                 \
      "ERR fabric address is not valid hex or was refused by the provider")                                      \
    X(NOFABRIC, n, "ERR RDMA provider unavailable on this instance",                                              \
      "NOFABRIC the endpoint was loaded without a fabric; use bulk mode")                                        \
    X(WINDOW, n, "ERR client address space smaller than object length",                                           \
      "BADWINDOW window of %llu bytes is smaller than the object (%llu bytes)")                                  \
    X(TOOLARGE, n, "ERR max object size exceeded", "TOOLARGE object of %llu bytes exceeds the arena (%llu bytes)") \
    X(NOSPACE, n, "OOM command not allowed when used memory > 'maxmemory'.",                                      \
      "NOSPACE arena has no free extent of %llu bytes")                                                          \
    X(WRONGTYPE, n, "WRONGTYPE Operation against a key holding the wrong kind of value",                          \
      "WRONGTYPE key holds a value that is not a BLOB")                                                          \
    X(CRC, n, "ERR payload CRC32C does not match the CRC argument; nothing stored",                               \
      "ERR payload CRC32C does not match the CRC argument; nothing stored")                                      \
    X(XFER_WRITE, s, "ERR RDMA write failed", "XFERFAILED provider reported %s; inflight=0")                     \
    X(XFER_READ, s, "ERR RDMA read failed", "XFERFAILED provider reported %s; inflight=0")                       \
    X(TIMEOUT, n, "TIMEOUT transfer passed its deadline (%llu ms); inflight=%llu",                                \
      "TIMEOUT transfer passed its deadline (%llu ms); inflight=%llu")                                           \
    X(BUSY, n, "ERR fabric thread is shutting down", "ERR fabric thread is shutting down")                       \
    X(CANTBLOCK, n,                                                                                               \
      "ERR fabric sessions and transfers need a client connection that can block (not MULTI, a script, AOF "      \
      "loading or replication)",                                                                                 \
      "ERR fabric sessions and transfers need a client connection that can block (not MULTI, a script, AOF "      \
      "loading or replication)")                                                                                 \
    X(PROOF_REQUIRED, n, "NOPROOF this server requires HELLO with PROOF (require_proof yes)",                     \
      "NOPROOF this server requires HELLO with PROOF (require_proof yes)")                                       \
    X(NOT_PROVEN, n,                                                                                              \
      "NOPROOF the fabric session is not proven: put the HELLO nonce in registered memory and send "              \
      "BLOB.RDMA_PROVE",                                                                                         \
      "NOPROOF the fabric session is not proven: put the HELLO nonce in registered memory and send "              \
      "BLOB.RDMA_PROVE")                                                                                         \
    X(NO_PROOF_PENDING, n, "ERR no proof is pending on this connection", "ERR no proof is pending on this connection") \
    X(PROOF_WRONG, n, "NOPROOF the nonce was not found at the claimed fabric address",                            \
      "NOPROOF the nonce was not found at the claimed fabric address")                                           \
    X(OUTSIDE_REGIONS, n, "BADREGION a triple lies outside the regions this session declared at HELLO",          \
      "BADREGION a triple lies outside the regions this session declared at HELLO")                              \
    X(OOM, n, "ERR out of memory", "ERR out of memory")                                                          \
    X(PAUSED, n, "TRYAGAIN writes are paused (failover or slot migration); the value was not stored",            \
      "TRYAGAIN writes are paused (failover or slot migration); the value was not stored")                       \
    /* Momento's DMA dialect: its own words, in both columns. */                                                  \
    X(DMA_HEX, n, "ERR invalid hex in address", "ERR invalid hex in address")                                    \
    X(DMA_INT, n, "ERR invalid integer in advertisement", "ERR invalid integer in advertisement")                \
    X(DMA_LEN, n, "ERR length is not an integer or out of range", "ERR length is not an integer or out of range") \
    X(DMA_CRCARG, n, "ERR crc is not an integer or out of range", "ERR crc is not an integer or out of range")    \
    X(DMA_CRC, n, "ERR checksum mismatch: client 0x%08llx, server 0x%08llx (value not stored)",                   \
      "ERR checksum mismatch: client 0x%08llx, server 0x%08llx (value not stored)")                              \
    X(DMA_CAPACITY, n, "ERR value of %llu bytes exceeds the client buffer of %llu bytes",                         \
      "ERR value of %llu bytes exceeds the client buffer of %llu bytes")                                         \
    /* Ours: a DMA command naming another address than its connection's session was opened for. */             \
    X(DMA_ADDR, n, "NOPROOF the address is not the one this connection's fabric session was opened for",        \
      "NOPROOF the address is not the one this connection's fabric session was opened for")

#endif
