/* fuzz_pickle.c — the pickle reader that runs nothing (src/formats/pickle.c):
 * any bytes parse or fail with a message; a parsed tree is walked to a
 * bounded depth (it may share nodes and hold cycles). */
#include "fuzz.h"
#include "formats/pickle.h"

/* shared nodes make the tree a DAG whose paths multiply: walk at most
 * *budget visits, as a real reader bounds its walk */
static void walk(const ferry_pk *x, int depth, long *budget) {
    if (!x || depth > 32 || --*budget < 0) return;
    if (x->kind == FERRY_PK_STR && x->s[x->n] != 0) abort();   /* the copy is NUL-terminated */
    for (size_t k = 0; k < x->count; k++) walk(x->items[k], depth + 1, budget);
    if (x->kind == FERRY_PK_OBJ) {
        walk(x->callable, depth + 1, budget);
        walk(x->args, depth + 1, budget);
        walk(x->state, depth + 1, budget);
    }
}

static int fuzz_pickle(const uint8_t *data, size_t size) {
    ferry_pickle *p = NULL;
    if (ferry_pickle_parse(data, size, "fuzz.pickle", &p) == 0) {
        if (!ferry_pickle_root(p)) abort();
        long budget = 100000;
        walk(ferry_pickle_root(p), 0, &budget);
        (void)ferry_pk_attr(ferry_pickle_root(p), "state_dict_metadata");
    } else if (!ferry_errmsg(NULL)[0]) {
        abort();   /* every refusal says why */
    }
    ferry_pickle_free(p);
    return 0;
}
FERRY_FUZZ_TARGET(pickle, fuzz_pickle)
