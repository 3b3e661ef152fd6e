/* fuzz_mds.c — Mosaic MDS directories (src/formats/mds.c): the input is an
 * index.json, the separator "\n--shard--\n", then the shard's bytes, written
 * into a directory as index.json and as shard.00000.mds and .mds.zstd (the
 * seeds' raw and compressed basenames), then opened through
 * ferry_shards_open; every member of the index must read back. */
#include "fuzz.h"
#include "ferry_experimental.h"
#include <fcntl.h>

static void put(const char *dir, const char *name, const uint8_t *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || (n && write(fd, p, n) != (ssize_t)n)) abort();
    close(fd);
}

static int fuzz_mds(const uint8_t *data, size_t size) {
    static char dir[] = "/tmp/ferry-fuzz-mds-XXXXXX";
    static int made;
    if (!made && !mkdtemp(dir)) abort();
    made = 1;
    static const char sep[] = "\n--shard--\n";
    const uint8_t *cut = memmem(data, size, sep, sizeof sep - 1);
    size_t ilen = cut ? (size_t)(cut - data) : size;
    const uint8_t *shard = cut ? cut + sizeof sep - 1 : data + size;
    size_t slen = (size_t)(data + size - shard);
    put(dir, "index.json", data, ilen);
    put(dir, "shard.00000.mds", shard, slen);
    put(dir, "shard.00000.mds.zstd", shard, slen);
    const char *paths[1] = {dir};
    ferry_shards *s = NULL;
    ferry_ctx *ctx = ferry_fuzz_ctx();
    int rc = ferry_shards_open(ctx, paths, 1, "mds", &s);
    if (rc < 0) {
        if (s || !ferry_errmsg(ctx)[0]) abort();
        return 0;
    }
    static uint8_t buf[1 << 16];
    for (int64_t i = 0; i < ferry_shards_count(s) && i < 64; i++) {
        ferry_sample_info si;
        if (ferry_shards_sample(s, i, &si) < 0) abort();
        for (int m = 0; m < si.nmembers; m++) {
            ferry_member_info mi;
            if (ferry_shards_member(s, i, m, &mi) < 0) abort();
            if (mi.size <= sizeof buf && ferry_shards_read(s, i, m, buf, sizeof buf) != (int64_t)mi.size) abort();
        }
    }
    ferry_shards_close(s);
    return 0;
}
FERRY_FUZZ_TARGET(mds, fuzz_mds)
