/* knobs.h — the table of FERRY_* environment variables (config.c). Internal.
 * One row per variable the library reads: its name, grammar, default, range,
 * one line of doc and when it is read (scope). `ferry info --knobs` prints
 * the table (docs/engine.md carries it; tests/python/test_knobs.py keeps
 * every "FERRY_*" literal under src/ a row of it). Readers in the engine
 * read a knob through ferry_knob, which honours no_env; getenv is called in
 * config.c and by the process-scope loaders below the engine only.
 *   FERRY_KNOB_CONTEXT: checked against its grammar when a context is made
 *     (ferry_config_resolve: a bad value fails ferry_ctx_create, naming it);
 *   FERRY_KNOB_FIRST_USE: read through ferry_knob once per context, at its
 *     first use (the first run, or the first batch that gathers); its reader
 *     checks it and a bad value fails that use, naming it;
 *   FERRY_KNOB_PROCESS: read once per process by a loader below the engine
 *     (CUDA, cuFile, nvCOMP, NVRTC, nvJPEG, zlib, remote objects, the NUMA
 *     view), which no context exists for yet: no_env cannot apply.
 * ferry_knob reads a context's snapshot, taken when it was made: a variable
 * set later applies to contexts made later (tests set a live context's knob
 * with ferry_knob_set). */
#ifndef FERRY_ENGINE_KNOBS_H
#define FERRY_ENGINE_KNOBS_H
#include "common.h"
#include <stddef.h>

typedef enum {
    FERRY_KNOB_SIZE,    /* ferry_size_parse's grammar, at least lo (hi > 0: at most hi) */
    FERRY_KNOB_COUNT,   /* a decimal integer lo .. hi */
    FERRY_KNOB_WORD,    /* one of words */
    FERRY_KNOB_RATES,   /* gpu_gbs,chunk_mbs,cpu_gbs_per_thread */
    FERRY_KNOB_INT,     /* an integer in the size grammar ("1K" = 1024), lo .. hi */
    FERRY_KNOB_TEXT,    /* a path or a value its reader checks; words: the grammar, in words */
    FERRY_KNOB_FLAG     /* set (not "0") means on */
} ferry_knob_kind;
enum { FERRY_KNOB_CONTEXT = 0, FERRY_KNOB_FIRST_USE = 1, FERRY_KNOB_PROCESS = 2 };

typedef struct ferry_knob_row {
    const char *name;
    ferry_knob_kind kind;
    const char *def;     /* the default, as text */
    long long lo, hi;    /* SIZE: at least lo; COUNT: lo .. hi */
    const char *words;   /* WORD: the values, '|'-separated */
    int icase;           /* WORD: matched ignoring case (as its reader does) */
    const char *doc;     /* one line */
} ferry_knob_row;
/* When row r is read: FERRY_KNOB_CONTEXT, _FIRST_USE or _PROCESS (config.c
 * lists the rows that are not CONTEXT ones, so a row stays 8 fields). */
int ferry_knob_scope(const ferry_knob_row *r);

/* The table and its length. */
const ferry_knob_row *ferry_knob_table(size_t *n);
/* Every FERRY_KNOB_CONTEXT knob of the table set in the environment checked
 * against its grammar: 0, or FERRY_EINVAL naming the variable, its value and
 * what to use. */
int ferry_knobs_check(void);
/* The knob's value for ctx: NULL where ctx was made with no_env or it was
 * unset, else its value when ctx was made (read once per context; a
 * process-scope knob or a name the table lacks: getenv(name)). ctx NULL: the
 * environment now. The one reader of the environment for the engine's files. */
const char *ferry_knob(const ferry_ctx *ctx, const char *name);
/* ctx.c: take the snapshot ferry_knob reads (after ferry_config_resolve), and
 * free it. */
int ferry_knobs_snapshot(ferry_ctx *ctx);
void ferry_knobs_release(ferry_ctx *ctx);
/* Tests: give ctx's knob `name` this value (NULL: unset), as if the
 * environment had it when ctx was made; call it with no job of ctx running.
 * FERRY_EINVAL for a name the table lacks. */
int ferry_knob_set(ferry_ctx *ctx, const char *name, const char *value);
/* The grammar of row r in words ("size >= 64K", "count 1..8", "on|off"). */
void ferry_knob_grammar(const ferry_knob_row *r, char *buf, size_t n);
/* A knob's text as bytes in ferry_size_parse's grammar; -1 where s is NULL,
 * empty, not a size or above INT64_MAX. */
static inline int64_t ferry_knob_bytes(const char *s) {
    uint64_t v;
    if (!s || !*s || ferry_size_parse(s, &v) < 0 || v > (uint64_t)INT64_MAX) return -1;
    return (int64_t)v;
}
#endif
