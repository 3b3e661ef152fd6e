/* remotectx.h — a context's remote options (ferry_ctx_set_remote_option):
 * what file.c opens remote objects with, and what formats list stores and
 * globs with. Internal. */
#ifndef FERRY_ENGINE_REMOTECTX_H
#define FERRY_ENGINE_REMOTECTX_H
#include "common.h"
#include "sources/ropts.h"

/* The options set on ctx, or NULL (none set: the environment's alone). */
const ferry_remote_opts *ferry_ctx_remote_opts(const ferry_ctx *ctx);
/* At ferry_ctx_destroy. */
void ferry_ctx_remote_free(ferry_ctx *ctx);
#endif
