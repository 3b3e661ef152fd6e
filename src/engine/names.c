/* names.c — the one table of names for ferry's enums (dtypes, codecs, I/O
 * policies) and the one size parser. The CLI, the Python extension and, through
 * it, the Python modules use these instead of tables of their own, so a name
 * means the same thing everywhere (issue 10 item 3). ferry_path_name/_parse
 * stay in config.c beside the path enum's other users. */
#include "common.h"
#include <ctype.h>
#include <strings.h>

/* One row per ferry_dtype: short (ferry info), long (numpy / torch attribute
 * name), safetensors (NULL where safetensors has none), itemsize (0: varies). */
static const struct dtype_row {
    const char *name, *long_name, *st_name;
    uint32_t itemsize;
} dtypes[] = {
    [FERRY_DT_UNKNOWN] = {"other", "other", NULL, 0},
    [FERRY_DT_BOOL] = {"b1", "bool", "BOOL", 1},
    [FERRY_DT_I8] = {"i1", "int8", "I8", 1},
    [FERRY_DT_U8] = {"u1", "uint8", "U8", 1},
    [FERRY_DT_I16] = {"i2", "int16", "I16", 2},
    [FERRY_DT_U16] = {"u2", "uint16", "U16", 2},
    [FERRY_DT_I32] = {"i4", "int32", "I32", 4},
    [FERRY_DT_U32] = {"u4", "uint32", "U32", 4},
    [FERRY_DT_I64] = {"i8", "int64", "I64", 8},
    [FERRY_DT_U64] = {"u8", "uint64", "U64", 8},
    [FERRY_DT_F16] = {"f2", "float16", "F16", 2},
    [FERRY_DT_BF16] = {"bf16", "bfloat16", "BF16", 2},
    [FERRY_DT_F32] = {"f4", "float32", "F32", 4},
    [FERRY_DT_F64] = {"f8", "float64", "F64", 8},
    [FERRY_DT_C64] = {"c8", "complex64", "C64", 8},
    [FERRY_DT_C128] = {"c16", "complex128", NULL, 16},
    [FERRY_DT_F8_E4M3] = {"f8e4m3", "float8_e4m3fn", "F8_E4M3", 1},
    [FERRY_DT_F8_E5M2] = {"f8e5m2", "float8_e5m2", "F8_E5M2", 1},
    [FERRY_DT_DATETIME64] = {"M8", "datetime64", NULL, 8},
    [FERRY_DT_TIMEDELTA64] = {"m8", "timedelta64", NULL, 8},
    [FERRY_DT_CHAR] = {"S1", "char", NULL, 1},
    [FERRY_DT_BYTES] = {"S", "bytes", NULL, 0},
    [FERRY_DT_OTHER] = {"other", "other", NULL, 0},
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

const char *ferry_dtype_name(ferry_dtype d, ferry_name_style style) {
    if ((unsigned)d >= NDTYPES) d = FERRY_DT_OTHER;
    const struct dtype_row *r = &dtypes[d];
    switch (style) {
    case FERRY_NAME_LONG: return r->long_name;
    case FERRY_NAME_SAFETENSORS: return r->st_name;
    default: return r->name;
    }
}

int ferry_dtype_parse(const char *name, ferry_dtype *out) {
    if (name && out)
        /* from BOOL: "other" is no type to parse into */
        for (unsigned d = FERRY_DT_BOOL; d < FERRY_DT_OTHER; d++) {
            const struct dtype_row *r = &dtypes[d];
            if (!strcmp(name, r->name) || !strcmp(name, r->long_name) || (r->st_name && !strcmp(name, r->st_name))) {
                *out = (ferry_dtype)d;
                return 0;
            }
        }
    return ferry_seterr(FERRY_EINVAL, "unknown dtype \"%s\" (e.g. f4, float32, F32; bf16, bfloat16, BF16)",
                        name ? name : "");
}

uint32_t ferry_dtype_itemsize(ferry_dtype d) { return (unsigned)d < NDTYPES ? dtypes[d].itemsize : 0; }

/* Codec names as plans, `ferry info` and Zarr/HDF5 metadata spell them;
 * "deflate" (HDF5's word) is accepted for zlib and never printed. */
static const char *const codecs[] = {
    [FERRY_CODEC_NONE] = "none", [FERRY_CODEC_ZLIB] = "zlib", [FERRY_CODEC_GZIP] = "gzip",
    [FERRY_CODEC_ZSTD] = "zstd", [FERRY_CODEC_LZ4] = "lz4", [FERRY_CODEC_BLOSC] = "blosc",
    [FERRY_CODEC_SHUFFLE] = "shuffle", [FERRY_CODEC_CRC32C] = "crc32c",
    [FERRY_CODEC_FLETCHER32] = "fletcher32", [FERRY_CODEC_BYTESWAP] = "byteswap",
};
#define NCODECS (sizeof codecs / sizeof codecs[0])

const char *ferry_codec_name(ferry_codec_id id) { return (unsigned)id < NCODECS ? codecs[id] : "unknown"; }

int ferry_codec_parse(const char *name, ferry_codec_id *out) {
    if (name && out) {
        for (unsigned i = 0; i < NCODECS; i++)
            if (!strcmp(name, codecs[i])) { *out = (ferry_codec_id)i; return 0; }
        if (!strcmp(name, "deflate")) { *out = FERRY_CODEC_ZLIB; return 0; }
    }
    return ferry_seterr(FERRY_EINVAL, "unknown codec \"%s\" (none, zlib, gzip, zstd, lz4, blosc, shuffle, "
                        "crc32c, fletcher32, byteswap)", name ? name : "");
}

static const char *const directs[] = {
    [FERRY_DIRECT_AUTO] = "auto", [FERRY_DIRECT_ON] = "on", [FERRY_DIRECT_OFF] = "off",
};

const char *ferry_direct_name(ferry_direct d) { return (unsigned)d < 3 ? directs[d] : "auto"; }

int ferry_direct_parse(const char *name, ferry_direct *out) {
    if (name && out)
        for (unsigned i = 0; i < 3; i++)
            if (!strcasecmp(name, directs[i])) { *out = (ferry_direct)i; return 0; }
    return ferry_seterr(FERRY_EINVAL, "unknown O_DIRECT policy \"%s\" (auto, on, off)", name ? name : "");
}

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
