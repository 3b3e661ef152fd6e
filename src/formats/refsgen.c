/* refsgen.c — kerchunk version 1 templates and "gen" entries (refsgen.h).
 * Learnt from kerchunk's reference specification: a "gen" entry is
 *   {"key": "t/{{i}}", "url": "{{u}}_{{i}}.nc", "offset": "{{i * 100}}",
 *    "length": "100", "dimensions": {"i": {"start": 0, "stop": 5, "step": 1}}}
 * (a dimension is a range object or a list of integers) and stands for one
 * reference per combination of its dimensions' values. */
#include "formats/refsgen.h"
#include <ctype.h>
#include <stdlib.h>

typedef struct expr {
    const char *s, *end, *at;       /* the field's text and the read position */
    const char *const *names;
    const int64_t *vals;
    int nvars;
    int depth;
    const char *what;
    const char *field;              /* the whole field, for messages */
    size_t fieldlen;
} expr;

static int bad(const expr *e, const char *why) {
    return ferry_seterr(FERRY_EFORMAT, "%s: template field \"{{%.*s}}\": %s (ferry renders template names, "
                        "dimension variables and integer arithmetic)", e->what, (int)e->fieldlen, e->field, why);
}

static void skip_ws(expr *e) {
    while (e->at < e->end && isspace((unsigned char)*e->at)) e->at++;
}

static int parse_sum(expr *e, int64_t *out);

static int parse_atom(expr *e, int64_t *out) {
    skip_ws(e);
    if (e->at >= e->end) return bad(e, "expression ends early");
    char c = *e->at;
    if (c == '(') {
        if (++e->depth > 32) return bad(e, "nested too deeply");
        e->at++;
        int rc = parse_sum(e, out);
        if (rc < 0) return rc;
        skip_ws(e);
        if (e->at >= e->end || *e->at != ')') return bad(e, "missing ')'");
        e->at++;
        e->depth--;
        return 0;
    }
    if (c == '-') {
        e->at++;
        int64_t v;
        int rc = parse_atom(e, &v);
        if (rc < 0) return rc;
        if (v == INT64_MIN) return bad(e, "integer overflow");
        *out = -v;
        return 0;
    }
    if (isdigit((unsigned char)c)) {
        uint64_t v = 0;
        while (e->at < e->end && isdigit((unsigned char)*e->at)) {
            if (ferry_mul_overflow(v, 10, &v) || ferry_add_overflow(v, (uint64_t)(*e->at - '0'), &v) ||
                v > (uint64_t)INT64_MAX)
                return bad(e, "integer overflow");
            e->at++;
        }
        *out = (int64_t)v;
        return 0;
    }
    if (isalpha((unsigned char)c) || c == '_') {
        const char *b = e->at;
        while (e->at < e->end && (isalnum((unsigned char)*e->at) || *e->at == '_')) e->at++;
        size_t n = (size_t)(e->at - b);
        for (int i = 0; i < e->nvars; i++)
            if (strlen(e->names[i]) == n && !memcmp(e->names[i], b, n)) { *out = e->vals[i]; return 0; }
        return bad(e, "a name that is no dimension variable (a template name must be the whole field)");
    }
    return bad(e, "unexpected character");
}

static int parse_product(expr *e, int64_t *out) {
    int rc = parse_atom(e, out);
    while (rc == 0) {
        skip_ws(e);
        if (e->at >= e->end) return 0;
        char c = *e->at;
        int floordiv = c == '/' && e->at + 1 < e->end && e->at[1] == '/';
        if (c != '*' && c != '/' && c != '%') return 0;
        if (c == '*' && e->at + 1 < e->end && e->at[1] == '*') return bad(e, "** is not supported");
        e->at += floordiv ? 2 : 1;
        int64_t r;
        if ((rc = parse_atom(e, &r)) < 0) return rc;
        if (c == '*') {
            if (__builtin_mul_overflow(*out, r, out)) return bad(e, "integer overflow");
            continue;
        }
        if (r == 0) return bad(e, "division by zero");
        if (*out == INT64_MIN && r == -1) return bad(e, "integer overflow");
        int64_t q = *out / r, m = *out % r;
        if (c == '/' && !floordiv && m) return bad(e, "/ that does not divide exactly (use //)");
        if (m && ((m < 0) != (r < 0))) { q--; m += r; }   /* Python's floor division and modulo */
        *out = c == '%' ? m : q;
    }
    return rc;
}

static int parse_sum(expr *e, int64_t *out) {
    int rc = parse_product(e, out);
    while (rc == 0) {
        skip_ws(e);
        if (e->at >= e->end || (*e->at != '+' && *e->at != '-')) return 0;
        char c = *e->at++;
        int64_t r;
        if ((rc = parse_product(e, &r)) < 0) return rc;
        if (c == '+' ? __builtin_add_overflow(*out, r, out) : __builtin_sub_overflow(*out, r, out))
            return bad(e, "integer overflow");
    }
    return rc;
}

/* Longest string one rendering may make: keys and URLs are short, but a
 * template repeated in a field, or a long template, could otherwise turn a
 * small JSON into gigabytes. */
#define REFS_MAX_RENDER ((size_t)16 << 10)

int ferry_refs_render(const char *s, size_t n, const ferry_json *templates, const char *const *names,
                      const int64_t *vals, int nvars, ferry_sbuf *out, const char *what) {
    size_t i = 0, start = out->len;
    while (i < n) {
        if (out->len - start > REFS_MAX_RENDER)
            return ferry_seterr(FERRY_EFORMAT, "%s: \"%.*s\": renders to more than %zu bytes", what,
                                (int)(n > 200 ? 200 : n), s, REFS_MAX_RENDER);
        const char *open = NULL;
        for (size_t k = i; k + 1 < n; k++)
            if (s[k] == '{' && s[k + 1] == '{') { open = s + k; break; }
        if (!open) { ferry_sbuf_append(out, s + i, n - i); break; }
        ferry_sbuf_append(out, s + i, (size_t)(open - (s + i)));
        const char *body = open + 2, *close = NULL;
        for (const char *k = body; k + 1 < s + n; k++)
            if (k[0] == '}' && k[1] == '}') { close = k; break; }
        if (!close)
            return ferry_seterr(FERRY_EFORMAT, "%s: \"%.*s\": a template field \"{{\" is not closed", what,
                                (int)(n > 200 ? 200 : n), s);
        expr e = {body, close, body, names, vals, nvars, 0, what, body, (size_t)(close - body)};
        /* a template name alone is replaced by its text */
        const char *b = body, *t = close;
        while (b < t && isspace((unsigned char)*b)) b++;
        while (t > b && isspace((unsigned char)t[-1])) t--;
        const ferry_json *tpl = NULL;
        if (templates && t > b) {
            char nm[128];
            if ((size_t)(t - b) < sizeof nm) {
                memcpy(nm, b, (size_t)(t - b));
                nm[t - b] = 0;
                tpl = ferry_json_get(templates, nm);
            }
        }
        int isvar = 0;
        for (int v = 0; v < nvars; v++)
            if (strlen(names[v]) == (size_t)(t - b) && !memcmp(names[v], b, (size_t)(t - b))) isvar = 1;
        if (tpl && !isvar) {
            if (tpl->type != FERRY_JSON_STRING) return bad(&e, "the template is not a string");
            ferry_sbuf_append(out, tpl->str, tpl->len);
        } else {
            int64_t v;
            int rc = parse_sum(&e, &v);
            if (rc < 0) return rc;
            skip_ws(&e);
            if (e.at != e.end) return bad(&e, "unexpected text after the expression");
            ferry_sbuf_printf(out, "%lld", (long long)v);
        }
        i = (size_t)(close + 2 - s);
    }
    if (out->len - start > REFS_MAX_RENDER)
        return ferry_seterr(FERRY_EFORMAT, "%s: \"%.*s\": renders to more than %zu bytes", what,
                            (int)(n > 200 ? 200 : n), s, REFS_MAX_RENDER);
    return out->oom ? ferry_seterr(FERRY_ENOMEM, "%s: out of memory", what) : 0;
}

/* ---- gen --------------------------------------------------------------------- */

typedef struct dim {
    const char *name;
    const ferry_json *list;       /* a list of integers, or NULL: the range below */
    int64_t start, step;
    uint64_t count;
} dim;

static int gen_dim(const char *file, size_t g, const ferry_json *d, dim *out) {
    out->name = d->key;
    out->list = NULL;
    if (d->type == FERRY_JSON_ARRAY) {
        for (size_t i = 0; i < d->n; i++) {
            int64_t x;
            if (ferry_json_i64(&d->items[i], &x) < 0)
                return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: gen[%zu]: dimension \"%s\": values must be integers",
                                    file, (unsigned long long)d->items[i].pos, g, d->key);
        }
        out->list = d;
        out->count = d->n;
        return 0;
    }
    int64_t start = 0, stop, step = 1;
    const ferry_json *js = ferry_json_get(d, "start"), *jt = ferry_json_get(d, "stop"), *jp = ferry_json_get(d, "step");
    if (d->type != FERRY_JSON_OBJECT || (js && ferry_json_i64(js, &start) < 0) || ferry_json_i64(jt, &stop) < 0 ||
        (jp && ferry_json_i64(jp, &step) < 0) || step <= 0)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: gen[%zu]: dimension \"%s\" must be a list of integers or "
                            "{\"start\", \"stop\", \"step\"} with integers and a step of at least 1",
                            file, (unsigned long long)d->pos, g, d->key ? d->key : "?");
    out->start = start;
    out->step = step;
    out->count = stop > start ? (uint64_t)(((__int128)stop - start + step - 1) / step) : 0;
    return 0;
}

static int gen_field(const ferry_json *entry, const char *name, const ferry_json *templates, const dim *dims,
                     const int64_t *vals, int nd, ferry_sbuf *out, const char *what) {
    const ferry_json *v = ferry_json_get(entry, name);
    const char *names[FERRY_REFS_GEN_MAX_DIMS];
    for (int k = 0; k < nd; k++) names[k] = dims[k].name;
    out->len = 0;
    if (out->p) out->p[0] = 0;
    if (v && v->type == FERRY_JSON_NUMBER) return ferry_sbuf_append(out, v->str, v->len) < 0 ? FERRY_ENOMEM : 0;
    if (!v || v->type != FERRY_JSON_STRING)
        return ferry_seterr(FERRY_EFORMAT, "%s: \"%s\" must be a string", what, name);
    return ferry_refs_render(v->str, v->len, templates, names, vals, nd, out, what);
}

static int to_u64(const ferry_sbuf *b, uint64_t *out) {
    if (!b->len || b->len > 20) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < b->len; i++) {
        if (!isdigit((unsigned char)b->p[i])) return -1;
        if (ferry_mul_overflow(v, 10, &v) || ferry_add_overflow(v, (uint64_t)(b->p[i] - '0'), &v)) return -1;
    }
    *out = v;
    return 0;
}

int ferry_refs_gen(const ferry_json *gen, const ferry_json *templates, const char *file, uint64_t max,
                   ferry_refs_emit_fn emit, void *arg) {
    if (!gen) return 0;
    if (gen->type != FERRY_JSON_ARRAY)
        return ferry_seterr(FERRY_EFORMAT, "%s: byte %llu: \"gen\" must be an array", file, (unsigned long long)gen->pos);
    uint64_t total = 0;
    ferry_sbuf key = {0}, url = {0}, off = {0}, len = {0};
    int rc = 0;
    for (size_t g = 0; g < gen->n && rc == 0; g++) {
        const ferry_json *e = &gen->items[g], *dj = ferry_json_get(e, "dimensions");
        char what[600];
        snprintf(what, sizeof what, "%s: byte %llu: gen[%zu]", file, (unsigned long long)e->pos, g);
        if (e->type != FERRY_JSON_OBJECT || !dj || dj->type != FERRY_JSON_OBJECT) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: must be an object with \"key\", \"url\" and a \"dimensions\" object", what);
            break;
        }
        if (dj->n > FERRY_REFS_GEN_MAX_DIMS) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: %zu dimensions (at most %d)", what, dj->n, FERRY_REFS_GEN_MAX_DIMS);
            break;
        }
        dim dims[FERRY_REFS_GEN_MAX_DIMS];
        int nd = (int)dj->n;
        uint64_t n = 1;
        for (int k = 0; k < nd && rc == 0; k++) {
            rc = gen_dim(file, g, &dj->items[k], &dims[k]);
            if (rc == 0 && ferry_mul_overflow(n, dims[k].count, &n)) n = UINT64_MAX;
        }
        if (rc < 0) break;
        if (ferry_add_overflow(total, n, &total) || total > max) {
            rc = ferry_seterr(FERRY_EFORMAT, "%s: generates more than %llu references", what, (unsigned long long)max);
            break;
        }
        int ranged = ferry_json_get(e, "offset") && ferry_json_get(e, "length");
        uint64_t at[FERRY_REFS_GEN_MAX_DIMS] = {0};
        for (uint64_t i = 0; i < n && rc == 0; i++) {
            int64_t vals[FERRY_REFS_GEN_MAX_DIMS];
            for (int k = 0; k < nd; k++) {
                int64_t x;
                if (dims[k].list) (void)ferry_json_i64(&dims[k].list->items[at[k]], &x);
                else x = (int64_t)((__int128)dims[k].start + (__int128)at[k] * dims[k].step);
                vals[k] = x;
            }
            uint64_t o = 0, l = 0;
            if ((rc = gen_field(e, "key", templates, dims, vals, nd, &key, what)) < 0) break;
            if ((rc = gen_field(e, "url", templates, dims, vals, nd, &url, what)) < 0) break;
            if (ranged) {
                if ((rc = gen_field(e, "offset", templates, dims, vals, nd, &off, what)) < 0) break;
                if ((rc = gen_field(e, "length", templates, dims, vals, nd, &len, what)) < 0) break;
                if (to_u64(&off, &o) < 0 || to_u64(&len, &l) < 0) {
                    rc = ferry_seterr(FERRY_EFORMAT, "%s: key \"%s\": offset \"%s\" or length \"%s\" is not a "
                                      "non-negative integer", what, key.p ? key.p : "", off.p ? off.p : "",
                                      len.p ? len.p : "");
                    break;
                }
            }
            rc = emit(arg, key.p ? key.p : "", url.p ? url.p : "", ranged, o, l);
            for (int k = nd - 1; k >= 0; k--) {   /* the last dimension fastest */
                if (++at[k] < dims[k].count) break;
                at[k] = 0;
            }
        }
    }
    ferry_sbuf_free(&key); ferry_sbuf_free(&url); ferry_sbuf_free(&off); ferry_sbuf_free(&len);
    return rc;
}
