/* fuzz_list.c — listing pages a server sends (src/sources/list.c): the
 * first byte picks the parser (even: ListObjectsV2 XML, odd: GCS's JSON
 * list); every entry taken must be a non-empty NUL-free name under the
 * prefix asked for, at most the bound of entries, and a continuation token
 * only with a page that says there is more. */
#include "fuzz.h"
#include "sources/list.h"

static int fuzz_list(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    ferry_remote_listing L = {0};
    char *next = NULL;
    int rc = data[0] % 2 ? ferry_list_parse_gcs(s, n, "p/", &L, 64, &next)
                         : ferry_list_parse_s3(s, n, "p/", &L, 64, &next);
    if (rc < 0 && next) abort();
    if (L.n > 64) abort();
    for (size_t i = 0; i < L.n; i++)
        if (!L.e[i].name || !L.e[i].name[0] || (L.e[i].dir && L.e[i].size)) abort();
    free(next);
    ferry_remote_listing_free(&L);
    return 0;
}
FERRY_FUZZ_TARGET(list, fuzz_list)
