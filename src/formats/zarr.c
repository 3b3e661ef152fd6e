/* zarr.c — placeholder until the Zarr parser lands: recognises nothing. */
#include "formats/dataset.h"
static int zarr_probe(const char *path, const uint8_t *head, size_t n, int is_dir) { return 0; }
static int zarr_open(ferry_dataset *ds, const ferry_open_opts *o) {
    return ferry_seterr(FERRY_EUNSUPPORTED, "%s: zarr is not supported yet", ds->path);
}
static void zarr_close(ferry_dataset *ds) {}
static int64_t zarr_plan(ferry_dataset *ds, int v, const ferry_slice *s, ferry_buf d, unsigned f, ferry_plan *p) {
    return FERRY_EUNSUPPORTED;
}
const ferry_format_ops ferry_format_zarr = {"zarr", zarr_probe, zarr_open, zarr_close, zarr_plan};
