/* response.h — what ferry reads of an HTTP response: the status line,
 * Content-Range, Content-Length, ETag and Last-Modified, and the message
 * of an error body. Pure functions over bytes a server sent (hostile until
 * checked; fuzzed by tests/fuzz/fuzz_url.c). Internal; a leaf. */
#ifndef FERRY_SOURCES_RESPONSE_H
#define FERRY_SOURCES_RESPONSE_H
#include <stddef.h>
#include <stdint.h>

typedef struct ferry_http_resp {
    long status;
    int have_crange;           /* 1: "bytes START-END/TOTAL"; 2: "bytes * /TOTAL" (416) */
    uint64_t cr_start, cr_end, cr_total;
    int have_clen;
    uint64_t clen;
    char etag[200];            /* as sent, quotes included; "" if none */
    char lastmod[64];
} ferry_http_resp;

/* Take one header line (n bytes, CRLF included or not). A status line
 * ("HTTP/...") starts a new response: everything is cleared, and 1 is
 * returned; else 0. Malformed values are ignored (the field stays unset). */
int ferry_http_resp_line(ferry_http_resp *r, const char *line, size_t n);
/* "Code: Message" of an S3-style XML error body, else its first printable
 * bytes (at most 200), into out. */
void ferry_http_server_message(const char *body, size_t n, char *out, size_t cap);
/* "Not Found" for 404 ...; "" for a status without a name here. */
const char *ferry_http_reason(long status);
#endif
