/* test_mds.c — Mosaic MDS directories built here (index.json and shards laid
 * out as mosaicml-streaming's MDSWriter lays them, raw and zstd-compressed),
 * indexed through ferry_shards_open, then damaged one field at a time. */
#include "check.h"
#include "ferry_experimental.h"
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

static ferry_ctx *ctx;
static char root[] = "/tmp/ferry-test-mds-XXXXXX";

typedef struct bytes {
    uint8_t p[1 << 16];
    size_t n;
} bytes;

static void put32(bytes *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[b->n++] = (uint8_t)(v >> (8 * i));
}
static void put(bytes *b, const void *p, size_t n) { memcpy(b->p + b->n, p, n); b->n += n; }

/* A shard of `n` samples with columns (label: int, fixed 8) and (name: str,
 * variable): sample i's name is "name-<i>" repeated i+1 times (lengths differ). */
static void make_shard(bytes *b, uint32_t n) {
    static const char config[] = "{\"columns\":\"...\"}";   /* the writer's JSON config, skipped by readers */
    bytes body = {.n = 0};
    uint32_t off[64];
    uint32_t start = 4 + 4 * (n + 1) + (uint32_t)strlen(config);
    for (uint32_t i = 0; i < n; i++) {
        off[i] = start + (uint32_t)body.n;
        char name[256];
        size_t len = 0;
        for (uint32_t k = 0; k <= i; k++) len += (size_t)snprintf(name + len, sizeof name - len, "name-%u", i);
        put32(&body, (uint32_t)len);                   /* the size table: the one variable column */
        uint64_t label = 1000 + i;
        put(&body, &label, 8);                         /* columns in name order: label, name */
        put(&body, name, len);
    }
    off[n] = start + (uint32_t)body.n;
    b->n = 0;
    put32(b, n);
    for (uint32_t i = 0; i <= n; i++) put32(b, off[i]);
    put(b, config, strlen(config));
    put(b, body.p, body.n);
}

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

/* index.json for shards of `n[k]` samples each; zip: zstd, else raw */
static void write_index(const char *dir, int nshards, const uint32_t *n, const uint64_t *raw, const uint64_t *zip,
                        const char *compression, const char *extra) {
    char text[8192];
    size_t len = (size_t)snprintf(text, sizeof text, "{\"version\": 2, \"shards\": [");
    for (int k = 0; k < nshards; k++) {
        char zipd[256] = "null";
        if (zip) snprintf(zipd, sizeof zipd, "{\"basename\": \"shard.%05d.mds.zstd\", \"bytes\": %llu, \"hashes\": {}}", k,
                          (unsigned long long)zip[k]);
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "%s{\"column_encodings\": [\"int\", \"str\"], \"column_names\": [\"label\", \"name\"],"
                                " \"column_sizes\": [8, null], \"compression\": %s, \"format\": \"mds\","
                                " \"raw_data\": {\"basename\": \"shard.%05d.mds\", \"bytes\": %llu, \"hashes\": {}},"
                                " \"samples\": %u, \"size_limit\": 67108864, \"version\": 2, \"zip_data\": %s%s}",
                                k ? ", " : "", compression, k, (unsigned long long)raw[k], n[k], zipd, extra);
    }
    len += (size_t)snprintf(text + len, sizeof text - len, "]}");
    write_file(dir, "index.json", text, len);
}

static char *fresh_dir(const char *name) {
    static char d[512];
    snprintf(d, sizeof d, "%s/%s", root, name);
    mkdir(d, 0755);
    return d;
}

static int open_dir(const char *d, ferry_shards **s) {
    const char *p[1] = {d};
    return ferry_shards_open(ctx, p, 1, NULL, s);
}

static void check_samples(ferry_shards *s, uint32_t first_n) {
    char buf[512];
    ferry_member_info mi;
    ferry_sample_info si;
    CHECK_EQ_I(ferry_shards_sample(s, 2, &si), 0);
    CHECK(!strcmp(si.key, "shard.00000.mds:2") || !strcmp(si.key, "shard.00000.mds.zstd:2"));
    CHECK_EQ_I(si.nmembers, 2);
    CHECK_EQ_I(ferry_shards_member(s, 2, 0, &mi), 0);
    CHECK(!strcmp(mi.name, "label") && !strcmp(mi.encoding, "int"));
    CHECK_EQ_I(ferry_shards_read(s, 2, 0, buf, sizeof buf), 8);
    uint64_t v;
    memcpy(&v, buf, 8);
    CHECK_EQ_I(v, 1002);
    CHECK_EQ_I(ferry_shards_read(s, 2, 1, buf, sizeof buf), 18);
    CHECK(!memcmp(buf, "name-2name-2name-2", 18));
    /* the second shard's first sample */
    CHECK_EQ_I(ferry_shards_read(s, first_n, 1, buf, sizeof buf), 6);
    CHECK(!memcmp(buf, "name-0", 6));
}

static void test_raw_shards(void) {
    char *d = fresh_dir("raw");
    bytes b0, b1;
    make_shard(&b0, 5);
    make_shard(&b1, 3);
    write_file(d, "shard.00000.mds", b0.p, b0.n);
    write_file(d, "shard.00001.mds", b1.p, b1.n);
    uint32_t n[2] = {5, 3};
    uint64_t raw[2] = {b0.n, b1.n};
    write_index(d, 2, n, raw, NULL, "null", "");
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_dir(d, &s), 0);
    if (!s) return;
    CHECK(!strcmp(ferry_shards_format(s), "mds"));
    CHECK_EQ_I(ferry_shards_count(s), 8);
    check_samples(s, 5);
    ferry_member_info mi;
    CHECK_EQ_I(ferry_shards_member(s, 0, 1, &mi), 0);
    CHECK_EQ_I(mi.compressed, 0);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    char dst[32] = {0};
    CHECK_EQ_I(ferry_shards_plan_member(s, 1, 1, ferry_host_buf(dst, sizeof dst), 0, plan), 12);
    CHECK_EQ_I(ferry_run(ctx, plan, NULL), 12);
    CHECK(!memcmp(dst, "name-1name-1", 12));
    ferry_plan_destroy(plan);
    ferry_shards_close(s);
}

static void test_zstd_shards(void) {
    char *d = fresh_dir("zstd");
    bytes b[2];
    uint32_t n[2] = {4, 2};
    uint64_t raw[2], zip[2];
    for (int k = 0; k < 2; k++) {
        make_shard(&b[k], n[k]);
        static uint8_t z[1 << 17];
        size_t zn = ZSTD_compress(z, sizeof z, b[k].p, b[k].n, 3);
        char name[64];
        snprintf(name, sizeof name, "shard.%05d.mds.zstd", k);
        write_file(d, name, z, zn);
        raw[k] = b[k].n;
        zip[k] = zn;
    }
    write_index(d, 2, n, raw, zip, "\"zstd:7\"", "");
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_dir(d, &s), 0);
    if (!s) return;
    CHECK_EQ_I(ferry_shards_count(s), 6);
    check_samples(s, 4);
    ferry_member_info mi;
    CHECK_EQ_I(ferry_shards_member(s, 5, 1, &mi), 0);
    CHECK_EQ_I(mi.compressed, 1);
    ferry_plan *plan;
    ferry_plan_create(&plan);
    char dst[32];
    CHECK_EQ_I(ferry_shards_plan_member(s, 0, 0, ferry_host_buf(dst, sizeof dst), 0, plan), FERRY_EUNSUPPORTED);
    ferry_plan_destroy(plan);
    ferry_shards_close(s);
    /* compression ferry does not read */
    write_index(d, 2, n, raw, zip, "\"br\"", "");
    CHECK_EQ_I(open_dir(d, &s), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "compression \"br\"");
    /* raw size that lies */
    raw[1] += 1;
    write_index(d, 2, n, raw, zip, "\"zstd\"", "");
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "shard.00001.mds.zstd: decodes to");
}

static void test_damage(void) {
    char *d = fresh_dir("bad");
    bytes b;
    make_shard(&b, 4);
    uint32_t n[1] = {4};
    uint64_t raw[1] = {b.n};
    ferry_shards *s = NULL;
    /* the shard's sample count against index.json's */
    write_file(d, "shard.00000.mds", b.p, b.n);
    n[0] = 5;
    write_index(d, 1, n, raw, NULL, "null", "");
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "shard.00000.mds: byte 0: 4 samples; index.json says 5");
    n[0] = 4;
    /* the file's size against index.json's */
    raw[0] = b.n + 1;
    write_index(d, 1, n, raw, NULL, "null", "");
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "index.json says");
    raw[0] = b.n;
    write_index(d, 1, n, raw, NULL, "null", "");
    /* offsets out of order */
    bytes bad = b;
    uint32_t o2 = bad.p[12] | bad.p[13] << 8;   /* sample 2's end before its start */
    bad.p[16] = (uint8_t)(o2 - 1); bad.p[17] = (uint8_t)((o2 - 1) >> 8);
    write_file(d, "shard.00000.mds", bad.p, bad.n);
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "byte 16: sample 2 ends");
    /* a size table that does not add up */
    bad = b;
    uint32_t s1 = bad.p[8] | bad.p[9] << 8;   /* sample 1's start: its size table */
    bad.p[s1] ^= 1;
    write_file(d, "shard.00000.mds", bad.p, bad.n);
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    char want[64];
    snprintf(want, sizeof want, "byte %u: sample 1: its columns add up", s1);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), want);
    /* a count that would need more table than the file has */
    bad = b;
    bad.p[2] = 0x10;
    write_file(d, "shard.00000.mds", bad.p, bad.n);
    n[0] = 4 + (0x10 << 16);
    write_index(d, 1, n, raw, NULL, "null", "");
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "offset table");
    n[0] = 4;
    write_file(d, "shard.00000.mds", b.p, b.n);
    /* index fields */
    write_index(d, 1, n, raw, NULL, "null", ", \"x\": 1, \"column_sizes\": [8]");   /* duplicate key: JSON error */
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    const char *bad_index = "{\"version\": 2, \"shards\": [{\"format\": \"mds\", \"samples\": 1,"
                            " \"column_names\": [\"a\"], \"column_encodings\": [\"bytes\"], \"column_sizes\": [null],"
                            " \"raw_data\": {\"basename\": \"../etc/passwd\", \"bytes\": 1}, \"zip_data\": null}]}";
    write_file(d, "index.json", bad_index, strlen(bad_index));
    CHECK_EQ_I(open_dir(d, &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "basename");
    const char *v1 = "{\"version\": 1, \"shards\": []}";
    write_file(d, "index.json", v1, strlen(v1));
    CHECK_EQ_I(open_dir(d, &s), FERRY_EUNSUPPORTED);
    CHECK(s == NULL);
}

int main(void) {
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = 2;
    cfg.no_env = 1;
    cfg.path = FERRY_PATH_HOST;
    if (ferry_ctx_create(&ctx, &cfg) || !mkdtemp(root)) return 1;
    RUN(test_raw_shards);
    RUN(test_zstd_shards);
    RUN(test_damage);
    ferry_ctx_destroy(ctx);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) return 1;
    return check_summary();
}
