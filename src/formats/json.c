/* json.c — strict JSON parser and writer helpers; see json.h for the contract.
 *
 * Parsing is recursive descent with the depth bounded (FERRY_JSON_MAX_DEPTH),
 * so the C stack use is bounded too. Children of a container are collected on
 * one shared scratch stack and copied into the arena when the container
 * closes, so every node of the finished tree lives in the arena and the tree
 * is freed at once. */
#include "formats/json.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- arena ---------------------------------------------------------------- */
typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_block;

typedef struct doc {
    ferry_json root;        /* first member: ferry_json_free casts back */
    arena_block *blocks;
} doc;

static void *arena_alloc(doc *d, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_block *b = d->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->next = b; nb->used = 0; nb->cap = cap;
        d->blocks = nb;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

static void doc_free(doc *d) {
    arena_block *b = d->blocks;
    while (b) { arena_block *n = b->next; free(b); b = n; }
    free(d);
}

/* ---- parser --------------------------------------------------------------- */
typedef struct parser {
    const unsigned char *s;
    size_t n, i;
    const char *what;
    uint64_t base;
    doc *d;
    ferry_json *stack;      /* scratch: children of the open containers */
    size_t sn, scap;
} parser;

static int perr(parser *p, size_t pos, const char *why) {
    return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: JSON: %s", p->what ? p->what : "(json)",
                        (unsigned long long)(p->base + pos), why);
}
static int oom(parser *p) {
    return ferry_seterr(FERRY_ENOMEM, "%s: JSON: out of memory", p->what ? p->what : "(json)");
}

static void skip_ws(parser *p) {
    while (p->i < p->n) {
        unsigned char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
        else break;
    }
}

static int push(parser *p, const ferry_json *v) {
    if (p->sn == p->scap) {
        size_t cap = p->scap ? p->scap * 2 : 64;
        ferry_json *ns = realloc(p->stack, cap * sizeof *ns);
        if (!ns) return oom(p);
        p->stack = ns; p->scap = cap;
    }
    p->stack[p->sn++] = *v;
    return 0;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len; uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return len;
}

static int hex4(const unsigned char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = s[k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = (v << 4) | d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(unsigned char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18)); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* p->i is at the opening quote. Decodes into the arena. A decoded string is
 * never longer than its source (every escape shrinks or keeps length: \uXXXX
 * is 6 bytes for at most 3 of UTF-8, a surrogate pair 12 bytes for 4). */
static int parse_string(parser *p, const char **out, size_t *outlen) {
    size_t start = p->i++;
    size_t end = p->i;
    /* find the closing quote first, to size the allocation */
    while (end < p->n && p->s[end] != '"') {
        if (p->s[end] == '\\') end++;
        end++;
    }
    if (end >= p->n) return perr(p, start, "unterminated string");
    unsigned char *o = arena_alloc(p->d, end - p->i + 1);
    if (!o) return oom(p);
    size_t k = 0;
    while (p->i < end) {
        unsigned char c = p->s[p->i];
        if (c < 0x20) return perr(p, p->i, "control character in string");
        if (c == '\\') {
            size_t at = p->i;
            unsigned char e = p->s[p->i + 1];   /* < end: the scan above skipped it */
            p->i += 2;
            switch (e) {
            case '"': o[k++] = '"'; break;
            case '\\': o[k++] = '\\'; break;
            case '/': o[k++] = '/'; break;
            case 'b': o[k++] = '\b'; break;
            case 'f': o[k++] = '\f'; break;
            case 'n': o[k++] = '\n'; break;
            case 'r': o[k++] = '\r'; break;
            case 't': o[k++] = '\t'; break;
            case 'u': {
                uint32_t cp, lo;
                if (end - p->i < 4 || hex4(p->s + p->i, &cp)) return perr(p, at, "bad \\u escape");
                p->i += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return perr(p, at, "lone low surrogate");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (end - p->i < 6 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
                        hex4(p->s + p->i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return perr(p, at, "lone high surrogate");
                    p->i += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                k += put_utf8(o + k, cp);
                break;
            }
            default: return perr(p, at, "bad escape");
            }
            continue;
        }
        size_t l = utf8_len(p->s + p->i, end - p->i);
        if (!l) return perr(p, p->i, "invalid UTF-8");
        memcpy(o + k, p->s + p->i, l);
        k += l; p->i += l;
    }
    o[k] = 0;
    p->i = end + 1;
    *out = (const char *)o;
    *outlen = k;
    return 0;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, ferry_json *v) {
    size_t st = p->i, i = p->i;
    const unsigned char *s = p->s;
    if (i < p->n && s[i] == '-') i++;
    if (i >= p->n || !is_digit(s[i])) return perr(p, st, "bad number");
    if (s[i] == '0') {
        i++;
        if (i < p->n && is_digit(s[i])) return perr(p, st, "leading zero in number");
    } else {
        while (i < p->n && is_digit(s[i])) i++;
    }
    if (i < p->n && s[i] == '.') {
        i++;
        if (i >= p->n || !is_digit(s[i])) return perr(p, st, "bad fraction in number");
        while (i < p->n && is_digit(s[i])) i++;
    }
    if (i < p->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->n || !is_digit(s[i])) return perr(p, st, "bad exponent in number");
        while (i < p->n && is_digit(s[i])) i++;
    }
    size_t len = i - st;
    char *t = arena_alloc(p->d, len + 1);
    if (!t) return oom(p);
    memcpy(t, s + st, len);
    t[len] = 0;
    v->type = FERRY_JSON_NUMBER;
    v->str = t;
    v->len = len;
    v->num = strtod(t, NULL);
    p->i = i;
    return 0;
}

static int key_cmp(const void *a, const void *b) {
    const ferry_json *x = *(const ferry_json *const *)a, *y = *(const ferry_json *const *)b;
    size_t m = x->keylen < y->keylen ? x->keylen : y->keylen;
    int c = memcmp(x->key, y->key, m);
    if (c) return c;
    return (x->keylen > y->keylen) - (x->keylen < y->keylen);
}

/* Duplicate keys make "which one wins" reader-dependent: a classic way to
 * make two tools see two different files. Reject them. */
static int check_dup_keys(parser *p, const ferry_json *m, size_t n) {
    if (n < 2) return 0;
    if (n <= 8) {
        for (size_t a = 0; a < n; a++)
            for (size_t b = a + 1; b < n; b++)
                if (m[a].keylen == m[b].keylen && !memcmp(m[a].key, m[b].key, m[a].keylen))
                    return perr(p, m[b].pos, "duplicate key in object");
        return 0;
    }
    const ferry_json **idx = malloc(n * sizeof *idx);
    if (!idx) return oom(p);
    for (size_t k = 0; k < n; k++) idx[k] = &m[k];
    qsort(idx, n, sizeof *idx, key_cmp);
    int rc = 0;
    for (size_t k = 1; k < n && !rc; k++)
        if (!key_cmp(&idx[k - 1], &idx[k])) {
            const ferry_json *later = idx[k]->pos > idx[k - 1]->pos ? idx[k] : idx[k - 1];
            rc = perr(p, later->pos, "duplicate key in object");
        }
    free(idx);
    return rc;
}

/* Move the last n scratch entries into the arena as v's children. */
static int close_container(parser *p, ferry_json *v, size_t n) {
    v->n = n;
    v->items = NULL;
    if (n) {
        size_t bytes;
        if (__builtin_mul_overflow(n, sizeof(ferry_json), &bytes)) return oom(p);
        v->items = arena_alloc(p->d, bytes);
        if (!v->items) return oom(p);
        memcpy(v->items, p->stack + p->sn - n, bytes);
        p->sn -= n;
    }
    return 0;
}

static int parse_value(parser *p, ferry_json *v, int depth);

static int parse_array(parser *p, ferry_json *v, int depth) {
    p->i++;                               /* '[' */
    size_t n = 0;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ']') { p->i++; return close_container(p, v, 0); }
    for (;;) {
        ferry_json item;
        int rc = parse_value(p, &item, depth + 1);
        if (rc) return rc;
        if ((rc = push(p, &item))) return rc;
        n++;
        skip_ws(p);
        if (p->i >= p->n) return perr(p, p->i, "unterminated array");
        unsigned char c = p->s[p->i++];
        if (c == ']') break;
        if (c != ',') return perr(p, p->i - 1, "expected ',' or ']' in array");
    }
    return close_container(p, v, n);
}

static int parse_object(parser *p, ferry_json *v, int depth) {
    p->i++;                               /* '{' */
    size_t n = 0;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') { p->i++; return close_container(p, v, 0); }
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') return perr(p, p->i, "expected a string key in object");
        const char *key; size_t keylen;
        int rc = parse_string(p, &key, &keylen);
        if (rc) return rc;
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') return perr(p, p->i, "expected ':' in object");
        p->i++;
        ferry_json item;
        if ((rc = parse_value(p, &item, depth + 1))) return rc;
        item.key = key;
        item.keylen = keylen;
        if ((rc = push(p, &item))) return rc;
        n++;
        skip_ws(p);
        if (p->i >= p->n) return perr(p, p->i, "unterminated object");
        unsigned char c = p->s[p->i++];
        if (c == '}') break;
        if (c != ',') return perr(p, p->i - 1, "expected ',' or '}' in object");
    }
    int rc = check_dup_keys(p, p->stack + p->sn - n, n);
    if (rc) return rc;
    return close_container(p, v, n);
}

static int literal(parser *p, const char *word) {
    size_t l = strlen(word);
    if (p->n - p->i < l || memcmp(p->s + p->i, word, l)) return perr(p, p->i, "unexpected character");
    p->i += l;
    return 0;
}

static int parse_value(parser *p, ferry_json *v, int depth) {
    memset(v, 0, sizeof *v);
    skip_ws(p);
    if (p->i >= p->n) return perr(p, p->i, "unexpected end of input");
    v->pos = p->base + p->i;
    unsigned char c = p->s[p->i];
    switch (c) {
    case '{':
    case '[':
        if (depth >= FERRY_JSON_MAX_DEPTH) return perr(p, p->i, "nested too deeply");
        v->type = c == '{' ? FERRY_JSON_OBJECT : FERRY_JSON_ARRAY;
        return c == '{' ? parse_object(p, v, depth) : parse_array(p, v, depth);
    case '"':
        v->type = FERRY_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't': v->type = FERRY_JSON_BOOL; v->boolean = 1; return literal(p, "true");
    case 'f': v->type = FERRY_JSON_BOOL; return literal(p, "false");
    case 'n': v->type = FERRY_JSON_NULL; return literal(p, "null");
    default:
        if (c == '-' || is_digit(c)) return parse_number(p, v);
        return perr(p, p->i, "unexpected character");
    }
}

int ferry_json_parse(const char *text, size_t len, const char *what, uint64_t base, ferry_json **out) {
    *out = NULL;
    parser p = {0};
    p.s = (const unsigned char *)text;
    p.n = len;
    p.what = what;
    p.base = base;
    if (len > FERRY_JSON_MAX_BYTES) return perr(&p, 0, "input too large");
    if (!text && len) return ferry_seterr(FERRY_EINVAL, "ferry_json_parse: NULL text");
    p.d = calloc(1, sizeof *p.d);
    if (!p.d) return oom(&p);
    int rc = parse_value(&p, &p.d->root, 0);
    if (!rc) {
        skip_ws(&p);
        if (p.i != p.n) rc = perr(&p, p.i, "trailing characters after the value");
    }
    free(p.stack);
    if (rc) { doc_free(p.d); return rc; }
    *out = &p.d->root;
    return 0;
}

void ferry_json_free(ferry_json *root) {
    if (root) doc_free((doc *)root);
}

const ferry_json *ferry_json_get(const ferry_json *obj, const char *key) {
    if (!obj || obj->type != FERRY_JSON_OBJECT || !key) return NULL;
    size_t kl = strlen(key);
    for (size_t k = 0; k < obj->n; k++)
        if (obj->items[k].keylen == kl && !memcmp(obj->items[k].key, key, kl)) return &obj->items[k];
    return NULL;
}

const char *ferry_json_str(const ferry_json *v) {
    return v && v->type == FERRY_JSON_STRING ? v->str : NULL;
}

int ferry_json_u64(const ferry_json *v, uint64_t *out) {
    if (!v || v->type != FERRY_JSON_NUMBER || !v->len) return -1;
    uint64_t x = 0;
    for (size_t k = 0; k < v->len; k++) {
        unsigned char c = (unsigned char)v->str[k];
        if (!is_digit(c)) return -1;
        if (__builtin_mul_overflow(x, 10, &x) || __builtin_add_overflow(x, (uint64_t)(c - '0'), &x)) return -1;
    }
    *out = x;
    return 0;
}

int ferry_json_i64(const ferry_json *v, int64_t *out) {
    if (!v || v->type != FERRY_JSON_NUMBER || !v->len) return -1;
    int neg = v->str[0] == '-';
    ferry_json t = *v;
    t.str += neg; t.len -= (size_t)neg;
    uint64_t m;
    if (ferry_json_u64(&t, &m)) return -1;
    if (neg) {
        if (m > (uint64_t)INT64_MAX + 1) return -1;
        *out = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    } else {
        if (m > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)m;
    }
    return 0;
}

int ferry_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len(u + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

const char *ferry_json_type_name(ferry_json_type t) {
    switch (t) {
    case FERRY_JSON_NULL: return "null";
    case FERRY_JSON_BOOL: return "bool";
    case FERRY_JSON_NUMBER: return "number";
    case FERRY_JSON_STRING: return "string";
    case FERRY_JSON_ARRAY: return "array";
    case FERRY_JSON_OBJECT: return "object";
    }
    return "?";
}

/* ---- writer --------------------------------------------------------------- */
static int sbuf_reserve(ferry_sbuf *b, size_t extra) {
    if (b->oom) return FERRY_ENOMEM;
    size_t need;
    if (__builtin_add_overflow(b->len, extra, &need) || __builtin_add_overflow(need, 1, &need)) {
        b->oom = 1; return FERRY_ENOMEM;
    }
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) { cap = need; break; }
        cap *= 2;
    }
    char *np = realloc(b->p, cap);
    if (!np) { b->oom = 1; return FERRY_ENOMEM; }
    b->p = np; b->cap = cap;
    return 0;
}

int ferry_sbuf_append(ferry_sbuf *b, const char *s, size_t n) {
    if (sbuf_reserve(b, n)) return FERRY_ENOMEM;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int ferry_sbuf_puts(ferry_sbuf *b, const char *s) { return ferry_sbuf_append(b, s, strlen(s)); }

int ferry_sbuf_printf(ferry_sbuf *b, const char *fmt, ...) {
    if (b->oom) return FERRY_ENOMEM;
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return FERRY_ENOMEM; }
    if ((size_t)n < sizeof small) return ferry_sbuf_append(b, small, (size_t)n);
    if (sbuf_reserve(b, (size_t)n)) return FERRY_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int ferry_sbuf_json_string(ferry_sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    if (ferry_sbuf_append(b, "\"", 1)) return FERRY_ENOMEM;
    size_t run = 0;                 /* bytes copied verbatim in one go */
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        size_t l = c >= 0x20 && c != '"' && c != '\\' ? utf8_len(u + i, n - i) : 0;
        if (l) { i += l; run += l; continue; }
        ferry_sbuf_append(b, s + i - run, run);
        run = 0;
        char esc[8];
        switch (c) {
        case '"': ferry_sbuf_append(b, "\\\"", 2); break;
        case '\\': ferry_sbuf_append(b, "\\\\", 2); break;
        case '\n': ferry_sbuf_append(b, "\\n", 2); break;
        case '\r': ferry_sbuf_append(b, "\\r", 2); break;
        case '\t': ferry_sbuf_append(b, "\\t", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            ferry_sbuf_append(b, esc, 6);
        }
        i++;
    }
    ferry_sbuf_append(b, s + n - run, run);
    return ferry_sbuf_append(b, "\"", 1);
}

int ferry_sbuf_json_double(ferry_sbuf *b, double v, int sig) {
    if (isnan(v)) return ferry_sbuf_puts(b, "\"NaN\"");
    if (isinf(v)) return ferry_sbuf_puts(b, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    /* the shortest precision that reads back to the same value */
    char t[64];
    int n = 0;
    int maxp = sig > 0 && sig <= 17 ? sig : 17;
    for (int prec = maxp > 9 ? 15 : 6; prec <= maxp; prec++) {
        n = snprintf(t, sizeof t, "%.*g", prec, v);
        double back = strtod(t, NULL);
        if (maxp <= 9 ? (float)back == (float)v : back == v) break;
    }
    /* "%g" may print "1e+20" (valid JSON) or a bare integer (valid too).
     * The library never calls setlocale; guard against a decimal comma anyway. */
    for (int k = 0; k < n; k++) if (t[k] == ',') t[k] = '.';
    return ferry_sbuf_append(b, t, (size_t)n);
}

int ferry_sbuf_json_value(ferry_sbuf *b, const ferry_json *v) {
    if (!v) return ferry_sbuf_puts(b, "null");
    switch (v->type) {
    case FERRY_JSON_NULL: return ferry_sbuf_puts(b, "null");
    case FERRY_JSON_BOOL: return ferry_sbuf_puts(b, v->boolean ? "true" : "false");
    case FERRY_JSON_NUMBER: return ferry_sbuf_append(b, v->str, v->len);
    case FERRY_JSON_STRING: return ferry_sbuf_json_string(b, v->str, v->len);
    case FERRY_JSON_ARRAY:
    case FERRY_JSON_OBJECT: {
        int obj = v->type == FERRY_JSON_OBJECT;
        ferry_sbuf_append(b, obj ? "{" : "[", 1);
        for (size_t k = 0; k < v->n; k++) {
            if (k) ferry_sbuf_append(b, ",", 1);
            if (obj) {
                ferry_sbuf_json_string(b, v->items[k].key, v->items[k].keylen);
                ferry_sbuf_append(b, ":", 1);
            }
            ferry_sbuf_json_value(b, &v->items[k]);
        }
        return ferry_sbuf_append(b, obj ? "}" : "]", 1);
    }
    }
    return 0;
}

char *ferry_sbuf_take(ferry_sbuf *b) {
    char *p = b->p;
    int bad = b->oom;
    if (!bad && !p) {
        p = malloc(1);
        if (p) p[0] = 0;
    }
    b->p = NULL; b->len = b->cap = 0; b->oom = 0;
    if (bad) { free(p); return NULL; }
    return p;
}

void ferry_sbuf_free(ferry_sbuf *b) {
    free(b->p);
    b->p = NULL; b->len = b->cap = 0; b->oom = 0;
}
