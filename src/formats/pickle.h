/* pickle.h — a pickle reader that runs nothing. Internal.
 *
 * Python's pickle format (protocols 2–5) is a small stack machine whose
 * GLOBAL, REDUCE, NEWOBJ and BUILD opcodes import and call code. This reader
 * executes none of that: it replays the opcodes into a tree of plain values,
 * where an imported name is a FERRY_PK_GLOBAL node (module and name, never
 * looked up) and a call or object construction is a FERRY_PK_OBJ node holding
 * the callable, its arguments and the state BUILD gave it. Readers of
 * torch.distributed.checkpoint's `.metadata` (`ferry info`) walk that tree
 * for the names they know.
 *
 * Hostile input: every length is checked against the bytes left, the stack
 * and the mark stack are bounded, memo indices are checked, and the tree is
 * allocated from one arena whose size is bounded by the input's (each opcode
 * makes at most one node), so a pickle cannot claim more memory than it is
 * long. The tree may share nodes (memo gets) and may contain cycles (a list
 * appended to itself): walkers bound their depth. */
#ifndef FERRY_FORMATS_PICKLE_H
#define FERRY_FORMATS_PICKLE_H
#include "common.h"

typedef enum ferry_pk_kind {
    FERRY_PK_NONE, FERRY_PK_BOOL, FERRY_PK_INT, FERRY_PK_FLOAT, FERRY_PK_STR, FERRY_PK_BYTES,
    FERRY_PK_TUPLE, FERRY_PK_LIST, FERRY_PK_DICT, FERRY_PK_GLOBAL, FERRY_PK_OBJ
} ferry_pk_kind;

typedef struct ferry_pk ferry_pk;
struct ferry_pk {
    ferry_pk_kind kind;
    int64_t i;             /* BOOL, INT (ints beyond 64 bits: kind INT, big = 1, i = 0) */
    int big;
    double f;              /* FLOAT */
    const char *s;         /* STR, BYTES (NUL-terminated copy, n bytes); GLOBAL: the module */
    size_t n;              /* STR, BYTES: the length; GLOBAL: 1 when it owns s and name */
    const char *name;      /* GLOBAL: the attribute name */
    ferry_pk **items;      /* TUPLE, LIST: count items; DICT: count/2 key, value pairs */
    size_t count, cap;
    ferry_pk *callable;    /* OBJ: what REDUCE/NEWOBJ would have called (usually a GLOBAL) */
    ferry_pk *args;        /* OBJ: its arguments (a TUPLE) */
    ferry_pk *state;       /* OBJ: what BUILD passed to it, NULL if none */
};

typedef struct ferry_pickle ferry_pickle;

/* Parse data[0..n) (what: the file's name, for messages). 0 and *out (free
 * with ferry_pickle_free), or FERRY_EFORMAT naming `what` and the byte. */
int ferry_pickle_parse(const uint8_t *data, size_t n, const char *what, ferry_pickle **out);
void ferry_pickle_free(ferry_pickle *p);
/* The value STOP returned. */
const ferry_pk *ferry_pickle_root(const ferry_pickle *p);

/* Walking helpers; each returns NULL when the node is not of that shape. */
/* d[key] for a DICT with STR keys. */
const ferry_pk *ferry_pk_get(const ferry_pk *d, const char *key);
/* An OBJ's attribute: its BUILD state's key (a dict state, or the dict in a
 * (dict, slots) tuple state). */
const ferry_pk *ferry_pk_attr(const ferry_pk *obj, const char *key);
/* 1 when node is an OBJ made by calling GLOBAL module.name (module may be
 * NULL: any module). */
int ferry_pk_is(const ferry_pk *node, const char *module, const char *name);
#endif
