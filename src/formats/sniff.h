/* sniff.h — what a file's first bytes say it is, for error messages.
 * Internal; a leaf: it needs only common.h.
 *
 * A reader that fails on a file of another kind (a torch.save archive named
 * .safetensors, an HDF5 file named .npy, gzip, Parquet, text) says so, with
 * what reads it, instead of its own complaint about a field ("header length
 * 578712552184433488"). dataset.c calls it on every reader's error path. */
#ifndef FERRY_FORMATS_SNIFF_H
#define FERRY_FORMATS_SNIFF_H
#include "common.h"

typedef struct ferry_sniffed {
    const char *format;   /* ferry's name when it is one of ferry's formats ("npy", "safetensors",
                             "netcdf3", "hdf5"; "json": JSON text, which a safetensors
                             index is), else NULL */
    const char *what;     /* "a torch.save zip archive", "plain text", ... */
    const char *todo;     /* what reads it: "read it with torch.load" */
} ferry_sniffed;

/* 1 and *out filled when head (the file's first n bytes) is recognised, else 0. */
int ferry_sniff(const uint8_t *head, size_t n, ferry_sniffed *out);
#endif
