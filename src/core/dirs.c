#include "dirs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Makes dir's components; errors name `named` (the path the user gave). */
static dt_status make_dirs(const char *dir, const char *named, const char *what) {
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0) return DT_OK;
    if (n >= sizeof p) return dt_fail(DT_EINPUT, "%s '%s': path too long", what, named);
    memcpy(p, dir, n + 1);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    /* each prefix ending before a '/', then the whole path */
    for (size_t i = 1; i <= n; i++) {
        if (i < n && p[i] != '/') continue;
        char keep = p[i];
        p[i] = 0;
        struct stat sb;
        if (stat(p, &sb) != 0) {
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                p[i] = keep;
                return dt_fail(DT_EINPUT, "%s '%s': cannot create '%.*s' (%s)", what, named, (int)i, p, strerror(e));
            }
        } else if (!S_ISDIR(sb.st_mode)) {
            p[i] = keep;
            return dt_fail(DT_EINPUT, "%s '%s': '%.*s' is not a directory", what, named, (int)i, p);
        }
        p[i] = keep;
    }
    return DT_OK;
}

dt_status dt_make_dirs(const char *dir, const char *what) { return make_dirs(dir, dir, what); }

dt_status dt_make_parent_dirs(const char *file, const char *what) {
    const char *slash = strrchr(file, '/');
    if (!slash || slash == file) return DT_OK;
    char d[4096];
    size_t n = (size_t)(slash - file);
    if (n >= sizeof d) return dt_fail(DT_EINPUT, "%s '%s': path too long", what, file);
    memcpy(d, file, n);
    d[n] = 0;
    return make_dirs(d, file, what);
}
