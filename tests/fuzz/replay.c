/* replay.c — run the fuzz corpus through every fuzz target, without libFuzzer.
 *
 * Convention (how to add a target)
 * --------------------------------
 *  1. Write tests/fuzz/fuzz_NAME.c:
 *         #include "fuzz.h"
 *         static int fuzz_NAME(const uint8_t *data, size_t size) { ...; return 0; }
 *         FERRY_FUZZ_TARGET(NAME, fuzz_NAME)
 *     The function must accept any bytes, never leak, and abort() only when
 *     an invariant is broken (that is what a fuzzer reports).
 *  2. Put seed inputs (small real files) in tests/fuzz/corpus/NAME/.
 *  That is all: the Makefile links every tests/fuzz/fuzz_*.c into this driver
 *  ($(BA)/fuzz_replay, run by `make test-asan` over tests/fuzz/corpus/), where
 *  FERRY_FUZZ_TARGET registers the function under NAME; tools/fuzz.sh builds
 *  each file alone with -DFERRY_LIBFUZZER, where the macro defines
 *  LLVMFuzzerTestOneInput, and runs it for FUZZ_SECONDS.
 *  Regression inputs for fixed crashes go in the corpus too (name them
 *  crash-<what>), so every `make test-asan` replays them.
 *
 * Usage: fuzz_replay CORPUS_DIR      (each subdirectory NAME feeds target NAME)
 *        fuzz_replay NAME FILE...    (one target, given files)
 * Prints one line per target and exits nonzero when a subdirectory has no
 * target. A crash aborts, under ASan with the report. */
#include "fuzz.h"
#include <dirent.h>
#include <sys/stat.h>

#define MAX_TARGETS 64
static struct { const char *name; ferry_fuzz_fn fn; } targets[MAX_TARGETS];
static int ntargets;

void ferry_fuzz_register(const char *name, ferry_fuzz_fn fn) {
    if (ntargets < MAX_TARGETS) {
        targets[ntargets].name = name;
        targets[ntargets].fn = fn;
        ntargets++;
    }
}

static ferry_fuzz_fn find(const char *name) {
    for (int i = 0; i < ntargets; i++)
        if (!strcmp(targets[i].name, name)) return targets[i].fn;
    return NULL;
}

static int run_file(ferry_fuzz_fn fn, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) abort();
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    fclose(f);
    fn(buf, n);
    free(buf);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* All regular files of dir, sorted (stable order makes failures reproducible). */
static int run_dir(ferry_fuzz_fn fn, const char *dir, int *count) {
    DIR *d = opendir(dir);
    if (!d) { perror(dir); return -1; }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            names = realloc(names, cap * sizeof *names);
            if (!names) abort();
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char path[8192];
        int len = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (len > 0 && (size_t)len < sizeof path && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(fn, path)) rc = -1;
            else (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR | %s NAME FILE...\n", argv[0], argv[0]);
        return 2;
    }
    int bad = 0;
    if (argc > 2) {
        ferry_fuzz_fn fn = find(argv[1]);
        if (!fn) { fprintf(stderr, "fuzz_replay: no target named %s\n", argv[1]); return 2; }
        for (int i = 2; i < argc; i++) bad |= run_file(fn, argv[i]) != 0;
        printf("fuzz replay: %s: %d file(s)\n", argv[1], argc - 2);
        return bad;
    }
    DIR *d = opendir(argv[1]);
    if (!d) { perror(argv[1]); return 1; }
    struct dirent *e;
    int total = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", argv[1], e->d_name);
        struct stat st;
        if (stat(sub, &st) || !S_ISDIR(st.st_mode)) continue;
        ferry_fuzz_fn fn = find(e->d_name);
        if (!fn) {
            fprintf(stderr, "fuzz replay: corpus directory %s has no target (fuzz_%s.c)\n", sub, e->d_name);
            bad = 1;
            continue;
        }
        int count = 0;
        if (run_dir(fn, sub, &count)) bad = 1;
        printf("  fuzz replay %-16s %d file(s)\n", e->d_name, count);
        total += count;
    }
    closedir(d);
    printf("fuzz replay: %d file(s), %d target(s)%s\n", total, ntargets, bad ? ", FAILED" : "");
    return bad;
}
