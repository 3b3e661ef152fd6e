/* inside.c — the one rule that keeps multi-file formats inside the opened
 * directory (see inside.h). */
#include "common.h"
#include "formats/inside.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ferry_path_inside(const char *root, const char *path, const char *what) {
    char *r = realpath(path, NULL);
    if (!r) {
        if (errno == ENOENT || errno == ENOTDIR) return 0;
        return ferry_seterr(-errno, "%s: %s", path, strerror(errno));
    }
    size_t rl = strlen(root);
    /* under root: root itself, or root followed by a '/' (the root "/" holds everything) */
    int ok = !strncmp(r, root, rl) && (r[rl] == 0 || r[rl] == '/' || (rl == 1 && root[0] == '/'));
    int rc = ok ? 1 : ferry_seterr(-EACCES, "%s: resolves to %s, outside the %s %s (a symlink leading out is refused)",
                                   path, r, what, root);
    free(r);
    return rc;
}
