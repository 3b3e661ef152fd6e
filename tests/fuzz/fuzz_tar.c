/* fuzz_tar.c — the WebDataset tar indexer (src/formats/tar.c) on bytes in
 * memory: any input gives an index whose every member lies inside the input,
 * or a negative code with a message. */
#include "fuzz.h"
#include "formats/shards.h"

static int fuzz_tar(const uint8_t *data, size_t size) {
    ferry_shards *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->ctx = ferry_fuzz_ctx();
    s->format = "tar";
    int rc = ferry_tar_index_mem(s, "fuzz.tar", data, size);
    if (rc < 0 && !ferry_lasterr()[0]) abort();
    if (rc == 0) {
        for (int64_t i = 0; i < ferry_shards_count(s); i++) {
            ferry_sample_info si;
            if (ferry_shards_sample(s, i, &si) < 0 || si.nmembers < 1) abort();
            (void)strlen(si.key);
            for (int m = 0; m < si.nmembers; m++) {
                ferry_member_info mi;
                if (ferry_shards_member(s, i, m, &mi) < 0) abort();
                if (mi.offset > size || mi.size > size - mi.offset) abort();
                if (ferry_shards_find(s, i, mi.name) != m) abort();
            }
        }
    }
    ferry_shards_close(s);
    return 0;
}
FERRY_FUZZ_TARGET(tar, fuzz_tar)
