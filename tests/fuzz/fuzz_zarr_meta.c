/* fuzz_zarr_meta.c — the Zarr metadata parser and planner, and the codecs on
 * whatever chunk bytes the input supplies.
 *
 * Input layout (so one corpus file describes a whole little store):
 *   byte 0        mode: bits 0-1 which metadata file the text becomes
 *                       (0 zarr.json, 1 .zarray, 2 .zmetadata beside a v2
 *                       .zgroup, 3 zarr.json of a group whose child "a" gets
 *                       the chunk), bits 2-3 the chunk key ("c/0/0", "0.0",
 *                       "c/0", "0")
 *   bytes 1-2     n, u16 LE: length of the metadata text
 *   n bytes       metadata text
 *   the rest      the chunk file's bytes (absent: no chunk file)
 * The store lives in a private temporary directory, rewritten per input. */
#include "fuzz.h"
#include <sys/stat.h>

static char root[64];

static void rm_store(void) {
    static const char *files[] = {"zarr.json", ".zarray", ".zgroup", ".zmetadata", "c/0/0", "0.0", "c/0", "0",
                                  "a/zarr.json", "a/c/0/0", "a/0.0", "a/c/0", "a/0"};
    static const char *dirs[] = {"c/0", "c", "a/c/0", "a/c", "a"};
    char p[128];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) { snprintf(p, sizeof p, "%s/%s", root, files[i]); unlink(p); }
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) { snprintf(p, sizeof p, "%s/%s", root, dirs[i]); rmdir(p); }
}

static void cleanup(void) { rm_store(); rmdir(root); }

static void put(const char *rel, const uint8_t *d, size_t n) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    /* make parent directories */
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) { *s = 0; mkdir(p, 0700); *s = '/'; }
    FILE *f = fopen(p, "wb");
    if (!f) return;   /* e.g. a file where a directory is needed: fine, the store is just odd */
    if (n) fwrite(d, 1, n, f);
    fclose(f);
}

static int fuzz_zarr_meta(const uint8_t *data, size_t size) {
    if (!root[0]) {
        snprintf(root, sizeof root, "/tmp/ferry-fuzz-zarr-XXXXXX");
        if (!mkdtemp(root)) abort();
        atexit(cleanup);
    }
    if (size < 3) return 0;
    rm_store();
    int mode = data[0];
    size_t n = (size_t)data[1] | (size_t)data[2] << 8;
    if (n > size - 3) n = size - 3;
    const uint8_t *meta = data + 3, *chunk = data + 3 + n;
    size_t clen = size - 3 - n;
    static const char *keys[] = {"c/0/0", "0.0", "c/0", "0"};
    const char *key = keys[(mode >> 2) & 3];
    char ckey[32];
    switch (mode & 3) {
    case 0: put("zarr.json", meta, n); break;
    case 1: put(".zarray", meta, n); break;
    case 2: put(".zgroup", (const uint8_t *)"{\"zarr_format\":2}", 17); put(".zmetadata", meta, n); break;
    case 3: put("zarr.json", (const uint8_t *)"{\"zarr_format\":3,\"node_type\":\"group\"}", 38);
            put("a/zarr.json", meta, n); break;
    }
    snprintf(ckey, sizeof ckey, "%s%s", (mode & 3) >= 2 ? "a/" : "", key);
    if (clen) put(ckey, chunk, clen);

    /* stores are directories: many chunk files per plan, so a lower cap */
    return ferry_fuzz_open_path(root, "zarr", 10000);
}
FERRY_FUZZ_TARGET(zarr_meta, fuzz_zarr_meta)
