/* error.c — status names and the per-thread error message behind ferry_errmsg.
 * Messages are thread-local so that concurrent callers on one context never
 * see each other's errors (SQLite keeps one per connection; ferry's callers are
 * threads sharing one engine, so one per thread is the right unit). */
#include "common.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define ERRMSG_MAX 1024
static _Thread_local char errmsg_[ERRMSG_MAX];

const char *ferry_version(void) { return FERRY_VERSION_STRING; }

const char *ferry_lasterr(void) { return errmsg_; }
void ferry_clearerr(void) { errmsg_[0] = 0; }

int ferry_seterr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg_, sizeof errmsg_, fmt, ap);
    va_end(ap);
    return code;
}

int ferry_preerr(int code, const char *fmt, ...) {
    char prefix[384], old[ERRMSG_MAX - 400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%.600s", errmsg_);
    if (old[0])
        snprintf(errmsg_, sizeof errmsg_, "%s: %s", prefix, old);
    else
        snprintf(errmsg_, sizeof errmsg_, "%s: %s", prefix, ferry_strerror(code));
    return code;
}

const char *ferry_errmsg(const ferry_ctx *ctx) { (void)ctx; return errmsg_; }

const char *ferry_strerror(int code) {
    switch (code) {
    case FERRY_OK: return "success";
    case FERRY_EINVAL: return "invalid argument";
    case FERRY_ENOMEM: return "out of memory";
    case FERRY_EIO: return "I/O error";
    case FERRY_ESHORT: return "file ends before the requested data";
    case FERRY_EFORMAT: return "malformed file";
    case FERRY_EUNSUPPORTED: return "unsupported feature";
    case FERRY_ENOCUDA: return "CUDA driver not available";
    case FERRY_ECUDA: return "CUDA driver call failed";
    case FERRY_ENOCUFILE: return "cuFile (GPUDirect Storage) not available";
    case FERRY_ECUFILE: return "cuFile call failed";
    case FERRY_ECODEC: return "corrupt compressed data";
    case FERRY_ECHECKSUM: return "checksum mismatch";
    case FERRY_ENOTFOUND: return "not found";
    case FERRY_ETIMEDOUT: return "timed out";
    case FERRY_ECANCELED: return "canceled";
    case FERRY_EPATH: return "the requested path cannot serve this request";
    case FERRY_ENOFORMAT: return "not a file or store of a known format";
    default:
        if (code < 0 && code > -4096) return strerror(-code);
        return "unknown error";
    }
}
