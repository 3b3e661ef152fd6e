/* pickle.c — replay a pickle's opcodes into a tree of values, calling nothing.
 * pickle.h says what the tree holds and why. The opcodes are those of
 * protocols 2–5 (Python's Lib/pickletools.py documents each); protocol 0's
 * text opcodes, persistent ids and out-of-band buffers are refused by name:
 * torch.distributed.checkpoint's metadata uses none of them. */
#include "formats/pickle.h"
#include <stdlib.h>
#include <string.h>

#define BLOCK_NODES 4096

typedef struct block { struct block *next; size_t used; ferry_pk nodes[BLOCK_NODES]; } block;

struct ferry_pickle {
    block *blocks;
    ferry_pk *root;
};

typedef struct vm {
    ferry_pickle *p;
    const uint8_t *d;
    size_t n, pos, op_at;
    const char *what;
    ferry_pk **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    ferry_pk **memo;
    size_t nmemo, mcap2;
} vm;

static int bad(vm *m, const char *why) {
    return ferry_seterr(FERRY_EFORMAT, "%s: pickle byte %zu: %s", m->what, m->op_at, why);
}

static ferry_pk *node(vm *m, ferry_pk_kind kind) {
    block *b = m->p->blocks;
    if (!b || b->used == BLOCK_NODES) {
        b = calloc(1, sizeof *b);
        if (!b) return NULL;
        b->next = m->p->blocks;
        m->p->blocks = b;
    }
    ferry_pk *x = &b->nodes[b->used++];
    x->kind = kind;
    return x;
}

static int push(vm *m, ferry_pk *x) {
    if (!x) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory reading the pickle", m->what);
    if (m->sp == m->scap) {
        size_t cap = m->scap ? m->scap * 2 : 64;
        ferry_pk **s = realloc(m->stack, cap * sizeof *s);
        if (!s) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory reading the pickle", m->what);
        m->stack = s;
        m->scap = cap;
    }
    m->stack[m->sp++] = x;
    return 0;
}

static ferry_pk *pop(vm *m) {
    size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
    return m->sp > floor ? m->stack[--m->sp] : NULL;
}

static ferry_pk *top(vm *m) {
    size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
    return m->sp > floor ? m->stack[m->sp - 1] : NULL;
}

static int add_item(vm *m, ferry_pk *c, ferry_pk *x) {
    if (c->count == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4;
        ferry_pk **it = realloc(c->items, cap * sizeof *it);
        if (!it) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory reading the pickle", m->what);
        c->items = it;
        c->cap = cap;
    }
    c->items[c->count++] = x;
    return 0;
}

/* n bytes of the input, or NULL when fewer are left */
static const uint8_t *take(vm *m, size_t k) {
    if (k > m->n - m->pos) return NULL;
    const uint8_t *q = m->d + m->pos;
    m->pos += k;
    return q;
}

static int take_len(vm *m, int width, size_t *len) {
    const uint8_t *q = take(m, (size_t)width);
    if (!q) return bad(m, "truncated length");
    uint64_t v = width == 1 ? q[0] : width == 4 ? ferry_le32(q) : ferry_le64(q);
    if (v > m->n - m->pos) return bad(m, "a string or bytes longer than the rest of the pickle");
    *len = (size_t)v;
    return 0;
}

static int push_text(vm *m, ferry_pk_kind kind, size_t len) {
    const uint8_t *q = take(m, len);
    ferry_pk *x = node(m, kind);
    char *s = x ? malloc(len + 1) : NULL;
    if (!s) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory reading the pickle", m->what);
    memcpy(s, q, len);
    s[len] = 0;
    x->s = s;
    x->n = len;
    return push(m, x);
}

static int push_int(vm *m, int64_t v) {
    ferry_pk *x = node(m, FERRY_PK_INT);
    if (x) x->i = v;
    return push(m, x);
}

/* the items above the top mark, popped together with the mark */
static int pop_mark(vm *m, ferry_pk ***items, size_t *count) {
    if (!m->nmarks) return bad(m, "no MARK for this opcode");
    size_t at = m->marks[--m->nmarks];
    *items = m->stack ? m->stack + at : NULL;   /* a MARK before anything was pushed */
    *count = m->sp - at;
    m->sp = at;
    return 0;
}

static int make_seq(vm *m, ferry_pk_kind kind, ferry_pk **items, size_t count) {
    ferry_pk *x = node(m, kind);
    if (!x) return push(m, NULL);
    for (size_t k = 0; k < count; k++) {
        int rc = add_item(m, x, items[k]);
        if (rc < 0) return rc;
    }
    return push(m, x);
}

static int memo_put(vm *m, size_t idx, ferry_pk *x) {
    if (!x) return bad(m, "memo of an empty stack");
    if (idx > m->n) return bad(m, "memo index past anything the pickle can hold");
    if (idx >= m->mcap2) {
        size_t cap = m->mcap2 ? m->mcap2 : 64;
        while (cap <= idx) cap *= 2;
        ferry_pk **t = realloc(m->memo, cap * sizeof *t);
        if (!t) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory reading the pickle", m->what);
        memset(t + m->mcap2, 0, (cap - m->mcap2) * sizeof *t);
        m->memo = t;
        m->mcap2 = cap;
    }
    m->memo[idx] = x;
    if (idx >= m->nmemo) m->nmemo = idx + 1;
    return 0;
}

static int memo_get(vm *m, size_t idx) {
    if (idx >= m->nmemo || !m->memo[idx]) return bad(m, "memo get of an index never put");
    return push(m, m->memo[idx]);
}

static int make_obj(vm *m, ferry_pk *callable, ferry_pk *args) {
    if (!callable || !args) return bad(m, "a call with too few values on the stack");
    ferry_pk *x = node(m, FERRY_PK_OBJ);
    if (x) {
        x->callable = callable;
        x->args = args;
    }
    return push(m, x);
}

static int step(vm *m, uint8_t op, int *stop) {
    size_t len;
    int rc;
    const uint8_t *q;
    ferry_pk **items, *a, *b, *c;
    size_t count;
    switch (op) {
    case 0x80: return take(m, 1) ? 0 : bad(m, "truncated PROTO");           /* PROTO */
    case 0x95: return take(m, 8) ? 0 : bad(m, "truncated FRAME");           /* FRAME */
    case 0x8c: return (rc = take_len(m, 1, &len)) < 0 ? rc : push_text(m, FERRY_PK_STR, len);
    case 'X': return (rc = take_len(m, 4, &len)) < 0 ? rc : push_text(m, FERRY_PK_STR, len);
    case 0x8d: return (rc = take_len(m, 8, &len)) < 0 ? rc : push_text(m, FERRY_PK_STR, len);
    case 'U': return (rc = take_len(m, 1, &len)) < 0 ? rc : push_text(m, FERRY_PK_STR, len);
    case 'T': return (rc = take_len(m, 4, &len)) < 0 ? rc : push_text(m, FERRY_PK_STR, len);
    case 'C': return (rc = take_len(m, 1, &len)) < 0 ? rc : push_text(m, FERRY_PK_BYTES, len);
    case 'B': return (rc = take_len(m, 4, &len)) < 0 ? rc : push_text(m, FERRY_PK_BYTES, len);
    case 0x8e: return (rc = take_len(m, 8, &len)) < 0 ? rc : push_text(m, FERRY_PK_BYTES, len);
    case 0x94: return memo_put(m, m->nmemo, top(m));                        /* MEMOIZE */
    case 'q': return (q = take(m, 1)) ? memo_put(m, q[0], top(m)) : bad(m, "truncated BINPUT");
    case 'r': return (q = take(m, 4)) ? memo_put(m, ferry_le32(q), top(m)) : bad(m, "truncated LONG_BINPUT");
    case 'h': return (q = take(m, 1)) ? memo_get(m, q[0]) : bad(m, "truncated BINGET");
    case 'j': return (q = take(m, 4)) ? memo_get(m, ferry_le32(q)) : bad(m, "truncated LONG_BINGET");
    case 'K': return (q = take(m, 1)) ? push_int(m, q[0]) : bad(m, "truncated BININT1");
    case 'M': return (q = take(m, 2)) ? push_int(m, ferry_le16(q)) : bad(m, "truncated BININT2");
    case 'J': return (q = take(m, 4)) ? push_int(m, (int32_t)ferry_le32(q)) : bad(m, "truncated BININT");
    case 0x8a: case 0x8b: {                                                  /* LONG1, LONG4 */
        if ((rc = take_len(m, op == 0x8a ? 1 : 4, &len)) < 0) return rc;
        q = take(m, len);
        ferry_pk *x = node(m, FERRY_PK_INT);
        if (x && len > 8) x->big = 1;
        else if (x && len) {
            uint64_t v = 0;
            for (size_t k = 0; k < len; k++) v |= (uint64_t)q[k] << (8 * k);
            if (len < 8 && (q[len - 1] & 0x80)) v |= ~0ull << (8 * len);   /* sign-extend */
            x->i = (int64_t)v;
        }
        return push(m, x);
    }
    case 'G': {                                                              /* BINFLOAT */
        if (!(q = take(m, 8))) return bad(m, "truncated BINFLOAT");
        uint64_t v = ferry_be64(q);
        ferry_pk *x = node(m, FERRY_PK_FLOAT);
        if (x) memcpy(&x->f, &v, sizeof x->f);
        return push(m, x);
    }
    case 'N': return push(m, node(m, FERRY_PK_NONE));
    case 0x88: case 0x89: {
        ferry_pk *x = node(m, FERRY_PK_BOOL);
        if (x) x->i = op == 0x88;
        return push(m, x);
    }
    case 'c': {                                                              /* GLOBAL "mod\nname\n" */
        size_t start = m->pos, nl1 = 0, nl2 = 0;
        for (size_t k = start; k < m->n && !nl2; k++)
            if (m->d[k] == '\n') { if (!nl1) nl1 = k + 1; else nl2 = k + 1; }
        if (!nl2) return bad(m, "truncated GLOBAL");
        m->pos = nl2;
        ferry_pk *x = node(m, FERRY_PK_GLOBAL);
        char *mod = x ? strndup((const char *)m->d + start, nl1 - 1 - start) : NULL;
        char *name = mod ? strndup((const char *)m->d + nl1, nl2 - 1 - nl1) : NULL;
        if (!name) { free(mod); return push(m, NULL); }
        x->s = mod;
        x->name = name;
        x->n = 1;   /* GLOBAL owns its strings (STACK_GLOBAL's belong to their STR nodes) */
        return push(m, x);
    }
    case 0x93: {                                                             /* STACK_GLOBAL */
        b = pop(m), a = pop(m);
        if (!a || !b || a->kind != FERRY_PK_STR || b->kind != FERRY_PK_STR) return bad(m, "STACK_GLOBAL without two strings");
        ferry_pk *x = node(m, FERRY_PK_GLOBAL);
        if (x) { x->s = a->s; x->name = b->s; }   /* the strings stay owned by their nodes */
        return push(m, x);
    }
    case ')': return push(m, node(m, FERRY_PK_TUPLE));
    case ']': return push(m, node(m, FERRY_PK_LIST));
    case '}': return push(m, node(m, FERRY_PK_DICT));
    case 0x8f: return push(m, node(m, FERRY_PK_LIST));                     /* EMPTY_SET: a list here */
    case 0x85: case 0x86: case 0x87: {                                      /* TUPLE1..3 */
        count = (size_t)(op - 0x84);
        size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
        if (m->sp - floor < count) return bad(m, "TUPLEn with too few values");
        m->sp -= count;
        return make_seq(m, FERRY_PK_TUPLE, m->stack + m->sp, count);
    }
    case '(':                                                                /* MARK */
        if (m->nmarks == m->mcap) {
            size_t cap = m->mcap ? m->mcap * 2 : 16;
            if (cap > m->n + 16) return bad(m, "more marks than the pickle has bytes");
            size_t *t = realloc(m->marks, cap * sizeof *t);
            if (!t) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory reading the pickle", m->what);
            m->marks = t;
            m->mcap = cap;
        }
        m->marks[m->nmarks++] = m->sp;
        return 0;
    case 't': case 'l': case 0x91:                                           /* TUPLE, LIST, FROZENSET */
        if ((rc = pop_mark(m, &items, &count)) < 0) return rc;
        return make_seq(m, op == 't' ? FERRY_PK_TUPLE : FERRY_PK_LIST, items, count);
    case 'd':                                                                /* DICT */
        if ((rc = pop_mark(m, &items, &count)) < 0) return rc;
        if (count % 2) return bad(m, "DICT with an odd number of values");
        return make_seq(m, FERRY_PK_DICT, items, count);
    case 's':                                                                /* SETITEM */
        b = pop(m), a = pop(m), c = top(m);
        if (!a || !b || !c || c->kind != FERRY_PK_DICT) return bad(m, "SETITEM without a dict, key and value");
        return (rc = add_item(m, c, a)) < 0 ? rc : add_item(m, c, b);
    case 'u': case 'a': case 'e': case 0x90: {                               /* SETITEMS, APPEND, APPENDS, ADDITEMS */
        if (op == 'a') {
            b = pop(m), c = top(m);
            if (!b || !c || c->kind != FERRY_PK_LIST) return bad(m, "APPEND without a list");
            return add_item(m, c, b);
        }
        if ((rc = pop_mark(m, &items, &count)) < 0) return rc;
        c = top(m);
        ferry_pk_kind want = op == 'u' ? FERRY_PK_DICT : FERRY_PK_LIST;
        if (!c || c->kind != want || (op == 'u' && count % 2)) return bad(m, "SETITEMS/APPENDS without its container");
        for (size_t k = 0; k < count; k++)
            if ((rc = add_item(m, c, items[k])) < 0) return rc;
        return 0;
    }
    case 'R': b = pop(m), a = pop(m); return make_obj(m, a, b);             /* REDUCE */
    case 0x81: b = pop(m), a = pop(m); return make_obj(m, a, b);            /* NEWOBJ */
    case 0x92: c = pop(m), b = pop(m), a = pop(m); return c ? make_obj(m, a, b) : bad(m, "NEWOBJ_EX with too few values");
    case 'b':                                                                /* BUILD */
        b = pop(m), a = top(m);
        if (!a || !b || a->kind != FERRY_PK_OBJ) return bad(m, "BUILD on something the pickle did not construct");
        a->state = b;
        return 0;
    case '0': return pop(m) ? 0 : bad(m, "POP of an empty stack");
    case '2': return top(m) ? push(m, top(m)) : bad(m, "DUP of an empty stack");
    case '1': return pop_mark(m, &items, &count);                            /* POP_MARK */
    case '.': *stop = 1; return 0;
    case 'P': case 'Q': return bad(m, "persistent ids are not read here (a torch.save archive's pickle?)");
    case 0x96: case 0x97: case 0x98: return bad(m, "out-of-band buffers are not read here");
    default: {
        char why[80];
        snprintf(why, sizeof why, "opcode 0x%02x is not one protocols 2-5 write", op);
        return bad(m, why);
    }
    }
}

int ferry_pickle_parse(const uint8_t *data, size_t n, const char *what, ferry_pickle **out) {
    *out = NULL;
    ferry_pickle *p = calloc(1, sizeof *p);
    if (!p) return ferry_seterr(FERRY_ENOMEM, "%s: out of memory reading the pickle", what);
    vm m = {.p = p, .d = data, .n = n, .what = what};
    int rc = 0, stop = 0;
    while (rc >= 0 && !stop) {
        m.op_at = m.pos;
        if (m.pos >= n) { rc = bad(&m, "ends before STOP"); break; }
        rc = step(&m, data[m.pos++], &stop);
    }
    if (rc >= 0 && !(p->root = pop(&m))) rc = bad(&m, "STOP with nothing on the stack");
    free(m.stack);
    free(m.marks);
    free(m.memo);
    if (rc < 0) { ferry_pickle_free(p); return rc; }
    *out = p;
    return 0;
}

void ferry_pickle_free(ferry_pickle *p) {
    if (!p) return;
    for (block *b = p->blocks, *next; b; b = next) {
        next = b->next;
        for (size_t k = 0; k < b->used; k++) {
            ferry_pk *x = &b->nodes[k];
            free(x->items);
            if (x->kind == FERRY_PK_STR || x->kind == FERRY_PK_BYTES) free((char *)x->s);
            if (x->kind == FERRY_PK_GLOBAL && x->n == 1) {
                free((char *)x->s);
                free((char *)x->name);
            }
        }
        free(b);
    }
    free(p);
}

const ferry_pk *ferry_pickle_root(const ferry_pickle *p) { return p ? p->root : NULL; }

const ferry_pk *ferry_pk_get(const ferry_pk *d, const char *key) {
    if (!d || d->kind != FERRY_PK_DICT) return NULL;
    for (size_t k = 0; k + 1 < d->count; k += 2)
        if (d->items[k]->kind == FERRY_PK_STR && !strcmp(d->items[k]->s, key)) return d->items[k + 1];
    return NULL;
}

const ferry_pk *ferry_pk_attr(const ferry_pk *obj, const char *key) {
    if (!obj || obj->kind != FERRY_PK_OBJ || !obj->state) return NULL;
    const ferry_pk *st = obj->state;
    if (st->kind == FERRY_PK_TUPLE && st->count == 2) {   /* (dict, slots) */
        const ferry_pk *v = ferry_pk_get(st->items[0], key);
        return v ? v : ferry_pk_get(st->items[1], key);
    }
    return ferry_pk_get(st, key);
}

int ferry_pk_is(const ferry_pk *x, const char *module, const char *name) {
    if (!x || x->kind != FERRY_PK_OBJ || !x->callable || x->callable->kind != FERRY_PK_GLOBAL) return 0;
    const ferry_pk *g = x->callable;
    return !strcmp(g->name, name) && (!module || !strcmp(g->s, module));
}
