/* nvcomp.c — dlopen nvCOMP once, fill the batched-decompress table, and say
 * which file and version loaded or why none did. */
#include "cuda/nvcomp.h"
#include "common.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ferry_nvcomp_api api_;
static const ferry_nvcomp_api *loaded_;
static char why_[700] = "";
static char desc_[700] = "";
static char dir_[480];
static pthread_mutex_t lock_ = PTHREAD_MUTEX_INITIALIZER;
static int tried_;

void ferry_nvcomp_set_dir(const char *dir) {
    pthread_mutex_lock(&lock_);
    if (!tried_ && dir) snprintf(dir_, sizeof dir_, "%s", dir);
    pthread_mutex_unlock(&lock_);
}

static void *open_in(const char *dir, char *path, size_t cap) {
    if (dir && strlen(dir) + 20 > cap) return NULL;
    static const char *names[] = {"libnvcomp.so.6", "libnvcomp.so.5"};
    for (int i = 0; i < 2; i++) {
        if (dir) snprintf(path, cap, "%s/%s", dir, names[i]);
        else snprintf(path, cap, "%s", names[i]);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

static const char *sym_names[FERRY_NVCOMP_NALG] = {"Zstd", "LZ4", "Deflate"};
/* Alignments the 5.x headers state (nvcomp{Zstd,LZ4,Deflate}RequiredDecompressionAlignment
 * for inputs; outputs and temp: 8), used when the library cannot be asked. */
static const ferry_nvcomp_align default_align[FERRY_NVCOMP_NALG] = {{8, 8, 8}, {1, 1, 8}, {4, 4, 8}};

static int fill_table(void *h) {
    char name[96];
#define SYM(dst, fmt, alg, required) do { \
        snprintf(name, sizeof name, fmt, alg); \
        *(void **)&(dst) = dlsym(h, name); \
        if (!(dst) && (required)) { snprintf(why_, sizeof why_, "%s lacks %s", api_.path, name); return -1; } \
    } while (0)
    for (int a = 0; a < FERRY_NVCOMP_NALG; a++) {
        ferry_nvcomp_alg_api *t = &api_.alg[a];
        SYM(t->GetTempSize, "nvcompBatched%sDecompressGetTempSize", sym_names[a], 0);            /* 6.x */
        SYM(t->GetTempSizeAsync, "nvcompBatched%sDecompressGetTempSizeAsync", sym_names[a], 0);  /* 5.x */
        if (!t->GetTempSize && !t->GetTempSizeAsync) {
            snprintf(why_, sizeof why_, "%s lacks nvcompBatched%sDecompressGetTempSize(Async)", api_.path, sym_names[a]);
            return -1;
        }
        SYM(t->DecompressAsync, "nvcompBatched%sDecompressAsync", sym_names[a], 1);
        SYM(t->GetDecompressSizeAsync, "nvcompBatched%sGetDecompressSizeAsync", sym_names[a], 0);
        SYM(t->GetRequiredAlignments, "nvcompBatched%sDecompressGetRequiredAlignments", sym_names[a], 0);
        t->align = default_align[a];
        ferry_nvcomp_opts o;
        memset(&o, 0, sizeof o);
        ferry_nvcomp_align al;
        if (t->GetRequiredAlignments && t->GetRequiredAlignments(o, &al) == 0 && al.input && al.output && al.temp)
            t->align = al;
    }
    SYM(api_.GetProperties, "%sGetProperties", "nvcomp", 1);
    SYM(api_.GetStatusString, "%sGetStatusString", "nvcomp", 0);
#undef SYM
    return 0;
}

static void load_locked(void) {
    void *h;
    if (ferry_cuda_lib_named("FERRY_NVCOMP", "nvCOMP", api_.path, sizeof api_.path, why_, sizeof why_, &h) < 0) return;
    if (!h && dir_[0]) h = open_in(dir_, api_.path, sizeof api_.path);
    if (!h) h = open_in(NULL, api_.path, sizeof api_.path);
    if (!h) {
        snprintf(why_, sizeof why_, "libnvcomp.so.6 / .so.5 not found (FERRY_NVCOMP, %s%s, system paths; "
                 "pip install nvidia-libnvcomp-cu13)", dir_[0] ? dir_ : "no wheel directory", dir_[0] ? "" : " given");
        return;
    }
    if (fill_table(h) < 0) { dlclose(h); return; }
    ferry_nvcomp_props p = {0, 0};
    if (api_.GetProperties(&p) != 0) { snprintf(why_, sizeof why_, "%s: nvcompGetProperties failed", api_.path); dlclose(h); return; }
    /* NVCOMP_VER = major*1000 + minor*100 + patch (version.h) */
    api_.major = (int)(p.version / 1000);
    api_.minor = (int)((p.version % 1000) / 100);
    api_.patch = (int)(p.version % 100);
    if (api_.major != 5 && api_.major != 6) {
        snprintf(why_, sizeof why_, "%s is nvCOMP %d.%d.%d; ferry speaks the batched API of nvCOMP 5.x and 6.x only "
                 "(4.x takes no options structs; a later major may change the signatures)",
                 api_.path, api_.major, api_.minor, api_.patch);
        dlclose(h);
        return;
    }
    snprintf(desc_, sizeof desc_, "loaded nvCOMP %d.%d.%d from %s", api_.major, api_.minor, api_.patch, api_.path);
    loaded_ = &api_;   /* the handle stays open for the life of the process */
}

ferry_nvcomp_status_t ferry_nvcomp_temp_size(const ferry_nvcomp_api *nv, int a, size_t num_chunks,
                                             size_t max_uncompressed_chunk_bytes, ferry_nvcomp_opts opts,
                                             size_t *temp_bytes, size_t max_total_uncompressed_bytes, CUstream stream) {
    const ferry_nvcomp_alg_api *t = &nv->alg[a];
    if (t->GetTempSize)
        return t->GetTempSize(num_chunks, max_uncompressed_chunk_bytes, opts, temp_bytes, max_total_uncompressed_bytes,
                              stream);
    return t->GetTempSizeAsync(num_chunks, max_uncompressed_chunk_bytes, opts, temp_bytes, max_total_uncompressed_bytes);
}

const ferry_nvcomp_api *ferry_nvcomp_load(const char **why) {
    if (!__atomic_load_n(&tried_, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&lock_);
        if (!tried_) {
            load_locked();
            __atomic_store_n(&tried_, 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&lock_);
    }
    if (why) *why = loaded_ ? "" : why_;
    return loaded_;
}

const char *ferry_nvcomp_describe(void) {
    const char *why;
    return ferry_nvcomp_load(&why) ? desc_ : why;
}

const char *ferry_nvcomp_errstr(ferry_nvcomp_status_t s) {
    switch (s) {
    case 0: return "success";
    case 10: return "invalid value";
    case 11: return "not supported";
    case 12: return "cannot decompress (corrupt data or output too small)";
    case 13: return "bad checksum";
    case 14: return "cannot verify checksums";
    case 15: return "output buffer too small";
    case 16: return "wrong header length";
    case 17: return "misaligned buffer";
    case 18: return "chunk too large";
    case 19: return "cannot compress";
    case 20: return "wrong input length";
    case 21: return "batch too large";
    case 1000: return "CUDA error";
    case 10000: return "internal error";
    default: return "nvCOMP error";
    }
}
