/* netcdf.c — placeholder until the parser lands: recognises nothing. */
#include "formats/dataset.h"
static int probe(const char *path, const uint8_t *head, size_t n, int is_dir) { return 0; }
static int open_(ferry_dataset *ds, const ferry_open_opts *o) {
    return ferry_seterr(FERRY_EUNSUPPORTED, "%s: netcdf3 is not supported yet", ds->path);
}
static void close_(ferry_dataset *ds) {}
static int64_t plan(ferry_dataset *ds, int v, const ferry_slice *s, ferry_buf d, unsigned f, ferry_plan *p) {
    return FERRY_EUNSUPPORTED;
}
const ferry_format_ops ferry_format_netcdf3 = {"netcdf3", probe, open_, close_, plan};
