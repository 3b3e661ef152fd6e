/* inside.h — the one rule that keeps a multi-file format inside the directory
 * the user opened. Internal; shared by Zarr stores and safetensors shard
 * indexes (and any format whose metadata names other files).
 *
 * A file named by metadata is read only when its real path (realpath(3): every
 * symlink on the way resolved) lies under the real path of the directory the
 * user opened. A symlink that stays inside keeps working; one that leads out is
 * refused with one message for every format:
 *     "<path>: resolves to <real>, outside the <what> <root> (a symlink leading
 *      out is refused)"
 * The check and the open are two steps: a directory rewritten between them is
 * outside this promise (the engine's O_NOFOLLOW opens narrow it for chunks). */
#ifndef FERRY_FORMATS_INSIDE_H
#define FERRY_FORMATS_INSIDE_H

/* 1: path resolves under root (root itself a realpath, e.g. from realpath(3));
 * 0: path does not exist (nothing to read: the caller's open reports it);
 * a negative code (-EACCES, message set) when it resolves outside root, or
 * -errno (message set) when it cannot be resolved. what names the container
 * in the message ("store", "directory"). */
int ferry_path_inside(const char *root, const char *path, const char *what);

#endif
