/* refsgen.h — kerchunk reference sets, version 1: "templates" and "gen".
 * Internal; used by refs.c.
 *
 * kerchunk renders both with jinja2. ferry takes the part of that language
 * reference sets use: a field {{ ... }} holds a template name (replaced by
 * its text), a dimension variable of a "gen" entry, or integer arithmetic
 * over them (+ - * // % and parentheses; / when it divides exactly). Any
 * other field (a function call, a filter, a string literal) is refused
 * naming the text, never rendered wrongly. */
#ifndef FERRY_FORMATS_REFSGEN_H
#define FERRY_FORMATS_REFSGEN_H
#include "common.h"
#include "formats/json.h"

#define FERRY_REFS_GEN_MAX_DIMS 8

/* Append s[0..n) rendered to out. templates: the "templates" object (or
 * NULL); names/vals: nvars dimension variables. what names the text in
 * messages ("refs.json: key \"x\""). 0, or FERRY_EFORMAT / FERRY_ENOMEM with
 * the message set. */
int ferry_refs_render(const char *s, size_t n, const ferry_json *templates, const char *const *names,
                      const int64_t *vals, int nvars, ferry_sbuf *out, const char *what);

/* One generated reference: key, url, and (ranged) offset and length. */
typedef int (*ferry_refs_emit_fn)(void *arg, const char *key, const char *url, int ranged, uint64_t offset,
                                  uint64_t length);

/* Expand the "gen" array of file (every combination of each entry's
 * dimensions, the last fastest) into emit calls, at most max references in
 * all (more: FERRY_EFORMAT). 0, or the first negative code. */
int ferry_refs_gen(const ferry_json *gen, const ferry_json *templates, const char *file, uint64_t max,
                   ferry_refs_emit_fn emit, void *arg);

#endif
