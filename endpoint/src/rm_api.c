/* Resolves the module API by name (see rm_api.h). Never touches libfabric or the arena. */
#include "rm_api.h"

#define RM_DEFINE(ret, name, args) ret(*RM_##name) args = NULL;
RM_API_LIST(RM_DEFINE)
RM_OPTIONAL_API_LIST(RM_DEFINE)
#undef RM_DEFINE

int rm_api_init(RMCtx *ctx, const char *name, int ver) {
    /* The server stores its GetApi function in the first word of the context. */
    int (*get_api)(const char *, void *) = (int (*)(const char *, void *))((void **)ctx)[0];
    int missing = 0;
#define RM_RESOLVE(ret, fname, args)                                                    \
    if (get_api("RedisModule_" #fname, (void *)&RM_##fname) != RM_OK) missing++;
    RM_API_LIST(RM_RESOLVE)
#undef RM_RESOLVE
#define RM_RESOLVE_OPTIONAL(ret, fname, args)                                           \
    if (get_api("RedisModule_" #fname, (void *)&RM_##fname) != RM_OK) RM_##fname = NULL;
    RM_OPTIONAL_API_LIST(RM_RESOLVE_OPTIONAL)
#undef RM_RESOLVE_OPTIONAL
    if (missing) return RM_ERR;
    if (RM_IsModuleNameBusy(name)) return RM_ERR;
    RM_SetModuleAttribs(ctx, name, ver, RM_APIVER_1);
    return RM_OK;
}
