/* mapread.h — small records copied out of a read-only mapping of their file
 * instead of one pread each. Internal; a leaf over file.h. */
#ifndef FERRY_ENGINE_MAPREAD_H
#define FERRY_ENGINE_MAPREAD_H
#include "common.h"

/* Copy len bytes at offset off of file f into dst from f's mapping (made on
 * first use: the whole file, read-only, shared with the page cache). Returns
 * 1 when it did; 0 when the mapping cannot serve them — the file is not
 * mappable (opened for writing, not a regular file, mmap refused), the range
 * lies beyond the size it had when mapped, or a copy from it faulted
 * (SIGBUS: the file was truncated under the mapping, or the disk failed; the
 * mapping is then no longer used for this file). The caller then preads,
 * which reports what happened with the file's name and byte. */
int ferry_map_read(ferry_file *f, void *dst, uint64_t off, uint64_t len);
/* Unmap f's mapping, if it has one (ferry_file_close). */
void ferry_map_release(ferry_file *f);
#endif
