/* cacheshare.h — the share of the page cache a context's re-read files may
 * take (cacheshare.c). Internal. */
#ifndef FERRY_ENGINE_CACHESHARE_H
#define FERRY_ENGINE_CACHESHARE_H
#include "engine/ctx.h"
#include "engine/file.h"

/* Whether f still fits the context's share: its size is counted once, the
 * first time it is asked about; once the files counted pass the share, no
 * file does any more (for the rest of the context). */
int ferry_cache_share_holds(ferry_ctx *ctx, ferry_file *f);
/* Tests: the share in bytes (0: back to half the machine's memory). */
void ferry_cache_share_set(uint64_t bytes);
#endif
