/* size.c — the one size grammar (ferry_size_parse in ferry.h): knobs,
 * command-line options and Python keywords read sizes through it, so "8M"
 * means the same thing everywhere. */
#include "common.h"
#include <ctype.h>
#include <string.h>

/* "5GB" is 5·10⁹ (SI, as Hugging Face's max_shard_size reads it); "5GiB" and
 * "5G" are 5·2³⁰ (and so FERRY_STAGING_SIZE=8M stays 8 MiB). Fractions are
 * allowed when they give whole bytes ("1.5K" = 1536). */
int ferry_size_parse(const char *s, uint64_t *out) {
    const char *p = s;
    if (!p || !out) return ferry_seterr(FERRY_EINVAL, "ferry_size_parse: no string");
    while (isspace((unsigned char)*p)) p++;
    if (!isdigit((unsigned char)*p)) goto bad;
    uint64_t whole = 0, frac = 0, frac_div = 1;
    for (; isdigit((unsigned char)*p); p++)
        if (ferry_mul_overflow(whole, 10, &whole) || ferry_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
            goto big;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) goto bad;
        for (; isdigit((unsigned char)*p); p++) {
            if (frac_div >= 1000000000000ull) goto bad;   /* more digits than any size needs */
            frac = frac * 10 + (uint64_t)(*p - '0');
            frac_div *= 10;
        }
    }
    while (isspace((unsigned char)*p)) p++;
    static const char units[] = "KMGTP";
    uint64_t mul = 1;
    const char *u = *p ? strchr(units, toupper((unsigned char)*p)) : NULL;
    if (u) {
        int power = (int)(u - units) + 1, binary = 1;
        p++;
        if (*p == 'i' || *p == 'I') { p++; if (*p != 'B' && *p != 'b') goto bad; p++; }
        else if (*p == 'B' || *p == 'b') { p++; binary = 0; }
        for (int k = 0; k < power; k++) mul *= binary ? 1024 : 1000;
    } else if (*p == 'B' || *p == 'b') {
        p++;
    }
    while (isspace((unsigned char)*p)) p++;
    if (*p) goto bad;
    uint64_t r, f;
    if (ferry_mul_overflow(whole, mul, &r)) goto big;
    /* frac/frac_div · mul must be whole bytes: frac·mul is below 10¹² · 1024⁵ only when checked */
    if (frac) {
        if (ferry_mul_overflow(frac, mul, &f) || f % frac_div) goto bad;
        if (ferry_add_overflow(r, f / frac_div, &r)) goto big;
    }
    *out = r;
    return 0;
bad:
    return ferry_seterr(FERRY_EINVAL, "\"%s\": not a size (e.g. 4096, 8M or 8MiB = 8·2^20, 5GB = 5·10^9)", s);
big:
    return ferry_seterr(FERRY_EINVAL, "\"%s\": size too large", s);
}
