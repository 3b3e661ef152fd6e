/* shards.h — the one in-memory index of a set of sample shards (WebDataset
 * tar files, Mosaic MDS shards, folders of files). Internal.
 *
 * Each parser (tar.c, mds.c, imagefolder.c) reads only headers and appends
 * to this index: per sample its key (and class label for folders), per member
 * (a tar member's extension, an MDS column, a file's extension) the file that
 * holds it, its byte offset and size. A member's bytes are then one extent of
 * one file, so any sample is readable in any order without parsing again.
 * MDS shards compressed as a whole (zip_data) are the exception: a member's
 * offset counts bytes of the decoded shard (shards.c decodes it to read).
 *
 * Memory: the parsers grow the index only as they walk bytes of a file whose
 * size they know (every member costs at least one 512-byte tar header or four
 * bytes of an MDS offset table), and check counts read from metadata against
 * those sizes before they allocate for them. */
#ifndef FERRY_FORMATS_SHARDS_H
#define FERRY_FORMATS_SHARDS_H
#include "common.h"
#include "ferry_experimental.h"
#include "formats/json.h"
#include "codecs/codecs.h"

#define FERRY_SHARD_MAX_NAMES 1024       /* distinct member names (extensions, columns) in one set */
#define FERRY_SHARD_MAX_MEMBERS 4096     /* members of one sample */

typedef struct ferry_shard_file {
    uint64_t path;         /* offset of its path in the string arena */
    uint64_t size;         /* bytes of the file as opened */
    uint64_t raw_size;     /* zstd-compressed MDS shard: bytes once decoded; else 0 */
    ferry_file *held;      /* a tar or MDS shard at a URL: kept open from indexing on, so every
                              read of it is pinned to the version indexed; else NULL */
} ferry_shard_file;

typedef struct ferry_shard_member {
    uint32_t name;         /* index into the set's names */
    uint32_t file;         /* index into files */
    uint64_t offset;       /* byte offset in the file (in the decoded shard when raw_size) */
    uint64_t size;
} ferry_shard_member;

typedef struct ferry_shard_sample {
    uint64_t key;          /* offset of the key in the string arena */
    uint64_t first;        /* its first member in members[] */
    uint32_t nmembers;
    int32_t label;         /* folders: the class index; else -1 */
} ferry_shard_sample;

struct ferry_shards {
    ferry_ctx *ctx;
    const char *format;               /* "tar", "mds", "folder", "files" (static) */
    ferry_sbuf strings;               /* NUL-separated strings; entries refer to offsets */
    ferry_shard_file *files;
    size_t nfiles, cap_files;
    ferry_shard_sample *samples;
    size_t nsamples, cap_samples;
    ferry_shard_member *members;
    size_t nmembers, cap_members;
    uint64_t names[FERRY_SHARD_MAX_NAMES];      /* string offsets of member names */
    uint64_t encodings[FERRY_SHARD_MAX_NAMES];  /* MDS: the column's encoding; else UINT64_MAX */
    uint32_t nnames;
    uint64_t *classes;                /* folders: offsets of class names, in label order */
    uint32_t nclasses;
    void *zip;                        /* shards.c: one decoded compressed MDS shard, cached */
};

/* Append a NUL-terminated copy of s[0..n) to the arena; its offset in *off. */
int ferry_shards_str(ferry_shards *s, const char *str, size_t n, uint64_t *off);
/* Grow the array *p of *cap elements of elem bytes to hold need (doubling);
 * 0, or FERRY_ENOMEM with a message. */
int ferry_shards_grow(void **p, size_t *cap, size_t need, size_t elem);
/* The string at offset off. */
static inline const char *ferry_shards_at(const ferry_shards *s, uint64_t off) { return s->strings.p + off; }
/* Add a file (its path copied) of `size` bytes; its index in *idx. */
int ferry_shards_add_file(ferry_shards *s, const char *path, uint64_t size, uint32_t *idx);
/* Hand the open handle of file idx to the set when path is a URL (closed with
 * the set; its reads stay pinned to the version indexed); else close it. */
void ferry_shards_hold(ferry_shards *s, uint32_t idx, ferry_file *f);
/* Index of member name n[0..len) (added when new; encoding may be NULL). */
int ferry_shards_name(ferry_shards *s, const char *n, size_t len, const char *encoding, uint32_t *idx);
/* Start a new sample with key k[0..klen); members added next belong to it. */
int ferry_shards_begin_sample(ferry_shards *s, const char *k, size_t klen, int32_t label);
/* Add a member to the last sample; FERRY_EFORMAT when the sample already has
 * a member of that name (the message names the file and byte `where`). */
int ferry_shards_add_member(ferry_shards *s, uint32_t name, uint32_t file, uint64_t offset, uint64_t size,
                            uint64_t where);
/* Drop the last sample if it has no members (a tar sample whose members were all skipped). */
void ferry_shards_end_sample(ferry_shards *s);

/* Run fn(arg, i) for every i in [0, n) on up to `threads` threads (the
 * caller's among them; one when no thread starts): 0, or the code of the
 * lowest i that failed, its message carried to the calling thread. For work
 * that waits on the network (shards at URLs). */
int ferry_shards_each(size_t n, int threads, int (*fn)(void *arg, size_t i), void *arg);

/* Append a tar or MDS set indexed on its own (sub) to s: its names (with
 * their encodings), its files (held handles moved to s) and its samples,
 * after s's own. sub is left to ferry_shards_close. */
int ferry_shards_merge(ferry_shards *s, ferry_shards *sub);

/* Decode the whole zstd-compressed MDS shard `file` (raw_size set) into a new
 * buffer (*out, the caller frees). */
int ferry_shards_unzip(ferry_shards *s, uint32_t file, ferry_decode_scratch *scratch, uint8_t **out);
/* Make the set's cache of one decoded shard (mds.c, when a shard is compressed). */
int ferry_shards_zip_cache(ferry_shards *s);

/* Header reads through a window: ferry_window_get points *p at file bytes
 * [off, off + n) (inside the file: the caller checks), reading `want` bytes
 * (at least n, at most the window's size, clipped to the file) from off when
 * they are not in the window already. Over bytes in memory (mem set) it only
 * points. A window is 1 MiB over a local file and 8 MiB over a URL (a
 * request costs a round trip: fewer, larger ones; ferry_pread splits one into
 * ranges read side by side). */
typedef struct ferry_window {
    const char *path;
    uint64_t size;
    ferry_file *f;
    const uint8_t *mem;
    uint8_t *win;          /* ferry_window_cap bytes, allocated on first use */
    uint64_t woff;
    size_t wlen;
} ferry_window;
#define FERRY_WINDOW_MAX ((size_t)1 << 20)
#define FERRY_WINDOW_REMOTE ((size_t)8 << 20)
/* The window's size: FERRY_WINDOW_REMOTE when w->path is a URL, else FERRY_WINDOW_MAX. */
size_t ferry_window_cap(const ferry_window *w);
int ferry_window_get(ferry_window *w, uint64_t off, size_t n, size_t want, const uint8_t **p);
void ferry_window_free(ferry_window *w);

/* The parsers: append one shard file / one MDS directory / one folder or
 * list of files to s. They read through ferry_pread only. */
int ferry_tar_index(ferry_shards *s, const char *path);
int ferry_mds_index(ferry_shards *s, const char *dir);
int ferry_folder_index(ferry_shards *s, const char *dir);
int ferry_files_index(ferry_shards *s, const char *const *paths, size_t n);
/* The tar parser on bytes already in memory (the fuzz target and the tests'
 * own archives go through the same code as files). */
int ferry_tar_index_mem(ferry_shards *s, const char *name, const uint8_t *data, size_t n);
/* The MDS shard parser over one shard's bytes (a file through a window, or a
 * decoded compressed shard in memory), given its index.json entry's checked
 * values: `file` is the set's file the members point into, names[c] each
 * column's member name, fixed[c] its size or UINT64_MAX when variable. */
int ferry_mds_parse_shard(ferry_shards *s, ferry_window *w, uint32_t file, uint64_t samples, const uint32_t *names,
                          const uint64_t *fixed, size_t ncols);
#endif
