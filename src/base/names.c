/* names.c — the one table of names for ferry's enums (dtypes, codecs, I/O
 * policies); the one size parser is size.c. The CLI, the Python extension and, through
 * it, the Python modules use these instead of tables of their own, so a name
 * means the same thing everywhere (issue 10 item 3). ferry_path_name/_parse
 * stay in config.c beside the path enum's other users. */
#include "common.h"
#include <ctype.h>
#include <strings.h>

/* One row per ferry_dtype: short (ferry info), long (numpy / torch attribute
 * name), safetensors (NULL where safetensors has none), typestr (what
 * ferry_var_info.typestr says for it: numpy's little-endian string, or the long
 * name for a type numpy lacks), bits per element (0: varies). Every format
 * reads its dtype names here: safetensors.c takes the safetensors column and
 * the bits, the Python package the whole table (_ferry.DTYPES). */
static const struct dtype_row {
    const char *name, *long_name, *st_name, *typestr;
    uint32_t bits;
} dtypes[] = {
    [FERRY_DT_UNKNOWN] = {"other", "other", NULL, NULL, 0},
    [FERRY_DT_BOOL] = {"b1", "bool", "BOOL", "|b1", 8},
    [FERRY_DT_I8] = {"i1", "int8", "I8", "|i1", 8},
    [FERRY_DT_U8] = {"u1", "uint8", "U8", "|u1", 8},
    [FERRY_DT_I16] = {"i2", "int16", "I16", "<i2", 16},
    [FERRY_DT_U16] = {"u2", "uint16", "U16", "<u2", 16},
    [FERRY_DT_I32] = {"i4", "int32", "I32", "<i4", 32},
    [FERRY_DT_U32] = {"u4", "uint32", "U32", "<u4", 32},
    [FERRY_DT_I64] = {"i8", "int64", "I64", "<i8", 64},
    [FERRY_DT_U64] = {"u8", "uint64", "U64", "<u8", 64},
    [FERRY_DT_F16] = {"f2", "float16", "F16", "<f2", 16},
    [FERRY_DT_BF16] = {"bf16", "bfloat16", "BF16", "bfloat16", 16},
    [FERRY_DT_F32] = {"f4", "float32", "F32", "<f4", 32},
    [FERRY_DT_F64] = {"f8", "float64", "F64", "<f8", 64},
    [FERRY_DT_C64] = {"c8", "complex64", "C64", "<c8", 64},
    [FERRY_DT_C128] = {"c16", "complex128", NULL, "<c16", 128},
    [FERRY_DT_F8_E4M3] = {"f8e4m3", "float8_e4m3fn", "F8_E4M3", "float8_e4m3fn", 8},
    [FERRY_DT_F8_E5M2] = {"f8e5m2", "float8_e5m2", "F8_E5M2", "float8_e5m2", 8},
    [FERRY_DT_F8_E4M3FNUZ] = {"f8e4m3fnuz", "float8_e4m3fnuz", "F8_E4M3FNUZ", "float8_e4m3fnuz", 8},
    [FERRY_DT_F8_E5M2FNUZ] = {"f8e5m2fnuz", "float8_e5m2fnuz", "F8_E5M2FNUZ", "float8_e5m2fnuz", 8},
    [FERRY_DT_F8_E8M0] = {"f8e8m0", "float8_e8m0fnu", "F8_E8M0", "float8_e8m0fnu", 8},
    /* long names as the bytes a dataset exposes them as: torch's packed pair,
     * and the packed float6 words (torch has no float6) */
    [FERRY_DT_F4_E2M1] = {"f4e2m1", "float4_e2m1fn_x2", "F4", "float4_e2m1fn_x2", 4},
    [FERRY_DT_F6_E2M3] = {"f6e2m3", "float6_e2m3fn_packed", "F6_E2M3", "float6_e2m3fn_packed", 6},
    [FERRY_DT_F6_E3M2] = {"f6e3m2", "float6_e3m2fn_packed", "F6_E3M2", "float6_e3m2fn_packed", 6},
    [FERRY_DT_DATETIME64] = {"M8", "datetime64", NULL, "<M8", 64},
    [FERRY_DT_TIMEDELTA64] = {"m8", "timedelta64", NULL, "<m8", 64},
    [FERRY_DT_CHAR] = {"S1", "char", NULL, "|S1", 8},
    [FERRY_DT_BYTES] = {"S", "bytes", NULL, NULL, 0},
    [FERRY_DT_OTHER] = {"other", "other", NULL, NULL, 0},
    [FERRY_DT_STRING] = {"str", "string", NULL, "|O", 0},   /* no parse: after OTHER */
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

static const char *row_name(const struct dtype_row *r, ferry_name_style style) {
    switch (style) {
    case FERRY_NAME_LONG: return r->long_name;
    case FERRY_NAME_SAFETENSORS: return r->st_name;
    case FERRY_NAME_TYPESTR: return r->typestr;
    default: return r->name;
    }
}

const char *ferry_dtype_name(ferry_dtype d, ferry_name_style style) {
    if ((unsigned)d >= NDTYPES) d = FERRY_DT_OTHER;
    return row_name(&dtypes[d], style);
}

/* style < 0: any style */
static int parse(const char *name, int style, ferry_dtype *out) {
    if (name && out)
        /* from BOOL: "other" is no type to parse into */
        for (unsigned d = FERRY_DT_BOOL; d < FERRY_DT_OTHER; d++)
            for (int st = FERRY_NAME_SHORT; st <= FERRY_NAME_TYPESTR; st++) {
                const char *n = row_name(&dtypes[d], (ferry_name_style)st);
                if ((style < 0 || style == st) && n && !strcmp(name, n)) {
                    *out = (ferry_dtype)d;
                    return 0;
                }
            }
    return ferry_seterr(FERRY_EINVAL, "unknown dtype \"%s\" (e.g. f4, float32, F32, <f4; bf16, bfloat16, BF16)",
                        name ? name : "");
}

int ferry_dtype_parse(const char *name, ferry_dtype *out) { return parse(name, -1, out); }

int ferry_dtype_parse_style(const char *name, ferry_name_style style, ferry_dtype *out) {
    if ((unsigned)style > FERRY_NAME_TYPESTR) return ferry_seterr(FERRY_EINVAL, "unknown dtype name style %d", (int)style);
    return parse(name, (int)style, out);
}

uint32_t ferry_dtype_bits(ferry_dtype d) { return (unsigned)d < NDTYPES ? dtypes[d].bits : 0; }

uint32_t ferry_dtype_itemsize(ferry_dtype d) {
    uint32_t b = ferry_dtype_bits(d);
    return b % 8 ? 0 : b / 8;
}

/* Codec names as plans, `ferry info` and Zarr/HDF5 metadata spell them;
 * "deflate" (HDF5's word) is accepted for zlib and never printed. */
static const char *const codecs[] = {
    [FERRY_CODEC_NONE] = "none", [FERRY_CODEC_ZLIB] = "zlib", [FERRY_CODEC_GZIP] = "gzip",
    [FERRY_CODEC_ZSTD] = "zstd", [FERRY_CODEC_LZ4] = "lz4", [FERRY_CODEC_BLOSC] = "blosc",
    [FERRY_CODEC_SHUFFLE] = "shuffle", [FERRY_CODEC_CRC32C] = "crc32c",
    [FERRY_CODEC_FLETCHER32] = "fletcher32", [FERRY_CODEC_BYTESWAP] = "byteswap",
    [FERRY_CODEC_H5LZ4] = "h5lz4", [FERRY_CODEC_BITSHUFFLE] = "bitshuffle",
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
                        "crc32c, fletcher32, byteswap, h5lz4, bitshuffle)", name ? name : "");
}

/* HDF5's registered filter ids (H5Zpublic.h; 32001 and 32015 from the HDF
 * Group's registry of third-party filters) */
int ferry_codec_of_hdf5_filter(uint32_t filter_id, const uint32_t *cd_values, size_t ncd, uint32_t itemsize,
                               ferry_codec *out) {
    static const struct { uint32_t filter; ferry_codec_id codec; } h5[] = {
        {1, FERRY_CODEC_ZLIB}, {2, FERRY_CODEC_SHUFFLE}, {3, FERRY_CODEC_FLETCHER32},
        {32001, FERRY_CODEC_BLOSC}, {32015, FERRY_CODEC_ZSTD},
    };
    if (!out) return ferry_seterr(FERRY_EINVAL, "ferry_codec_of_hdf5_filter: out is NULL");
    for (size_t i = 0; i < sizeof h5 / sizeof h5[0]; i++)
        if (h5[i].filter == filter_id) {
            out->id = h5[i].codec;
            /* shuffle's element size: HDF5 stores it in cd_values[0] (H5Z_shuffle's set_local) */
            out->param = h5[i].codec == FERRY_CODEC_SHUFFLE ? (ncd && cd_values ? cd_values[0] : itemsize) : 0;
            return 0;
        }
    return ferry_seterr(FERRY_EUNSUPPORTED, "HDF5 filter %u: no ferry codec for it", filter_id);
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

static const char *const decode_names[3] = {"auto", "gpu", "cpu"};

const char *ferry_decode_policy_name(ferry_decode_policy d) { return (d >= 0 && d <= FERRY_DECODE_CPU) ? decode_names[d] : "?"; }

int ferry_decode_policy_parse(const char *name, ferry_decode_policy *out) {
    for (int i = 0; i < 3; i++)
        if (name && strcasecmp(name, decode_names[i]) == 0) { *out = (ferry_decode_policy)i; return 0; }
    return ferry_seterr(FERRY_EINVAL, "unknown decode policy \"%s\" (auto, gpu, cpu)", name ? name : "");
}
