/* The one place where the endpoint's command names and module identity live.
 * The Python side mirrors these in lmcache_valkey/transport/fabric/commands.py;
 * tests/fabric/test_fabric_dialect.py checks that the two lists agree.
 * The names and replies are valkey-large-object's (docs/fabric-command-dialect.md); the
 * deprecated names of our earlier dialect stay for one release. */
#ifndef LMCV_COMMANDS_H
#define LMCV_COMMANDS_H

#define LMCV_MODULE_NAME "lmcvblob"
#define LMCV_MODULE_VERSION 2
/* Module data type names must be exactly 9 characters. */
#define LMCV_TYPE_NAME "lmcvblob0"
/* 2: length, crc32c, bytes (1: bytes only, still loaded). */
#define LMCV_TYPE_ENCVER 2

/* The valkey-large-object command set. */
#define LMCV_CMD_RDMA_HELLO "BLOB.RDMA_HELLO"
#define LMCV_CMD_RDMA_SET "BLOB.RDMA_SET"
#define LMCV_CMD_RDMA_GET "BLOB.RDMA_GET"
#define LMCV_CMD_TCP_SET "BLOB.TCP_SET"
#define LMCV_CMD_TCP_GET "BLOB.TCP_GET"
#define LMCV_CMD_INFO "BLOB.INFO"
/* Extension (docs/security.md): PROVE <rkey> <addr> completes RDMA_HELLO ... PROOF. */
#define LMCV_CMD_PROVE "BLOB.RDMA_PROVE"

/* Momento's DMA dialect (momentohq/vdma, design/Design.md): values are plain strings.
 *   DMA.HELLO                                   -> [server address hex, ...]
 *   DMA.SET <addr hex> <rkey> <raddr> <len> <key> [<crc32c>]       -> len
 *   DMA.GET <addr hex> <rkey> <raddr> <capacity> <key> [<crc-flag>] -> n | [n, crc32c] | nil
 *   DMA.INFO                                    -> ["field: value", ...]
 * Extension (ours): DMA.HELLO <addr hex> PROOF [REGION <rkey> <addr> <len>]... then
 * DMA.PROVE <rkey> <addr>, as BLOB.RDMA_HELLO/BLOB.RDMA_PROVE. */
#define LMCV_CMD_DMA_HELLO "DMA.HELLO"
#define LMCV_CMD_DMA_SET "DMA.SET"
#define LMCV_CMD_DMA_GET "DMA.GET"
#define LMCV_CMD_DMA_INFO "DMA.INFO"
#define LMCV_CMD_DMA_PROVE "DMA.PROVE"

/* Deprecated (one release): our earlier names. SET/GET pick bulk or RMA by their shape. */
#define LMCV_CMD_LEGACY_HELLO "BLOB.HELLO"
#define LMCV_CMD_LEGACY_SET "BLOB.SET"
#define LMCV_CMD_LEGACY_GET "BLOB.GET"

/* ACL category of every command (servers with module ACL categories: Valkey 8+):
 * the same name as valkey-large-object's, so one ACL rule serves either module. */
#define LMCV_ACL_CATEGORY "largeobj"

/* Upstream option: RDMA_SET key total-len [CRC crc32c] triples... */
#define LMCV_OPT_CRC "CRC"
/* BLOB.INFO fields (the reply names them in lower case). */
#define LMCV_INFO_LEN "LEN"
#define LMCV_INFO_CRC "CRC"
#define LMCV_INFO_TIER "TIER"

/* Extensions, trailing keyword options (after the triples). */
#define LMCV_OPT_PX "PX"           /* SET: expiry in milliseconds */
#define LMCV_OPT_TIMEOUT "TIMEOUT" /* GET/SET: transfer deadline in milliseconds */
#define LMCV_OPT_PARTIAL "PARTIAL" /* GET: write min(obj_len, window), reply obj_len */
/* HELLO extensions: PROOF (reply carries a nonce to put in registered memory for PROVE),
 * REGION <rkey> <addr> <len> (transfers confined to the declared regions). */
#define LMCV_OPT_PROOF "PROOF"
#define LMCV_OPT_REGION "REGION"

/* INFO lmcvblob's peer_mode: which mode the server runs in (module argument require_proof,
 * docs/security.md); doctor reads it. The weak mode also reports peer_warning. */
#define LMCV_PEER_MODE_PROVEN "proven"
#define LMCV_PEER_MODE_UNPROVEN "unproven"
#define LMCV_PEER_WARNING                                                                          \
    "any client allowed BLOB.* can claim another client's fabric address and with its remote key " \
    "read and write its registered memory; meant only for clients that cannot prove"

#endif
