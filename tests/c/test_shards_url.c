/* test_shards_url.c — shard sets at URLs (shardsopen.c, tar.c, shards.c): a
 * tar archive built here is served by a small HTTP server on 127.0.0.1 (a
 * thread of this test: ranges, an ETag per version, If-Match answered 412),
 * indexed through few large range requests, its members read by range and
 * through a plan, pinned to the version indexed; a damaged archive and a
 * replaced image named by URL. Moto and nginx runs are the Python tests'
 * (tests/python/test_remote_images.py). */
#include "check.h"
#include "ferry.h"
#include "ferry_experimental.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static ferry_ctx *ctx;

/* ---- an archive writer ---------------------------------------------------- */
typedef struct tarb { uint8_t *p; size_t n, cap; } tarb;

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

static void tb_add(tarb *t, const char *name, const void *data, size_t size) {
    uint8_t *h = tb_grow(t, 512);
    memcpy(h, name, strnlen(name, 100));
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = '0';
    memcpy(h + 257, "ustar\0" "00", 8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
    uint8_t *d = tb_grow(t, (size + 511) & ~(size_t)511);
    memcpy(d, data, size);
}

/* n samples "sNNNN" of a .jpg member of `size` bytes (byte j of sample i: (i + j + salt) & 255) and a .cls */
static tarb make_tar(int n, size_t size, int salt) {
    tarb t = {0};
    uint8_t *img = malloc(size);
    char name[64], cls[16];
    for (int i = 0; i < n; i++) {
        for (size_t j = 0; j < size; j++) img[j] = (uint8_t)(i + j + (size_t)salt);
        snprintf(name, sizeof name, "s%04d.jpg", i);
        tb_add(&t, name, img, size);
        snprintf(name, sizeof name, "s%04d.cls", i);
        int k = snprintf(cls, sizeof cls, "%d", i % 7);
        tb_add(&t, name, cls, (size_t)k);
    }
    tb_grow(&t, 1024);
    free(img);
    return t;
}

/* ---- the server: objects by path, each with a version ---------------------- */
#define NOBJ 12
static struct { char path[64]; uint8_t *data; size_t n; int version; } objs[NOBJ];
static pthread_mutex_t olock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int gets;
static int lsock, port;

static void put(const char *path, const uint8_t *data, size_t n) {
    pthread_mutex_lock(&olock);
    int k = 0;
    while (k < NOBJ - 1 && objs[k].path[0] && strcmp(objs[k].path, path)) k++;
    snprintf(objs[k].path, sizeof objs[k].path, "%s", path);
    free(objs[k].data);
    objs[k].data = malloc(n ? n : 1);
    memcpy(objs[k].data, data, n);
    objs[k].n = n;
    objs[k].version++;
    pthread_mutex_unlock(&olock);
}

static void send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        c += w;
        n -= (size_t)w;
    }
}

/* One request per connection (Connection: close): GET with an optional Range
 * (bytes=a-b) and If-Match. */
static void serve(int fd) {
    char req[4096];
    size_t got = 0;
    req[0] = 0;
    while (got < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
        ssize_t r = recv(fd, req + got, sizeof req - 1 - got, 0);
        if (r <= 0) return;
        got += (size_t)r;
        req[got] = 0;
    }
    char path[256] = "";
    sscanf(req, "GET %255s", path);
    atomic_fetch_add(&gets, 1);
    unsigned long long a = 0, b = ~0ull;
    const char *rg = strcasestr(req, "\r\nRange: bytes=");
    int ranged = rg && sscanf(rg + 15, "%llu-%llu", &a, &b) >= 1;
    const char *im = strcasestr(req, "\r\nIf-Match: ");
    char head[512];
    pthread_mutex_lock(&olock);
    int k = -1;
    for (int i = 0; i < NOBJ; i++)
        if (objs[i].path[0] && !strcmp(objs[i].path, path)) k = i;
    char etag[32] = "";
    if (k >= 0) snprintf(etag, sizeof etag, "\"v%d\"", objs[k].version);
    if (k < 0) {
        int n = snprintf(head, sizeof head, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        send_all(fd, head, (size_t)n);
    } else if (im && strncmp(im + 12, etag, strlen(etag))) {
        int n = snprintf(head, sizeof head, "HTTP/1.1 412 Precondition Failed\r\nETag: %s\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n", etag);
        send_all(fd, head, (size_t)n);
    } else {
        size_t size = objs[k].n;
        if (!ranged) { a = 0; b = size - 1; }
        if (b >= size) b = size - 1;
        int n = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nETag: %s\r\nContent-Length: %llu\r\n"
                         "Content-Range: bytes %llu-%llu/%zu\r\nConnection: close\r\n\r\n",
                         ranged ? "206 Partial Content" : "200 OK", etag, b - a + 1, a, b, size);
        uint8_t *body = malloc(b - a + 1);
        memcpy(body, objs[k].data + a, b - a + 1);
        pthread_mutex_unlock(&olock);
        send_all(fd, head, (size_t)n);
        send_all(fd, body, b - a + 1);
        free(body);
        return;
    }
    pthread_mutex_unlock(&olock);
}

static void *server(void *arg) {
    (void)arg;
    for (;;) {
        int fd = accept(lsock, NULL, NULL);
        if (fd < 0) return NULL;
        serve(fd);
        close(fd);
    }
}

static void url(char *out, size_t cap, const char *path) { snprintf(out, cap, "http://127.0.0.1:%d%s", port, path); }

static int open_url(const char *path, const char *format, ferry_shards **s) {
    char u[128];
    url(u, sizeof u, path);
    const char *p[1] = {u};
    return ferry_shards_open(ctx, p, 1, format, s);
}

/* ---- tests ----------------------------------------------------------------- */
static void test_tar_indexed_in_few_requests_and_read_by_range(void) {
    tarb t = make_tar(1200, 3000, 0);   /* 1200 samples, 5.5 MB: 2400 headers */
    put("/a.tar", t.p, t.n);
    atomic_store(&gets, 0);
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_url("/a.tar", NULL, &s), 0);
    if (!s) { fprintf(stderr, "%s\n", ferry_errmsg(ctx)); free(t.p); return; }
    CHECK(!strcmp(ferry_shards_format(s), "tar"));
    CHECK_EQ_I(ferry_shards_count(s), 1200);
    CHECK_EQ_I(atomic_load(&gets), 2);   /* the open (its first 64 KiB), then the rest in one 8 MiB window */
    uint8_t buf[3000], want[3000];
    for (size_t j = 0; j < sizeof want; j++) want[j] = (uint8_t)(390 + j);
    CHECK_EQ_I(ferry_shards_read(s, 390, 0, buf, sizeof buf), 3000);
    CHECK(!memcmp(buf, want, sizeof want));
    /* a plan reads the set's own handle */
    ferry_plan *plan;
    ferry_plan_create(&plan);
    memset(buf, 0, sizeof buf);
    CHECK_EQ_I(ferry_shards_plan_member(s, 390, 0, ferry_host_buf(buf, sizeof buf), 0, plan), 3000);
    CHECK_EQ_I(ferry_run(ctx, plan, NULL), 3000);
    CHECK(!memcmp(buf, want, sizeof want));
    /* replaced: the index's offsets are the old version's; every read past the first bytes is refused */
    tarb t2 = make_tar(300, 4000, 1);
    put("/a.tar", t2.p, t2.n);
    CHECK(ferry_shards_read(s, 390, 0, buf, sizeof buf) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "/a.tar");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "changed since it was opened");
    ferry_plan_clear(plan);
    CHECK_EQ_I(ferry_shards_plan_member(s, 390, 0, ferry_host_buf(buf, sizeof buf), 0, plan), 3000);
    CHECK(ferry_run(ctx, plan, NULL) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "changed since it was opened");
    ferry_plan_destroy(plan);
    ferry_shards_close(s);
    free(t.p);
    free(t2.p);
}

static void test_damaged_tar_names_url_and_byte(void) {
    tarb t = make_tar(50, 1000, 0);
    size_t at = 30 * (512 + 1024 + 512 + 512);   /* sample 30's .jpg header (and its .cls: 512 + 512) */
    t.p[at + 148] ^= 1;
    put("/bad.tar", t.p, t.n);
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_url("/bad.tar", NULL, &s), FERRY_EFORMAT);
    char want[64];
    snprintf(want, sizeof want, "/bad.tar: byte %zu: header of member \"s0030.jpg\"", at);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), want);
    CHECK(s == NULL);
    free(t.p);
}

static void test_files_at_urls_and_a_replaced_image(void) {
    uint8_t img[5000];
    for (size_t j = 0; j < sizeof img; j++) img[j] = (uint8_t)(j * 7);
    put("/x/one.jpg", img, sizeof img);
    ferry_shards *s = NULL;
    CHECK_EQ_I(open_url("/x/one.jpg", NULL, &s), 0);   /* a URL with an extension: "files" */
    if (!s) return;
    CHECK(!strcmp(ferry_shards_format(s), "files"));
    ferry_member_info mi;
    CHECK_EQ_I(ferry_shards_member(s, 0, 0, &mi), 0);
    CHECK_EQ_I(mi.size, sizeof img);
    CHECK(!strcmp(mi.name, "jpg"));
    uint8_t buf[6000];
    CHECK_EQ_I(ferry_shards_read(s, 0, 0, buf, sizeof buf), sizeof img);
    CHECK(!memcmp(buf, img, sizeof img));
    put("/x/one.jpg", img, 4000);                          /* another size */
    CHECK(ferry_shards_read(s, 0, 0, buf, sizeof buf) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "/x/one.jpg");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "when the set was opened");
    ferry_shards_close(s);
    /* a directory-like URL of a web server without index.json: not listable, named */
    s = NULL;
    CHECK(open_url("/x/", "folder", &s) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "/x/");
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "cannot");
    /* a list of images sized side by side; a missing one named, the first in order */
    char u[4][128];
    const char *l[4];
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "/y/%d.png", k);
        if (k != 1 && k != 3) put(name, img, 100 + (size_t)k);
        url(u[k], sizeof u[k], name);
        l[k] = u[k];
    }
    CHECK_EQ_I(ferry_shards_open(ctx, l, 4, "files", &s), -ENOENT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "/y/1.png");
    CHECK_EQ_I(ferry_shards_open(ctx, (const char *const[]){l[0], l[2]}, 2, "files", &s), 0);
    if (s) {
        CHECK_EQ_I(ferry_shards_member(s, 1, 0, &mi), 0);
        CHECK_EQ_I(mi.size, 102);
        CHECK(!strcmp(mi.name, "png"));
        ferry_shards_close(s);
    }
    s = NULL;
    /* a missing shard names its URL */
    CHECK(open_url("/none.tar", NULL, &s) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "/none.tar");
}

/* several shards: indexed side by side, merged in the order named */
static void test_many_shards_in_order(void) {
    char paths[6][128];
    const char *p[6];
    for (int k = 0; k < 6; k++) {
        tarb t = make_tar(20 + k, 700 + (size_t)k, k);
        char name[32];
        snprintf(name, sizeof name, "/m/%d.tar", k);
        put(name, t.p, t.n);
        url(paths[k], sizeof paths[k], name);
        p[k] = paths[k];
        free(t.p);
    }
    ferry_shards *s = NULL;
    CHECK_EQ_I(ferry_shards_open(ctx, p, 6, NULL, &s), 0);
    if (!s) return;
    CHECK_EQ_I(ferry_shards_count(s), 20 + 21 + 22 + 23 + 24 + 25);
    CHECK_EQ_I(ferry_shards_nfiles(s), 6);
    int64_t i = 0;
    for (int k = 0; k < 6; k++)
        for (int j = 0; j < 20 + k; j++, i++) {
            ferry_sample_info si;
            ferry_member_info mi;
            char key[16];
            snprintf(key, sizeof key, "s%04d", j);
            CHECK_EQ_I(ferry_shards_sample(s, i, &si), 0);
            CHECK(!strcmp(si.key, key));
            CHECK_EQ_I(ferry_shards_member(s, i, 0, &mi), 0);
            CHECK(!strcmp(mi.path, paths[k]) && !strcmp(mi.name, "jpg") && mi.size == 700 + (uint64_t)k);
        }
    uint8_t buf[705];
    int64_t at = 20 + 21 + 22 + 5;   /* shard 3's sample 5 */
    CHECK_EQ_I(ferry_shards_read(s, at, 0, buf, sizeof buf), 703);
    CHECK(buf[0] == (uint8_t)(5 + 3) && buf[702] == (uint8_t)(5 + 702 + 3));
    CHECK_EQ_I(ferry_shards_find(s, at, "cls"), 1);
    ferry_shards_close(s);
    /* damaged shards 2 and 4: the error is shard 2's, the first in order */
    for (int k = 2; k <= 4; k += 2) {
        tarb t = make_tar(20 + k, 700 + (size_t)k, k);
        t.p[148] ^= 1;
        char name[32];
        snprintf(name, sizeof name, "/m/%d.tar", k);
        put(name, t.p, t.n);
        free(t.p);
    }
    s = NULL;
    CHECK_EQ_I(ferry_shards_open(ctx, p, 6, NULL, &s), FERRY_EFORMAT);
    CHECK_STR_CONTAINS(ferry_errmsg(ctx), "/m/2.tar: byte 0: header of member \"s0000.jpg\"");
    CHECK(s == NULL);
}

int main(void) {
    if (ferry_ctx_create(&ctx, NULL) != 0) { printf("0 passed, 1 failed\n"); return 1; }
#ifdef FERRY_HAVE_CURL
    setenv("FERRY_REMOTE_RETRY_SECONDS", "5", 1);
    lsock = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(lsock, (struct sockaddr *)&a, sizeof a) != 0 || listen(lsock, 64) != 0 ||
        getsockname(lsock, (struct sockaddr *)&a, &al) != 0) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    port = ntohs(a.sin_port);
    pthread_t th;
    pthread_create(&th, NULL, server, NULL);
    pthread_detach(th);
    RUN(test_tar_indexed_in_few_requests_and_read_by_range);
    RUN(test_damaged_tar_names_url_and_byte);
    RUN(test_files_at_urls_and_a_replaced_image);
    RUN(test_many_shards_in_order);
    shutdown(lsock, SHUT_RDWR);
    close(lsock);
    for (int i = 0; i < NOBJ; i++) free(objs[i].data);
#else
    ferry_shards *s = NULL;
    const char *p[1] = {"https://host/a.tar"};
    CHECK_EQ_I(ferry_shards_open(ctx, p, 1, NULL, &s), FERRY_EUNSUPPORTED);
#endif
    ferry_ctx_destroy(ctx);
    return check_summary();
}
