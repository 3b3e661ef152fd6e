/* upload.h — what s3_upload.c decides without the network, so tests and the
 * fuzzer reach it: how an object is cut into parts, and what an S3 XML
 * answer says. Internal. */
#ifndef FERRY_SOURCES_UPLOAD_H
#define FERRY_SOURCES_UPLOAD_H
#include <stddef.h>
#include <stdint.h>

#define FERRY_S3_MIN_PART (5ull << 20)        /* S3: every part but the last, at least */
#define FERRY_S3_MAX_PART (5ull << 30)        /* S3: one part, or one PUT, at most */
#define FERRY_S3_MAX_PARTS 10000ull
#define FERRY_S3_MAX_OBJECT (5ull << 40)

/* The parts of an object of n bytes: *part bytes each (the last one the
 * rest), *nparts of them; *nparts 0 when n fits one PUT (n <= want). want:
 * the part size asked for (FERRY_REMOTE_PART_SIZE), grown by whole MiB where
 * 10,000 parts would not cover n. 0, or FERRY_EINVAL past S3's 5 TiB. */
int ferry_upload_parts(uint64_t n, uint64_t want, uint64_t *part, uint64_t *nparts);

/* The text of the first <tag>...</tag> of an S3 XML body (n bytes, hostile:
 * bounded, not NUL-terminated) into out, entities &amp; &lt; &gt; &quot;
 * &apos; decoded. 1 found, 0 not (or longer than cap - 1). */
int ferry_s3_xml_text(const char *body, size_t n, const char *tag, char *out, size_t cap);
/* Validate FERRY_REMOTE_PART_SIZE (engine/config.c calls it at
 * ferry_ctx_create, beside ferry_remote_check_env). 0 or FERRY_EINVAL naming it. */
int ferry_upload_check_env(void);
#endif
