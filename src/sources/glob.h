/* glob.h — URL globs over listable objects (ferry_url_glob's body).
 * Internal. */
#ifndef FERRY_SOURCES_GLOB_H
#define FERRY_SOURCES_GLOB_H
#include <stddef.h>
#include "sources/ropts.h"
/* As ferry_url_glob (ferry_experimental.h), with the options o (may be NULL). */
int ferry_remote_glob(const char *pattern, const ferry_remote_opts *o, char **urls, size_t *n);
#endif
