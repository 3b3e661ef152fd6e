/* dataset.h — what every format implements, and the dataset object they fill.
 * Internal. Formats are pure parsers: they read headers (through ferry_pread
 * into host memory), build metadata, and turn selections into plan extents;
 * they never move array data themselves. */
#ifndef FERRY_FORMATS_DATASET_H
#define FERRY_FORMATS_DATASET_H
#include "common.h"

typedef struct ferry_var {
    ferry_var_info info;   /* strings point into memory the dataset owns */
    void *fmt;             /* format-private per-variable state */
    const uint8_t *fill;   /* the fill element (host order; zeros past 16 bytes), NULL: none */
} ferry_var;

typedef struct ferry_format_ops {
    const char *name;      /* "npy", "safetensors", "netcdf3", "zarr", "hdf5" */
    /* 1 if path/head (first bytes of the file, n may be 0 for directories) is this format */
    int (*probe)(const char *path, const uint8_t *head, size_t n, int is_dir);
    /* Parse metadata; fill ds->vars, ds->nvars, attrs/dims/groups JSON. On
     * error return a negative code with ferry_seterr's message set; close is
     * still called to release whatever was allocated. */
    int (*open)(ferry_dataset *ds, const ferry_open_opts *opts);
    void (*close)(ferry_dataset *ds);
    int64_t (*plan_read)(ferry_dataset *ds, int var, const ferry_slice *sel,
                         ferry_buf dst, unsigned flags, ferry_plan *plan);
    /* FERRY_DT_STRING variables (NULL: the format has none): sel normalised,
     * *out zeroed; returns the count (ferry_dataset_read_strings) */
    int64_t (*read_strings)(ferry_dataset *ds, int var, const ferry_slice *sel, const ferry_run_opts *opts,
                            ferry_strings *out);
} ferry_format_ops;

struct ferry_dataset {
    ferry_ctx *ctx;
    const ferry_format_ops *ops;
    char *path;
    ferry_var *vars;
    int nvars;
    char *attrs_json;      /* NULL: "{}" */
    char *dims_json;       /* NULL: "{}" */
    char *groups_json;     /* NULL: "[]" */
    void *fmt;             /* format-private */
    ferry_store_info store;   /* filled by formats that have one (Zarr) */
    int *by_name;          /* open-addressing table of variable indices (-1 empty), built after open */
    size_t by_name_mask;   /* table size - 1 (a power of two, at least twice nvars) */
};

extern const ferry_format_ops ferry_format_npy;
extern const ferry_format_ops ferry_format_safetensors;
extern const ferry_format_ops ferry_format_netcdf3;
extern const ferry_format_ops ferry_format_zarr;
extern const ferry_format_ops ferry_format_hdf5;
extern const ferry_format_ops ferry_format_refs;
#endif
