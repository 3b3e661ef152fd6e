/* fuzz_zarr_meta.c — the Zarr metadata parser and planner, and the codecs on
 * whatever chunk bytes the input supplies.
 *
 * Input layout (so one corpus file describes a whole little store):
 *   byte 0        mode: bits 0-1 which metadata file the text becomes
 *                       (0 zarr.json, 1 .zarray, 2 .zmetadata beside a v2
 *                       .zgroup, 3 zarr.json of a group whose child "a" gets
 *                       the chunk), bits 2-3 the chunk key ("c/0/0", "0.0",
 *                       "c/0", "0"), bit 4 with mode 0: the text is the
 *                       root's zarr.json, and group "a" (a plain v3 group
 *                       whose child "b" is an array) is opened, so a root's
 *                       consolidated_metadata lists it
 *   bytes 1-2     n, u16 LE: length of the metadata text
 *   n bytes       metadata text
 *   the rest      the chunk file's bytes (absent: no chunk file)
 * The store lives in a private temporary directory, rewritten per input. */
#include "fuzz.h"
#include <sys/stat.h>

static char root[64];

/* the array a consolidated root may list as a/b, or not */
#define B_ARRAY "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[4],\"data_type\":\"float32\"," \
    "\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":[2]}}," \
    "\"chunk_key_encoding\":{\"name\":\"default\"},\"fill_value\":\"0x3f800000\"," \
    "\"codecs\":[{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}}]}"

static void rm_store(void) {
    static const char *files[] = {"zarr.json", ".zarray", ".zgroup", ".zmetadata", "c/0/0", "0.0", "c/0", "0",
                                  "a/zarr.json", "a/c/0/0", "a/0.0", "a/c/0", "a/0",
                                  "a/b/zarr.json", "a/b/c/0/0", "a/b/0.0", "a/b/c/0", "a/b/0"};
    static const char *dirs[] = {"c/0", "c", "a/c/0", "a/c", "a/b/c/0", "a/b/c", "a/b", "a"};
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
    int sub = (mode & 3) == 0 && (mode & 16);
    if (sub) {
        put("a/zarr.json", (const uint8_t *)"{\"zarr_format\":3,\"node_type\":\"group\"}", 38);
        put("a/b/zarr.json", (const uint8_t *)B_ARRAY, sizeof B_ARRAY - 1);
    }
    snprintf(ckey, sizeof ckey, "%s%s", sub ? "a/b/" : (mode & 3) >= 2 ? "a/" : "", key);
    if (clen) put(ckey, chunk, clen);

    /* stores are directories: many chunk files per plan, so a lower cap */
    return ferry_fuzz_open_group(root, "zarr", sub ? "a" : NULL, 10000);
}
FERRY_FUZZ_TARGET(zarr_meta, fuzz_zarr_meta)
