/* sniff.c — what a file's first bytes say it is (sniff.h). Magic numbers
 * from each format's own specification; a zip archive is told apart by the
 * name of its first member (torch.save writes "<stem>/data.pkl" or
 * "<stem>/byteorder" first, numpy's savez "<name>.npy"). */
#include "formats/sniff.h"

static int starts(const uint8_t *h, size_t n, const void *magic, size_t m) {
    return n >= m && !memcmp(h, magic, m);
}

/* Printable ASCII, tabs and line ends, and well-formed UTF-8 (a sequence cut
 * by the end of the head counts as well-formed). */
static int is_text(const uint8_t *h, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = h[i];
        if (c < 0x80) {
            if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f') return 0;
            if (c == 0x7f) return 0;
            i++;
            continue;
        }
        size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!len || c == 0xc0 || c == 0xc1 || c > 0xf4) return 0;
        for (size_t k = 1; k < len && i + k < n; k++)
            if ((h[i + k] & 0xc0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

static int has_suffix(const uint8_t *s, size_t n, const char *suf) {
    size_t m = strlen(suf);
    return n >= m && !memcmp(s + n - m, suf, m);
}

static int set(ferry_sniffed *o, const char *format, const char *what, const char *todo) {
    o->format = format;
    o->what = what;
    o->todo = todo;
    return 1;
}

int ferry_sniff(const uint8_t *h, size_t n, ferry_sniffed *o) {
    static const uint8_t hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    static const uint8_t npy[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    static const uint8_t gz[2] = {0x1f, 0x8b}, zst[4] = {0x28, 0xb5, 0x2f, 0xfd};
    static const uint8_t xz[6] = {0xfd, '7', 'z', 'X', 'Z', 0};
    memset(o, 0, sizeof *o);
    if (starts(h, n, "PK\3\4", 4)) {
        /* local file header: name length at 26, the name at 30 */
        size_t nl = n >= 30 ? (size_t)(h[26] | h[27] << 8) : 0;
        const uint8_t *name = h + 30;
        if (nl > n - 30) nl = n >= 30 ? n - 30 : 0;
        if (has_suffix(name, nl, "/data.pkl") || has_suffix(name, nl, "/byteorder") ||
            has_suffix(name, nl, "/version") || has_suffix(name, nl, "/.format_version"))
            return set(o, NULL, "a torch.save zip archive",
                       "read it with torch.load (ferry.checkpoint reads safetensors and DCP checkpoints)");
        if (has_suffix(name, nl, ".npy"))
            return set(o, NULL, "an .npz archive (numpy's zip of .npy files)",
                       "read a member with ferry.read(path, name), or np.load");
        return set(o, NULL, "a zip archive", "unpack it, then read its files");
    }
    if (starts(h, n, hdf5, 8))
        return set(o, "hdf5", "an HDF5 / netCDF-4 file",
                   "read it with xr.open_dataset(path, engine=\"ferry\") or ferry.open in Python");
    if (starts(h, n, npy, 6)) return set(o, "npy", "an npy file", "open it as npy (or without a format)");
    if (starts(h, n, "CDF", 3) && n >= 4 && (h[3] == 1 || h[3] == 2 || h[3] == 5))
        return set(o, "netcdf3", "a netCDF classic file", "open it as netcdf3 (or without a format)");
    if (starts(h, n, "PAR1", 4))
        return set(o, NULL, "a Parquet file", "read it with pyarrow or pandas: ferry reads arrays, not tables");
    if (starts(h, n, gz, 2)) return set(o, NULL, "gzip-compressed data", "decompress it (gunzip), then read the file");
    if (starts(h, n, zst, 4)) return set(o, NULL, "zstd-compressed data", "decompress it (unzstd), then read the file");
    if (starts(h, n, xz, 6)) return set(o, NULL, "xz-compressed data", "decompress it (unxz), then read the file");
    if (starts(h, n, "BZh", 3) && n >= 4 && h[3] >= '1' && h[3] <= '9')
        return set(o, NULL, "bzip2-compressed data", "decompress it (bunzip2), then read the file");
    if (n >= 2 && h[0] == 0x80 && h[1] >= 2 && h[1] <= 5)
        return set(o, NULL, "a Python pickle (torch.save's legacy format among others)",
                   "read it with torch.load or pickle, trusting its source");
    if (n >= 9 && h[8] == '{' && (h[4] | h[5] | h[6] | h[7]) == 0 && (h[0] | h[1] << 8) != 0)
        return set(o, "safetensors", "a safetensors file", "open it as safetensors (or without a format)");
    /* text: only from 16 bytes on (a file cut short inside a magic number
     * is that format's damage, not text) */
    if (n >= 16 && starts(h, n, "{", 1) && is_text(h, n))
        return set(o, "json", "JSON text", "a Zarr store is the directory holding its zarr.json or .zarray");
    if (n >= 16 && is_text(h, n)) return set(o, NULL, "plain text", "this is not an array file: check the path");
    return 0;
}
