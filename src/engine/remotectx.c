/* remotectx.c — remote options held by a context: set before the context
 * opens URLs, read by every open of a remote object and every listing. */
#include "ferry_experimental.h"
#include "engine/ctx.h"
#include "engine/remotectx.h"
#include "sources/glob.h"
#include <stdlib.h>

const ferry_remote_opts *ferry_ctx_remote_opts(const ferry_ctx *ctx) { return ctx ? ctx->remote : NULL; }

void ferry_ctx_remote_free(ferry_ctx *ctx) {
    if (!ctx || !ctx->remote) return;
    ferry_remote_opts_free(ctx->remote);
    free(ctx->remote);
    ctx->remote = NULL;
}

int ferry_ctx_set_remote_option(ferry_ctx *ctx, const char *name, const char *value) {
    if (!ctx || !name) return ferry_seterr(FERRY_EINVAL, "ferry_ctx_set_remote_option: no context or name");
    pthread_mutex_lock(&ctx->lock);
    int rc = 0;
    if (!ctx->remote) {
        if (!(ctx->remote = malloc(sizeof *ctx->remote))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        else ferry_remote_opts_init(ctx->remote);
    }
    if (rc == 0) rc = ferry_remote_opts_set(ctx->remote, name, value);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int ferry_url_glob(ferry_ctx *ctx, const char *pattern, char **urls, size_t *n) {
    if (!ctx || !pattern || !urls || !n) return ferry_seterr(FERRY_EINVAL, "ferry_url_glob: NULL argument");
    return ferry_remote_glob(pattern, ctx->remote, urls, n);
}
