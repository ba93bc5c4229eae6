#include "input_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *dt_input_kind(unsigned st_mode) {
    if (S_ISDIR(st_mode)) return "a directory";
    if (S_ISFIFO(st_mode)) return "a FIFO";
    if (S_ISCHR(st_mode)) return "a character device";
    if (S_ISBLK(st_mode)) return "a block device";
    if (S_ISSOCK(st_mode)) return "a socket";
    return "not a plain file";
}

/* The descriptor, or -1 with errno set and, for a file that is not regular, *mode its type. */
static int open_regular(const char *path, unsigned *mode) {
    *mode = 0;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return -1;
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) { /* the type bits make *mode nonzero */
        *mode = (unsigned)st.st_mode;
        close(f);
        errno = EINVAL;
        return -1;
    }
    /* blocking again: reads of a regular file never wait anyway, but a filesystem that
     * honours the flag (FUSE) could answer EAGAIN, which the readers treat as an error */
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0) fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    return f;
}

int dt_input_open_quiet(const char *path) {
    unsigned mode;
    return path && *path ? open_regular(path, &mode) : (errno = ENOENT, -1);
}

dt_status dt_input_open(const char *path, const char *what, int *fd) {
    *fd = -1;
    const char *sep = what ? ": " : "";
    if (!what) what = "";
    if (!path || !*path) return dt_fail(DT_EINPUT, "%s%scannot open '': empty path", what, sep);
    unsigned mode;
    int f = open_regular(path, &mode);
    if (f < 0 && mode)
        return dt_fail(DT_EINPUT, "%s%s'%s' is not a regular file (%s)", what, sep, path, dt_input_kind(mode));
    if (f < 0) return dt_fail(DT_EINPUT, "%s%scannot open '%s': %s", what, sep, path, strerror(errno));
    *fd = f;
    return DT_OK;
}

dt_status dt_input_fopen(const char *path, const char *what, FILE **fp) {
    *fp = NULL;
    int fd;
    DT_TRY(dt_input_open(path, what, &fd));
    *fp = fdopen(fd, "rb");
    if (!*fp) {
        int e = errno;
        close(fd);
        return dt_fail(DT_ERUNTIME, "%s%scannot open '%s': %s", what ? what : "", what ? ": " : "", path, strerror(e));
    }
    return DT_OK;
}

dt_status dt_input_read(const char *path, const char *what, char **out, size_t *len, size_t max_len) {
    *out = NULL;
    if (len) *len = 0;
    FILE *fp;
    DT_TRY(dt_input_fopen(path, what, &fp));
    const char *sep = what ? ": " : "";
    if (!what) what = "";
    /* chunks rather than st_size: the file may grow while it is read (a live metrics file) */
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    dt_status s = DT_OK;
    if (!buf) {
        s = dt_fail(DT_ERUNTIME, "%s%scannot read '%s': out of memory", what, sep, path);
        goto done;
    }
    for (;;) {
        if (n + 1 >= cap) { /* always keep room for the NUL */
            char *nb = cap > (size_t)-1 / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                s = dt_fail(DT_ERUNTIME, "%s%scannot read '%s': out of memory", what, sep, path);
                goto done;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, fp);
        n += r;
        if (n > max_len) {
            s = dt_fail(DT_EINPUT, "%s%s'%s' is larger than the limit of %zu bytes", what, sep, path, max_len);
            goto done;
        }
        if (r == 0) {
            if (ferror(fp)) s = dt_fail(DT_ERUNTIME, "%s%scannot read '%s': %s", what, sep, path, strerror(errno));
            break;
        }
    }
done:
    fclose(fp);
    if (s != DT_OK) {
        free(buf);
        return s;
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return DT_OK;
}
