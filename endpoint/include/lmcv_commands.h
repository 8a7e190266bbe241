/* The one place where the endpoint's command names and module identity live.
 * The Python side mirrors these in lmcache_valkey/transport/fabric/commands.py;
 * tests/fabric/test_dialect.py checks that the two lists agree.
 * Names follow the valkey-large-object BLOB.* family (docs/fabric-command-dialect.md). */
#ifndef LMCV_COMMANDS_H
#define LMCV_COMMANDS_H

#define LMCV_MODULE_NAME "lmcvblob"
#define LMCV_MODULE_VERSION 1
/* Module data type names must be exactly 9 characters. */
#define LMCV_TYPE_NAME "lmcvblob0"
/* 2: length, crc32c, bytes (1: bytes only, still loaded). */
#define LMCV_TYPE_ENCVER 2

#define LMCV_CMD_HELLO "BLOB.HELLO"
#define LMCV_CMD_SET "BLOB.SET"
#define LMCV_CMD_GET "BLOB.GET"
#define LMCV_CMD_INFO "BLOB.INFO"
/* Extension (docs/security.md): PROVE <rkey> <addr> completes HELLO ... PROOF. */
#define LMCV_CMD_PROVE "BLOB.RDMA_PROVE"

/* ACL category of every command (servers with module ACL categories: Valkey 8+):
 * the same name as valkey-large-object's, so one ACL rule serves either module. */
#define LMCV_ACL_CATEGORY "largeobj"

/* Trailing keyword options (after the triples). */
#define LMCV_OPT_PX "PX"           /* SET: expiry in milliseconds */
#define LMCV_OPT_TIMEOUT "TIMEOUT" /* GET/SET: transfer deadline in milliseconds */
#define LMCV_OPT_PARTIAL "PARTIAL" /* GET: write min(obj_len, window), reply obj_len */
/* HELLO extensions: PROOF (reply carries a nonce to put in registered memory for PROVE),
 * REGION <rkey> <addr> <len> (transfers confined to the declared regions). */
#define LMCV_OPT_PROOF "PROOF"
#define LMCV_OPT_REGION "REGION"

#endif
