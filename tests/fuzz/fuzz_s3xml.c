/* fuzz_s3xml.c — what ferry reads of an S3 upload's XML answers
 * (ferry_s3_xml_text: UploadId, Code): the text found must fit its buffer,
 * be NUL-terminated, and be no longer than the body; a buffer of one byte
 * never holds text. */
#include "fuzz.h"
#include "sources/upload.h"

static int fuzz_s3xml(const uint8_t *data, size_t size) {
    static const char *tags[] = {"UploadId", "Code", "ETag", "Message"};
    char *body = malloc(size ? size : 1);   /* no NUL after the body: reads past it show under ASan */
    if (!body) return 0;
    memcpy(body, data, size);
    for (size_t t = 0; t < sizeof tags / sizeof *tags; t++) {
        char out[64];
        memset(out, 'x', sizeof out);
        if (ferry_s3_xml_text(body, size, tags[t], out, sizeof out)) {
            size_t k = strnlen(out, sizeof out);
            if (k >= sizeof out || k > size) abort();
        }
        char one[1];
        if (ferry_s3_xml_text(body, size, tags[t], one, 1) && one[0]) abort();
    }
    free(body);
    return 0;
}
FERRY_FUZZ_TARGET(s3xml, fuzz_s3xml)
