/* test_tar.c — WebDataset tar shards: archives built here byte by byte
 * (ustar, GNU long names, pax records, base-256 sizes), indexed through
 * ferry_shards_open from files and through the in-memory parser, then damaged. */
#include "check.h"
#include "ferry_experimental.h"
#include "formats/shards.h"
#include <unistd.h>

static ferry_ctx *ctx;
static char dir[] = "/tmp/ferry-test-tar-XXXXXX";

/* ---- an archive writer ---------------------------------------------------- */
typedef struct tarb {
    uint8_t *p;
    size_t n, cap;
} tarb;

static uint8_t *tb_grow(tarb *t, size_t k) {
    if (t->n + k > t->cap) {
        t->cap = (t->n + k) * 2;
        t->p = realloc(t->p, t->cap);
    }
    uint8_t *q = t->p + t->n;
    memset(q, 0, k);
    t->n += k;
    return q;
}

static void tb_checksum(uint8_t *h) {
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
}

/* A header of type `type` for `name` with `size` bytes of `data` (NULL: zeros). */
static void tb_add(tarb *t, const char *name, char type, const void *data, size_t size) {
    uint8_t *h = tb_grow(t, 512);
    memcpy(h, name, strnlen(name, 100));
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 108, 8, "%07o", 0);
    snprintf((char *)h + 116, 8, "%07o", 0);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = (uint8_t)type;
    memcpy(h + 257, "ustar\0" "00", 8);
    tb_checksum(h);
    size_t pad = (size + 511) & ~(size_t)511;
    uint8_t *d = tb_grow(t, pad);
    if (data) memcpy(d, data, size);
}

static void tb_end(tarb *t) { tb_grow(t, 1024); }

static const char *tb_write(const tarb *t, const char *name) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(t->p, 1, t->n, f);
    fclose(f);
    return path;
}

static int open_one(const char *path, ferry_shards **s) {
    const char *p[1] = {path};
    return ferry_shards_open(ctx, p, 1, NULL, s);
}

/* ---- tests ----------------------------------------------------------------- */
static void test_groups_members_as_webdataset(void) {
    tarb t = {0};
    tb_add(&t, "d/", '5', NULL, 0);
    tb_add(&t, "d/a.jpg", '0', "AAAA", 4);
    tb_add(&t, "d/a.cls", '0', "1", 1);
    tb_add(&t, "d/b.JPG", '0', "BBBBBB", 6);     /* extensions lowercased */
    tb_add(&t, "d/b.x.CLS", '0', "2", 1);        /* the rest after the first dot */
    tb_add(&t, "__meta__", '0', "m", 1);         /* skipped */
    tb_add(&t, "noext", '0', "n", 1);            /* skipped: no dot */
    tb_add(&t, "d/.hidden", '0', "h", 1);        /* skipped: dot first */
    tb_add(&t, "d/lnk.jpg", '2', NULL, 0);       /* symlinks are not members */
    tb_add(&t, "e.f/c.seg.png", '\0', "CC", 2);  /* old-style regular file; dots in folders kept */
    tb_end(&t);
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_one(tb_write(&t, "a.tar"), &s), 0);
    if (!s) { free(t.p); return; }
    CHECK(!strcmp(ferry_shards_format(s), "tar"));
    CHECK_EQ_I(ferry_shards_count(s), 3);
    ferry_sample_info si;
    ferry_member_info mi;
    CHECK_EQ_I(ferry_shards_sample(s, 0, &si), 0);
    CHECK(!strcmp(si.key, "d/a"));
    CHECK_EQ_I(si.nmembers, 2);
    CHECK_EQ_I(ferry_shards_member(s, 0, 0, &mi), 0);
    CHECK(!strcmp(mi.name, "jpg"));
    CHECK_EQ_I(mi.size, 4);
    CHECK_EQ_I(mi.offset, 1024);
    CHECK_EQ_I(ferry_shards_sample(s, 1, &si), 0);
    CHECK(!strcmp(si.key, "d/b"));
    CHECK_EQ_I(ferry_shards_find(s, 1, "jpg"), 0);
    CHECK_EQ_I(ferry_shards_find(s, 1, "x.cls"), 1);
    CHECK_EQ_I(ferry_shards_find(s, 1, "png"), FERRY_ENOTFOUND);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "d/b");
    CHECK_EQ_I(ferry_shards_sample(s, 2, &si), 0);
    CHECK(!strcmp(si.key, "e.f/c"));
    CHECK_EQ_I(ferry_shards_member(s, 2, 0, &mi), 0);
    CHECK(!strcmp(mi.name, "seg.png"));
    char buf[8] = {0};
    CHECK_EQ_I(ferry_shards_read(s, 1, 0, buf, sizeof buf), 6);
    CHECK(!memcmp(buf, "BBBBBB", 6));
    CHECK_EQ_I(ferry_shards_read(s, 1, 0, buf, 3), FERRY_EINVAL);   /* too small */
    /* the plan route: one extent */
    ferry_plan *plan;
    ferry_plan_create(&plan);
    char dst[16] = {0};
    CHECK_EQ_I(ferry_shards_plan_member(s, 2, 0, ferry_host_buf(dst, sizeof dst), 3, plan), 2);
    CHECK_EQ_I(ferry_plan_count(plan), 1);
    CHECK_EQ_I(ferry_run(ctx, plan, NULL), 2);
    CHECK(!memcmp(dst + 3, "CC", 2));
    ferry_plan_destroy(plan);
    ferry_shards_close(s);
    free(t.p);
}

static void test_long_names_pax_and_base256(void) {
    tarb t = {0};
    char lng[300];
    memset(lng, 'x', sizeof lng);
    memcpy(lng + 280, "/long.txt", 10);   /* 289 characters and its NUL */
    tb_add(&t, "././@LongLink", 'L', lng, strlen(lng) + 1);
    tb_add(&t, "truncated-name", '0', "L", 1);
    const char *pax = "16 path=p/q.dat\n" "10 size=3\n";
    tb_add(&t, "PaxHeader", 'x', pax, strlen(pax));
    tb_add(&t, "ignored.bin", '0', "PQR", 3);   /* header size 3 too; pax's wins anyway */
    tb_add(&t, "big.bin", '0', "0123456789", 10);
    /* rewrite the last header's size as base-256 */
    uint8_t *h = t.p + t.n - 1024;
    memset(h + 124, 0, 12);
    h[124] = 0x80;
    h[135] = 10;
    tb_checksum(h);
    tb_end(&t);
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_one(tb_write(&t, "b.tar"), &s), 0);
    if (!s) { free(t.p); return; }
    CHECK_EQ_I(ferry_shards_count(s), 3);
    ferry_sample_info si;
    ferry_member_info mi;
    ferry_shards_sample(s, 0, &si);
    CHECK_EQ_I(strlen(si.key), 285);
    CHECK(!strncmp(si.key + 280, "/long", 5));
    ferry_shards_sample(s, 1, &si);
    CHECK(!strcmp(si.key, "p/q"));
    ferry_shards_member(s, 1, 0, &mi);
    CHECK(!strcmp(mi.name, "dat"));
    CHECK_EQ_I(mi.size, 3);
    ferry_shards_member(s, 2, 0, &mi);
    CHECK_EQ_I(mi.size, 10);
    ferry_shards_close(s);
    free(t.p);
}

static void test_damage_is_named(void) {
    tarb t = {0};
    tb_add(&t, "k.jpg", '0', "abc", 3);
    tb_add(&t, "k2.jpg", '0', "defg", 4);
    tb_end(&t);
    ferry_shards *s = NULL;
    /* a flipped bit in the second header: checksum */
    t.p[1024 + 3] ^= 0x20;
    CHECK_EQ_I(open_one(tb_write(&t, "bad.tar"), &s), FERRY_EFORMAT);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "bad.tar: byte 1024");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "checksum");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "k2");
    t.p[1024 + 3] ^= 0x20;
    /* cut in the middle of the second member's data */
    tarb cut = t;
    cut.n = 1024 + 512 + 2;
    CHECK_EQ_I(open_one(tb_write(&cut, "cut.tar"), &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "member \"k2.jpg\"");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "truncated");
    /* cut at a member boundary: no end-of-archive block */
    cut.n = 2048;
    CHECK_EQ_I(open_one(tb_write(&cut, "noend.tar"), &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "end-of-archive");
    /* cut inside a header */
    cut.n = 1024 + 100;
    CHECK_EQ_I(open_one(tb_write(&cut, "midhdr.tar"), &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "into a header");
    /* a size larger than the file */
    snprintf((char *)t.p + 124, 12, "%011o", 99999);
    tb_checksum(t.p);
    CHECK_EQ_I(open_one(tb_write(&t, "size.tar"), &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "size.tar: byte 0: member \"k.jpg\": 99999 bytes");
    /* a size field that is not a number */
    memcpy(t.p + 124, "12x45678901", 11);
    tb_checksum(t.p);
    CHECK_EQ_I(open_one(tb_write(&t, "sizef.tar"), &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "byte 124");
    free(t.p);
}

static void test_refusals(void) {
    tarb t = {0};
    tb_add(&t, "s.bin", 'S', "x", 1);
    tb_end(&t);
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_one(tb_write(&t, "sparse.tar"), &s), FERRY_EUNSUPPORTED);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "sparse");
    free(t.p);
    t = (tarb){0};
    const char *pax = "21 GNU.sparse.size=9\n";
    tb_add(&t, "PaxHeader", 'x', pax, strlen(pax));
    tb_add(&t, "s.bin", '0', "x", 1);
    tb_end(&t);
    CHECK_EQ_I(open_one(tb_write(&t, "paxsparse.tar"), &s), FERRY_EUNSUPPORTED);
    free(t.p);
    t = (tarb){0};
    tb_add(&t, "PaxHeader", 'x', "99 path=x\n", 10);   /* a record longer than the header */
    tb_add(&t, "s.bin", '0', "x", 1);
    tb_end(&t);
    CHECK_EQ_I(open_one(tb_write(&t, "paxbad.tar"), &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "pax record");
    free(t.p);
    t = (tarb){0};
    tb_add(&t, "a.jpg", '0', "x", 1);
    tb_add(&t, "a.JPG", '0', "y", 1);   /* two "jpg" members of one sample */
    tb_end(&t);
    CHECK_EQ_I(open_one(tb_write(&t, "dup.tar"), &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "two members \"jpg\"");
    free(t.p);
    /* the same key again, not adjacent: a new sample, as webdataset makes it */
    t = (tarb){0};
    tb_add(&t, "a.jpg", '0', "x", 1);
    tb_add(&t, "b.jpg", '0', "y", 1);
    tb_add(&t, "a.cls", '0', "z", 1);
    tb_end(&t);
    CHECK_EQ_I(open_one(tb_write(&t, "again.tar"), &s), 0);
    CHECK_EQ_I(ferry_shards_count(s), 3);
    ferry_shards_close(s);
    free(t.p);
}

static int npread;
static ssize_t count_pread(int fd, void *buf, size_t n, off_t off) {
    npread++;
    return pread(fd, buf, n, off);
}

/* Many small members then large ones: headers come through windows; every
 * offset is where the member's bytes are. */
static void test_windows_many_members(void) {
    tarb t = {0};
    uint8_t *big = malloc(700000);
    for (size_t i = 0; i < 700000; i++) big[i] = (uint8_t)(i * 7);
    char name[64], data[64];
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "s%05d.txt", i);
        int n = snprintf(data, sizeof data, "sample %d", i);
        tb_add(&t, name, '0', data, (size_t)n);
    }
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "big%d.bin", i);
        big[0] = (uint8_t)i;
        tb_add(&t, name, '0', big, 700000 - (size_t)i);
    }
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "t%d.txt", i);
        tb_add(&t, name, '0', "tail", 4);
    }
    tb_end(&t);
    tb_grow(&t, 8192);   /* record padding after the end: ignored */
    ferry_shards *s = NULL;
    const char *path = tb_write(&t, "many.tar");
    npread = 0;
    ferry_test_set_syscall("pread", (void *)count_pread);
    CHECK_EQ_I(open_one(path, &s), 0);
    ferry_test_set_syscall(NULL, NULL);
    /* 3000 headers of small members fill 3 MiB: a few windows, then one
     * header-sized read per large member */
    CHECK(npread > 0 && npread <= 20);
    if (npread > 20) fprintf(stderr, "  %d preads\n", npread);
    if (!s) { free(big); free(t.p); return; }
    CHECK_EQ_I(ferry_shards_count(s), 3011);
    static char buf[700000];
    for (int i = 0; i < 3000; i += 499) {
        int n = snprintf(data, sizeof data, "sample %d", i);
        CHECK_EQ_I(ferry_shards_read(s, i, 0, buf, sizeof buf), n);
        CHECK(!memcmp(buf, data, (size_t)n));
    }
    CHECK_EQ_I(ferry_shards_read(s, 3003, 0, buf, sizeof buf), 700000 - 3);
    CHECK_EQ_I(buf[0], 3);
    CHECK(!memcmp(buf + 1, big + 1, 700000 - 4));
    CHECK_EQ_I(ferry_shards_read(s, 3010, 0, buf, sizeof buf), 4);
    /* the same bytes through the in-memory parser: the same index */
    ferry_shards *m = calloc(1, sizeof *m);
    m->ctx = ctx;
    m->format = "tar";
    CHECK_EQ_I(ferry_tar_index_mem(m, "mem", t.p, t.n), 0);
    CHECK_EQ_I(m->nsamples, s->nsamples);
    CHECK_EQ_I(m->nmembers, s->nmembers);
    CHECK(!memcmp(m->members, s->members, s->nmembers * sizeof *s->members));
    ferry_shards_close(m);
    ferry_shards_close(s);
    free(big);
    free(t.p);
}

static void test_glob_and_bad_args(void) {
    tarb t = {0};
    tb_add(&t, "g.jpg", '0', "x", 1);
    tb_end(&t);
    tb_write(&t, "glob-1.tar");
    tb_write(&t, "glob-2.tar");
    free(t.p);
    char pat[256];
    snprintf(pat, sizeof pat, "%s/glob-*.tar", dir);
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_one(pat, &s), 0);
    CHECK_EQ_I(ferry_shards_count(s), 2);
    CHECK_EQ_I(ferry_shards_nfiles(s), 2);
    ferry_member_info mi;
    CHECK_EQ_I(ferry_shards_member(s, 1, 0, &mi), 0);
    CHECK_STR_CONTAINS(mi.path, "glob-2.tar");
    CHECK_EQ_I(ferry_shards_member(s, 1, 1, &mi), FERRY_EINVAL);
    CHECK_EQ_I(ferry_shards_member(s, 2, 0, &mi), FERRY_EINVAL);
    ferry_shards_close(s);
    snprintf(pat, sizeof pat, "%s/none-*.tar", dir);
    CHECK_EQ_I(open_one(pat, &s), -2);   /* -ENOENT */
    const char *p[1] = {pat};
    CHECK_EQ_I(ferry_shards_open(ctx, p, 1, "zip", &s), FERRY_EINVAL);
    ferry_shards_close(NULL);
}

int main(void) {
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = 2;
    cfg.no_env = 1;
    cfg.path = FERRY_PATH_HOST;
    if (ferry_ctx_create(&ctx, &cfg) || !mkdtemp(dir)) return 1;
    RUN(test_groups_members_as_webdataset);
    RUN(test_long_names_pax_and_base256);
    RUN(test_damage_is_named);
    RUN(test_refusals);
    RUN(test_windows_many_members);
    RUN(test_glob_and_bad_args);
    ferry_ctx_destroy(ctx);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    return check_summary();
}
