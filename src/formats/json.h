/* json.h — a strict JSON parser (RFC 8259) and small writer helpers. Internal.
 *
 * Why our own: safetensors headers and Zarr metadata are untrusted input; this
 * parser is small enough to read in one sitting, bounds depth and size, checks
 * UTF-8, rejects duplicate object keys, reports the byte position of every
 * error, and is fuzzed (tests/fuzz/fuzz_json.c).
 *
 * Parsing
 *   ferry_json *root;
 *   int rc = ferry_json_parse(text, len, path, 8, &root);   // 8: text starts at byte 8 of path
 *   if (rc < 0) return rc;            // FERRY_EFORMAT / FERRY_ENOMEM, message set:
 *                                     // "<path>: byte <base+pos>: JSON: <why>"
 *   const ferry_json *shape = ferry_json_get(root, "shape");
 *   ...
 *   ferry_json_free(root);            // frees the whole tree (NULL: no-op)
 *
 * The tree is read-only after parsing. Every node and string lives in one
 * arena owned by the root. Strings are decoded (escapes resolved) and
 * NUL-terminated; `len` counts bytes without the terminator (a string may hold
 * an escaped \u0000, so use len when that matters). Numbers keep their literal
 * text so 64-bit integers are exact (ferry_json_u64 / ferry_json_i64).
 *
 * Strictness: exactly one value, surrounded only by JSON whitespace; no
 * comments, no trailing commas, no NaN/Infinity literals, no leading zeros, no
 * control characters in strings, no lone surrogates, valid UTF-8 throughout,
 * no duplicate keys in an object, depth <= FERRY_JSON_MAX_DEPTH, input size
 * <= FERRY_JSON_MAX_BYTES.
 */
#ifndef FERRY_FORMATS_JSON_H
#define FERRY_FORMATS_JSON_H
#include "common.h"
#include <stddef.h>
#include <stdint.h>

#define FERRY_JSON_MAX_DEPTH 64
#define FERRY_JSON_MAX_BYTES ((size_t)256 << 20)   /* callers may impose less */

typedef enum ferry_json_type {
    FERRY_JSON_NULL = 0,
    FERRY_JSON_BOOL,
    FERRY_JSON_NUMBER,
    FERRY_JSON_STRING,
    FERRY_JSON_ARRAY,
    FERRY_JSON_OBJECT
} ferry_json_type;

typedef struct ferry_json {
    ferry_json_type type;
    uint64_t pos;              /* byte position of the value (base included) */
    const char *key;           /* member name when this node is an object member, else NULL */
    size_t keylen;
    const char *str;           /* STRING: decoded text; NUMBER: literal text; else NULL */
    size_t len;                /* bytes in str */
    double num;                /* NUMBER: value as a double (strtod of the literal) */
    int boolean;               /* BOOL: 0 or 1 */
    struct ferry_json *items;  /* ARRAY elements / OBJECT members, in input order */
    size_t n;                  /* number of items */
} ferry_json;

/** Parse text[0..len) (no terminator needed). `what` names the input in error
 *  messages (a path; may be NULL), `base` is added to every byte position (the
 *  offset of text within that file). Returns 0 and *out, or FERRY_EFORMAT /
 *  FERRY_ENOMEM with ferry_seterr's message set. */
int ferry_json_parse(const char *text, size_t len, const char *what, uint64_t base, ferry_json **out);
/** Free a tree returned by ferry_json_parse. NULL: no-op. */
void ferry_json_free(ferry_json *root);

/** Member `key` of an object, or NULL (also when obj is NULL or not an object). */
const ferry_json *ferry_json_get(const ferry_json *obj, const char *key);
/** The string of a STRING node, or NULL. */
const char *ferry_json_str(const ferry_json *v);
/** Exact integer conversions of a NUMBER whose literal is an integer (no
 *  fraction, no exponent) that fits. Return 0, or -1 (wrong type, not an
 *  integer, out of range; v may be NULL). */
int ferry_json_u64(const ferry_json *v, uint64_t *out);
int ferry_json_i64(const ferry_json *v, int64_t *out);
/** 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or code points
 *  above U+10FFFF), else 0. For names other formats must check (netCDF). */
int ferry_utf8_valid(const char *s, size_t n);
/** A short name of a node type, for messages ("object", "string", ...). */
const char *ferry_json_type_name(ferry_json_type t);

/* ---- Writing --------------------------------------------------------------
 * A growable text buffer. Zero-initialise it (ferry_sbuf b = {0};). An
 * allocation failure is sticky: later appends do nothing, every call returns
 * FERRY_ENOMEM and ferry_sbuf_take returns NULL, so a writer may check once at
 * the end. */
typedef struct ferry_sbuf {
    char *p;       /* always NUL-terminated once anything was appended */
    size_t len;
    size_t cap;
    int oom;
} ferry_sbuf;

int ferry_sbuf_append(ferry_sbuf *b, const char *s, size_t n);
int ferry_sbuf_puts(ferry_sbuf *b, const char *s);
int ferry_sbuf_printf(ferry_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Append s[0..n) as a quoted JSON string. Valid UTF-8 is kept; control
 *  characters, '"' and '\\' are escaped; bytes that are not valid UTF-8 are
 *  written as \u00XX (read as Latin-1), so the output is always valid JSON. */
int ferry_sbuf_json_string(ferry_sbuf *b, const char *s, size_t n);
/** Append a double with the fewest significant digits (up to sig: 17 for
 *  doubles, 9 for float32 values) that read back to the same value; NaN and infinities as the strings "NaN", "Infinity",
 *  "-Infinity" (JSON has no literal for them). */
int ferry_sbuf_json_double(ferry_sbuf *b, double v, int sig);
/** Append a parsed value back as compact JSON (numbers keep their literal text). */
int ferry_sbuf_json_value(ferry_sbuf *b, const ferry_json *v);
/** The NUL-terminated text (caller frees; "" when nothing was appended), and
 *  reset b. NULL after an allocation failure (b is reset too). */
char *ferry_sbuf_take(ferry_sbuf *b);
void ferry_sbuf_free(ferry_sbuf *b);

#endif
