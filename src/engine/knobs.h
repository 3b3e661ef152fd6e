/* knobs.h — the table of FERRY_* tuning variables (config.c). Internal.
 * One row per knob: its name, grammar, default, range and one line of doc;
 * ferry_config_resolve checks every knob of the table that is set (unless
 * no_env), `ferry info --knobs` prints the table, and readers that have a
 * context read a knob through ferry_knob, which honours no_env. */
#ifndef FERRY_ENGINE_KNOBS_H
#define FERRY_ENGINE_KNOBS_H
#include "common.h"
#include <stddef.h>

typedef enum { FERRY_KNOB_SIZE, FERRY_KNOB_COUNT, FERRY_KNOB_WORD, FERRY_KNOB_RATES } ferry_knob_kind;

typedef struct ferry_knob_row {
    const char *name;
    ferry_knob_kind kind;
    const char *def;     /* the default, as text */
    long long lo, hi;    /* SIZE: at least lo; COUNT: lo .. hi */
    const char *words;   /* WORD: the values, '|'-separated */
    int icase;           /* WORD: matched ignoring case (as its reader does) */
    const char *doc;     /* one line */
} ferry_knob_row;

/* The table and its length. */
const ferry_knob_row *ferry_knob_table(size_t *n);
/* Every knob of the table set in the environment checked against its
 * grammar: 0, or FERRY_EINVAL naming the variable, its value and what to use. */
int ferry_knobs_check(void);
/* The knob's value for ctx: NULL where ctx was made with no_env or it is
 * unset, else getenv(name). ctx NULL: the environment. */
const char *ferry_knob(const ferry_ctx *ctx, const char *name);
/* A knob's text as bytes in ferry_size_parse's grammar; -1 where s is NULL,
 * empty, not a size or above INT64_MAX. */
static inline int64_t ferry_knob_bytes(const char *s) {
    uint64_t v;
    if (!s || !*s || ferry_size_parse(s, &v) < 0 || v > (uint64_t)INT64_MAX) return -1;
    return (int64_t)v;
}
#endif
