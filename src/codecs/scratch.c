/* scratch.c — the codecs' growable buffers (codecs/impl.h): every decoder
 * that needs room beyond its output (decode.c's ping-pong buffers, blosc's
 * blocks, zlib's window copies) grows one here, so a warm scratch never
 * allocates. Calls nothing of the codecs. */
#include "codecs/impl.h"
#include <stdlib.h>

uint8_t *ferry_scratch_reserve(uint8_t **buf, size_t *cap, size_t need) {
    if (*buf && *cap >= need) return *buf;
    size_t want = need < 4096 ? 4096 : need + need / 4;  /* some headroom: fewer regrowths */
    uint8_t *p = realloc(*buf, want);
    if (!p) return NULL;
    *buf = p; *cap = want;
    return p;
}
