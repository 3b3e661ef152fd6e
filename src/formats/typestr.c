/* typestr.c — numpy type strings ("<f4", "|b1", ">M8[ns]", "|S10", "<U3"),
 * as npy headers and Zarr v2 metadata store them. */
#include "formats/typestr.h"

int ferry_typestr_parse(const char *t, size_t len, ferry_dtype *dt, uint32_t *itemsize, uint32_t *swap) {
    if (len < 3) return -1;
    char order = t[0], kind = t[1];
    if (order != '<' && order != '>' && order != '|') return -1;
    size_t i = 2;
    uint64_t size = 0;
    while (i < len && t[i] >= '0' && t[i] <= '9') {
        size = size * 10 + (uint64_t)(t[i] - '0');
        if (size > (1u << 30)) return -1;
        i++;
    }
    if (i == 2 || size == 0) return -1;
    int rest = i < len;   /* only datetime units may follow */
    *itemsize = (uint32_t)size;
    *swap = 0;
    uint32_t elem = (uint32_t)size;
    switch (kind) {
    case 'b': if (size != 1) return -1; *dt = FERRY_DT_BOOL; break;
    case 'i': *dt = size == 1 ? FERRY_DT_I8 : size == 2 ? FERRY_DT_I16 : size == 4 ? FERRY_DT_I32 : size == 8 ? FERRY_DT_I64 : FERRY_DT_UNKNOWN; break;
    case 'u': *dt = size == 1 ? FERRY_DT_U8 : size == 2 ? FERRY_DT_U16 : size == 4 ? FERRY_DT_U32 : size == 8 ? FERRY_DT_U64 : FERRY_DT_UNKNOWN; break;
    case 'f': *dt = size == 2 ? FERRY_DT_F16 : size == 4 ? FERRY_DT_F32 : size == 8 ? FERRY_DT_F64 : size == 12 || size == 16 ? FERRY_DT_OTHER : FERRY_DT_UNKNOWN; break;
    case 'c': *dt = size == 8 ? FERRY_DT_C64 : size == 16 ? FERRY_DT_C128 : size == 24 || size == 32 ? FERRY_DT_OTHER : FERRY_DT_UNKNOWN;
              elem = (uint32_t)size / 2; break;
    case 'M': case 'm':
        if (size != 8) return -1;
        *dt = kind == 'M' ? FERRY_DT_DATETIME64 : FERRY_DT_TIMEDELTA64;
        if (rest) {   /* "[ns]", "[s]", "[10ms]", "[generic]": an optional multiplier, then a unit numpy knows */
            if (t[i] != '[' || t[len - 1] != ']' || len - i < 3) return -1;
            size_t k = i + 1;
            uint64_t mult = 0;
            while (k < len - 1 && t[k] >= '0' && t[k] <= '9' && mult < (1u << 30)) mult = mult * 10 + (uint64_t)(t[k++] - '0');
            if (k > i + 1 && (mult == 0 || mult >= (1u << 30) || t[i + 1] == '0')) return -1;
            static const char *const units[] = {"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "\xce\xbcs",
                                                "ns", "ps", "fs", "as", "generic"};
            size_t ul = len - 1 - k;
            int known = 0;
            for (size_t u = 0; u < sizeof units / sizeof *units && !known; u++)
                known = strlen(units[u]) == ul && !memcmp(units[u], t + k, ul);
            if (!known || (k > i + 1 && ul == 7)) return -1;   /* numpy has no "[2generic]" */
            rest = 0;
        }
        break;
    case 'S': *dt = size == 1 ? FERRY_DT_CHAR : FERRY_DT_BYTES; elem = 1; break;
    case 'V': *dt = FERRY_DT_BYTES; elem = 1; break;
    case 'U': if (size > (1u << 28)) return -1; *itemsize = (uint32_t)size * 4; *dt = FERRY_DT_OTHER; elem = 4; break;
    default: return -1;
    }
    if (rest || *dt == FERRY_DT_UNKNOWN) return -1;
    if (order == '>' && elem > 1) {
        if (elem != 2 && elem != 4 && elem != 8 && elem != 16) return -2;   /* no byteswap for it */
        *swap = elem;
    }
    return 0;
}
