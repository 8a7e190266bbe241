/* Our own declarations of the slice of the Valkey/Redis module API this endpoint uses.
 * No third-party header is vendored: every entry point is a function-pointer global that
 * rm_api_init() resolves by name through the GetApi pointer the server hands us in the
 * first word of the load context. Valkey 8/9 still export every API under its
 * "RedisModule_" name, so one binary loads in Valkey 8.0, 9.1 and Redis 7.0
 * (docs/fabric-module-api.md). Only module.c includes this file. */
#ifndef LMCV_RM_API_H
#define LMCV_RM_API_H

#include <stddef.h>
#include <stdint.h>

#define RM_OK 0
#define RM_ERR 1
#define RM_APIVER_1 1
#define RM_READ (1 << 0)
#define RM_WRITE (1 << 1)
#define RM_NO_EXPIRE (-1)
#define RM_KEYTYPE_EMPTY 0
#define RM_KEYTYPE_STRING 1
#define RM_KEYTYPE_MODULE 6
#define RM_TYPE_METHOD_VERSION 1
#define RM_LOG_WARNING "warning"
#define RM_LOG_NOTICE "notice"
#define RM_EVENT_CLIENT_CHANGE 4
#define RM_EVENT_SHUTDOWN 5
#define RM_SUBEVENT_CLIENT_CHANGE_DISCONNECTED 1
#define RM_POSTPONED_ARRAY_LEN (-1)
/* SetModuleOptions: IO errors while loading our values are reported to rdb_load (which
 * then refuses the value) instead of ending the server. */
#define RM_OPTIONS_HANDLE_IO_ERRORS (1 << 0)
/* Valkey 9.0: the module's keys may move by CLUSTER MIGRATESLOTS (the source sends them as
 * the commands aof_rewrite emits, then the writes it replicates while the move runs). Unset,
 * every node of the cluster refuses atomic slot migration while the module is loaded. */
#define RM_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION (1 << 5)
/* GetContextFlags bits for calls that cannot hold a fabric session or block. */
#define RM_CTX_FLAGS_LUA (1 << 0)
#define RM_CTX_FLAGS_MULTI (1 << 1)
#define RM_CTX_FLAGS_MASTER (1 << 2)
#define RM_CTX_FLAGS_CLUSTER (1 << 5)
#define RM_CTX_FLAGS_AOF (1 << 6)
#define RM_CTX_FLAGS_REPLICATED (1 << 12)
#define RM_CTX_FLAGS_LOADING (1 << 13)
#define RM_CTX_FLAGS_DENY_BLOCKING (1 << 21)

/* Key-spec flags and search types (SetCommandInfo, command info version 1). */
#define RM_CMD_KEY_RO (1ULL << 0)
#define RM_CMD_KEY_OW (1ULL << 2)
#define RM_CMD_KEY_ACCESS (1ULL << 4)
#define RM_CMD_KEY_UPDATE (1ULL << 5)
#define RM_KSPEC_BS_INDEX 2
#define RM_KSPEC_FK_RANGE 2

typedef struct RMCtx RMCtx;
typedef struct RMString RMString;
typedef struct RMKey RMKey;
typedef struct RMType RMType;
typedef struct RMIO RMIO;
typedef struct RMInfoCtx RMInfoCtx;
typedef struct RMBlockedClient RMBlockedClient;
typedef int (*RMCmdFunc)(RMCtx *ctx, RMString **argv, int argc);
typedef void (*RMFreePrivFunc)(RMCtx *ctx, void *privdata);
typedef void (*RMInfoFunc)(RMInfoCtx *ctx, int for_crash_report);

/* Layout fixed by the server for TYPE_METHOD_VERSION 1. */
typedef struct {
    uint64_t version;
    void *(*rdb_load)(RMIO *rdb, int encver);
    void (*rdb_save)(RMIO *rdb, void *value);
    void (*aof_rewrite)(RMIO *aof, RMString *key, void *value);
    size_t (*mem_usage)(const void *value);
    void (*digest)(void *md, void *value);
    void (*free)(void *value);
} RMTypeMethods;

/* Passed by value to SubscribeToServerEvent. */
typedef struct {
    uint64_t id;
    uint64_t dataver;
} RMEvent;

/* The leading fields of RedisModuleClientInfo (v1); we only read the id. */
typedef struct {
    uint64_t version;
    uint64_t flags;
    uint64_t id;
} RMClientInfoHead;

/* Command info, version 1 (the layout the server steps through with the sizes below). */
typedef struct {
    const char *since;
    const char *changes;
} RMCommandHistoryEntry;

typedef struct {
    const char *notes;
    uint64_t flags;
    int begin_search_type;
    union {
        struct { int pos; } index;
        struct { const char *keyword; int startfrom; } keyword;
    } bs;
    int find_keys_type;
    union {
        struct { int lastkey, keystep, limit; } range;
        struct { int keynumidx, firstkey, keystep; } keynum;
    } fk;
} RMCommandKeySpec;

typedef struct RMCommandArg {
    const char *name;
    int type;
    int key_spec_index;
    const char *token, *summary, *since;
    int flags;
    const char *deprecated_since;
    struct RMCommandArg *subargs;
    const char *display_text;
} RMCommandArg;

typedef struct {
    int version;
    size_t sizeof_historyentry, sizeof_keyspec, sizeof_arg;
} RMCommandInfoVersion;

typedef struct {
    const RMCommandInfoVersion *version;
    const char *summary, *complexity, *since;
    RMCommandHistoryEntry *history;
    const char *tips;
    int arity;
    RMCommandKeySpec *key_specs;
    RMCommandArg *args;
} RMCommandInfo;

typedef struct RMCommand RMCommand;

typedef void (*RMEventCallback)(RMCtx *ctx, RMEvent e, uint64_t sub, void *data);
typedef void (*RMTimerProc)(RMCtx *ctx, void *data);
typedef struct RMCallReply RMCallReply;
typedef struct RMServerInfoData RMServerInfoData;

#define RM_API_LIST(X)                                                                          \
    X(int, SetModuleAttribs, (RMCtx *, const char *, int, int))                                \
    X(int, IsModuleNameBusy, (const char *))                                                   \
    X(int, CreateCommand, (RMCtx *, const char *, RMCmdFunc, const char *, int, int, int))     \
    X(int, WrongArity, (RMCtx *))                                                              \
    X(int, ReplyWithError, (RMCtx *, const char *))                                            \
    X(int, ReplyWithSimpleString, (RMCtx *, const char *))                                     \
    X(int, ReplyWithLongLong, (RMCtx *, long long))                                            \
    X(int, ReplyWithArray, (RMCtx *, long))                                                    \
    X(int, ReplyWithStringBuffer, (RMCtx *, const char *, size_t))                             \
    X(int, ReplyWithNull, (RMCtx *))                                                           \
    X(const char *, StringPtrLen, (const RMString *, size_t *))                                \
    X(void *, OpenKey, (RMCtx *, RMString *, int))                                             \
    X(void, CloseKey, (RMKey *))                                                               \
    X(int, KeyType, (RMKey *))                                                                 \
    X(int, DeleteKey, (RMKey *))                                                               \
    X(int, SetExpire, (RMKey *, long long))                                                    \
    X(RMType *, CreateDataType, (RMCtx *, const char *, int, void *))                          \
    X(int, ModuleTypeSetValue, (RMKey *, RMType *, void *))                                    \
    X(RMType *, ModuleTypeGetType, (RMKey *))                                                  \
    X(void *, ModuleTypeGetValue, (RMKey *))                                                   \
    X(void, SaveStringBuffer, (RMIO *, const char *, size_t))                                  \
    X(char *, LoadStringBuffer, (RMIO *, size_t *))                                            \
    X(void, EmitAOF, (RMIO *, const char *, const char *, ...))                                \
    X(void, Free, (void *))                                                                    \
    X(RMBlockedClient *, BlockClient,                                                          \
      (RMCtx *, RMCmdFunc, RMCmdFunc, RMFreePrivFunc, long long))                              \
    X(int, UnblockClient, (RMBlockedClient *, void *))                                         \
    X(void *, GetBlockedClientPrivateData, (RMCtx *))                                          \
    X(unsigned long long, GetClientId, (RMCtx *))                                              \
    X(int, SubscribeToServerEvent, (RMCtx *, RMEvent, RMEventCallback))                        \
    X(int, RegisterInfoFunc, (RMCtx *, RMInfoFunc))                                            \
    X(int, InfoAddSection, (RMInfoCtx *, const char *))                                        \
    X(int, InfoAddFieldULongLong, (RMInfoCtx *, const char *, unsigned long long))             \
    X(int, InfoAddFieldCString, (RMInfoCtx *, const char *, const char *))                     \
    X(void, Log, (RMCtx *, const char *, const char *, ...))                                   \
    X(uint64_t, CreateTimer, (RMCtx *, long long, RMTimerProc, void *))                        \
    X(RMCallReply *, Call, (RMCtx *, const char *, const char *, ...))                         \
    X(void, FreeCallReply, (RMCallReply *))                                                    \
    X(const char *, CallReplyStringPtr, (RMCallReply *, size_t *))                          \
    X(void, SetModuleOptions, (RMCtx *, int))                                                  \
    X(int, IsIOError, (RMIO *))                                                                \
    X(void, SaveUnsigned, (RMIO *, uint64_t))                                                  \
    X(uint64_t, LoadUnsigned, (RMIO *))                                                        \
    X(long long, Milliseconds, (void))                                                         \
    X(int, GetContextFlags, (RMCtx *))                                                         \
    X(RMString *, CreateString, (RMCtx *, const char *, size_t))                               \
    X(void, FreeString, (RMCtx *, RMString *))                                                 \
    X(long long, GetExpire, (RMKey *))                                                         \
    X(int, GetSelectedDb, (RMCtx *))                                                           \
    X(int, SelectDb, (RMCtx *, int))                                                           \
    X(int, Replicate, (RMCtx *, const char *, const char *, ...))                              \
    X(RMServerInfoData *, GetServerInfo, (RMCtx *, const char *))                              \
    X(void, FreeServerInfo, (RMCtx *, RMServerInfoData *))                                     \
    X(unsigned long long, ServerInfoGetFieldUnsigned, (RMServerInfoData *, const char *, int *))       \
    X(int, StringSet, (RMKey *, RMString *))                                                   \
    X(int, AvoidReplicaTraffic, (void))                                                        \
    X(char *, StringDMA, (RMKey *, size_t *, int))

/* Entry points some supported servers lack (Redis 7.0 has no ACL categories for modules):
 * NULL when absent, and the caller degrades as documented where it is used. */
#define RM_OPTIONAL_API_LIST(X)                                                                 \
    X(RMCommand *, GetCommand, (RMCtx *, const char *))                                        \
    X(int, SetCommandInfo, (RMCommand *, const RMCommandInfo *))                               \
    X(int, AddACLCategory, (RMCtx *, const char *))                                            \
    X(int, SetCommandACLCategories, (RMCommand *, const char *))                               \
    X(int, RedactClientCommandArgument, (RMCtx *, int))                                        \
    X(const RMString *, GetKeyNameFromIO, (RMIO *))                                            \
    X(int, GetDbIdFromIO, (RMIO *))                                                            \
    X(int, GetModuleOptionsAll, (void))

#define RM_DECLARE(ret, name, args) extern ret(*RM_##name) args;
RM_API_LIST(RM_DECLARE)
RM_OPTIONAL_API_LIST(RM_DECLARE)
#undef RM_DECLARE

/* Resolve every pointer above and register the module's name. RM_OK or RM_ERR. */
int rm_api_init(RMCtx *ctx, const char *name, int ver);

#endif
