/* test_perm.c — ferry_perm (src/formats/perm.c), the epoch order of TokenDataset: a bijection
 * of [0, n) for every n (powers of 4 and their neighbours, where the cycle walk is longest or
 * absent), the identity without shuffle, a different order per epoch and seed, and positions
 * outside [0, n) refused with nothing written. That it equals python/ferry/_torch_order.py's
 * numpy network is tests/python/test_torch_tokens.py's job. */
#include "check.h"
#include "ferry.h"

static int is_bijection(uint64_t n, int64_t seed, int64_t epoch) {
    ferry_perm p;
    if (ferry_perm_init(&p, n, seed, epoch, 1) != 0) return 0;
    int64_t *pos = malloc(n * sizeof *pos), *ids = malloc(n * sizeof *ids);
    unsigned char *seen = calloc(n, 1);
    int ok = pos && ids && seen;
    for (uint64_t i = 0; ok && i < n; i++) pos[i] = (int64_t)i;
    ok = ok && ferry_perm_take(&p, pos, n, ids) == (int64_t)n;
    for (uint64_t i = 0; ok && i < n; i++) {
        if (ids[i] < 0 || (uint64_t)ids[i] >= n || seen[ids[i]]) ok = 0;
        else seen[ids[i]] = 1;
    }
    free(pos);
    free(ids);
    free(seen);
    return ok;
}

static void test_a_bijection_for_every_size(void) {
    const uint64_t ns[] = {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4095, 4096,
                           4097, 65535, 65536, 65537, 100003};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        CHECK(is_bijection(ns[i], 7, 2));
        CHECK(is_bijection(ns[i], -1, 0));
    }
}

static void test_identity_epochs_and_seeds(void) {
    ferry_perm a, b, c, id;
    int64_t pos[64], x[64], y[64], z[64], w[64];
    for (int i = 0; i < 64; i++) pos[i] = i;
    CHECK_EQ_I(ferry_perm_init(&a, 1000, 3, 0, 1), 0);
    CHECK_EQ_I(ferry_perm_init(&b, 1000, 3, 1, 1), 0);
    CHECK_EQ_I(ferry_perm_init(&c, 1000, 4, 0, 1), 0);
    CHECK_EQ_I(ferry_perm_init(&id, 1000, 3, 0, 0), 0);
    CHECK_EQ_I(ferry_perm_take(&a, pos, 64, x), 64);
    CHECK_EQ_I(ferry_perm_take(&b, pos, 64, y), 64);
    CHECK_EQ_I(ferry_perm_take(&c, pos, 64, z), 64);
    CHECK_EQ_I(ferry_perm_take(&id, pos, 64, w), 64);
    CHECK(memcmp(x, y, sizeof x) != 0);
    CHECK(memcmp(x, z, sizeof x) != 0);
    CHECK(memcmp(w, pos, sizeof w) == 0);
    /* the same (seed, epoch) is the same order, whichever positions are asked together */
    int64_t one;
    CHECK_EQ_I(ferry_perm_take(&a, &pos[37], 1, &one), 1);
    CHECK_EQ_I(one, x[37]);
}

static void test_bad_arguments(void) {
    ferry_perm p;
    CHECK_EQ_I(ferry_perm_init(NULL, 10, 0, 0, 1), FERRY_EINVAL);
    CHECK_EQ_I(ferry_perm_init(&p, (uint64_t)INT64_MAX + 1, 0, 0, 1), FERRY_EINVAL);
    CHECK_EQ_I(ferry_perm_init(&p, 10, 0, 0, 1), 0);
    int64_t pos[3] = {0, 10, 2}, ids[3] = {-7, -7, -7};
    CHECK_EQ_I(ferry_perm_take(&p, pos, 3, ids), FERRY_EINVAL);
    CHECK(ids[0] == -7 && ids[1] == -7 && ids[2] == -7);      /* nothing written */
    pos[1] = -1;
    CHECK_EQ_I(ferry_perm_take(&p, pos, 3, ids), FERRY_EINVAL);
    CHECK_EQ_I(ferry_perm_take(&p, NULL, 0, NULL), 0);
    CHECK_EQ_I(ferry_perm_init(&p, 0, 0, 0, 1), 0);           /* an empty order takes nothing */
    CHECK_EQ_I(ferry_perm_take(&p, pos, 1, ids), FERRY_EINVAL);
}

int main(void) {
    RUN(test_a_bijection_for_every_size);
    RUN(test_identity_epochs_and_seeds);
    RUN(test_bad_arguments);
    return check_summary();
}
