/* fuzz_json.c — the JSON parser: any input parses or fails cleanly; what
 * parses re-serialises to text that parses to the same serialisation. */
#include "fuzz.h"
#include "formats/json.h"

static int fuzz_json(const uint8_t *data, size_t size) {
    ferry_json *a = NULL, *b = NULL;
    if (ferry_json_parse((const char *)data, size, "fuzz", 0, &a)) {
        if (a) abort();
        return 0;
    }
    ferry_sbuf s1 = {0}, s2 = {0};
    ferry_sbuf_json_value(&s1, a);
    char *t1 = ferry_sbuf_take(&s1);
    if (!t1) abort();
    if (ferry_json_parse(t1, strlen(t1), "fuzz-again", 0, &b)) abort();
    ferry_sbuf_json_value(&s2, b);
    char *t2 = ferry_sbuf_take(&s2);
    if (!t2 || strcmp(t1, t2)) abort();
    uint64_t u; int64_t i;
    if (a->type == FERRY_JSON_ARRAY)
        for (size_t k = 0; k < a->n; k++) { (void)ferry_json_u64(&a->items[k], &u); (void)ferry_json_i64(&a->items[k], &i); }
    free(t1);
    free(t2);
    ferry_json_free(a);
    ferry_json_free(b);
    return 0;
}
FERRY_FUZZ_TARGET(json, fuzz_json)
