#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "input_file.h"

/* Directory part of path ("." when there is none), for the directory fsync. */
static dt_status dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, cap, ".");
        return DT_OK;
    }
    size_t n = (size_t)(slash - path);
    if (n == 0) n = 1; /* "/file" lives in "/" */
    if (n >= cap) return dt_fail(DT_EINPUT, "%s: path too long", path);
    memcpy(dir, path, n);
    dir[n] = 0;
    return DT_OK;
}

dt_status dt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return dt_fail(DT_ERUNTIME, "cannot open directory %s for fsync: %s", dir, strerror(errno));
    /* Some filesystems cannot fsync a directory (EINVAL); nothing more can be done there. */
    if (fsync(fd) != 0 && errno != EINVAL) {
        int e = errno;
        close(fd);
        return dt_fail(DT_ERUNTIME, "cannot fsync directory %s: %s", dir, strerror(e));
    }
    close(fd);
    return DT_OK;
}

dt_status dt_atomic_open(dt_atomic_file *f, const char *path) {
    f->fd = -1;
    f->tmp_path[0] = 0;
    f->final_path[0] = 0;
    size_t len = strlen(path);
    if (len == 0) return dt_fail(DT_EINPUT, "cannot write file: empty path");
    if (len >= sizeof f->final_path) return dt_fail(DT_EINPUT, "%.64s...: path too long", path);
    if (path[len - 1] == '/') return dt_fail(DT_EINPUT, "%s: is a directory path, not a file", path);
    memcpy(f->final_path, path, len + 1);
    char tmp[sizeof f->tmp_path];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());

    /* O_EXCL keeps us from writing through a symlink planted at the temp name. An existing
     * file of this name is a leftover from a crashed process with the same pid (common in
     * containers), so it is removed and the create retried once. */
    int fd = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST || attempt == 1) break;
        if (unlink(tmp) != 0 && errno != ENOENT) break;
    }
    if (fd < 0) return dt_fail(DT_ERUNTIME, "cannot create %s: %s", tmp, strerror(errno));
    f->fd = fd;
    memcpy(f->tmp_path, tmp, sizeof tmp);
    return DT_OK;
}

dt_status dt_atomic_write(dt_atomic_file *f, const void *buf, size_t n) {
    if (!f->tmp_path[0]) return dt_fail(DT_ERUNTIME, "write to %s: file is not open", f->final_path);
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dt_fail(DT_ERUNTIME, "cannot write %s: %s", f->tmp_path, strerror(errno));
        }
        if (w == 0) /* should not happen for regular files; avoid spinning forever */
            return dt_fail(DT_ERUNTIME, "cannot write %s: write returned 0", f->tmp_path);
        p += w;
        n -= (size_t)w;
    }
    return DT_OK;
}

dt_status dt_atomic_pwrite(dt_atomic_file *f, const void *buf, size_t n, unsigned long long off) {
    if (!f->tmp_path[0]) return dt_fail(DT_ERUNTIME, "write to %s: file is not open", f->final_path);
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(f->fd, p, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dt_fail(DT_ERUNTIME, "cannot write %s: %s", f->tmp_path, strerror(errno));
        }
        if (w == 0) return dt_fail(DT_ERUNTIME, "cannot write %s: write returned 0", f->tmp_path);
        p += w;
        n -= (size_t)w;
        off += (unsigned long long)w;
    }
    return DT_OK;
}

void dt_atomic_abort(dt_atomic_file *f) {
    if (!f->tmp_path[0]) return;
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp_path);
    f->fd = -1;
    f->tmp_path[0] = 0;
}

dt_status dt_atomic_commit(dt_atomic_file *f) {
    if (!f->tmp_path[0]) return dt_fail(DT_ERUNTIME, "commit %s: file is not open", f->final_path);
    /* The data must be on disk before the rename makes it visible, or a crash could leave
     * a complete-looking but empty/partial file under the final name. */
    if (fsync(f->fd) != 0) {
        dt_status s = dt_fail(DT_ERUNTIME, "cannot fsync %s: %s", f->tmp_path, strerror(errno));
        dt_atomic_abort(f);
        return s;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        dt_status s = dt_fail(DT_ERUNTIME, "cannot close %s: %s", f->tmp_path, strerror(errno));
        dt_atomic_abort(f);
        return s;
    }
    if (rename(f->tmp_path, f->final_path) != 0) {
        dt_status s = dt_fail(DT_ERUNTIME, "cannot rename %s to %s: %s", f->tmp_path, f->final_path,
                              strerror(errno));
        dt_atomic_abort(f);
        return s;
    }
    f->tmp_path[0] = 0; /* committed: abort is now a no-op */
    char dir[sizeof f->final_path];
    DT_TRY(dir_of(f->final_path, dir, sizeof dir));
    return dt_fsync_dir(dir);
}

dt_status dt_write_file_atomic(const char *path, const void *buf, size_t n) {
    dt_atomic_file f;
    DT_TRY(dt_atomic_open(&f, path));
    dt_status s = dt_atomic_write(&f, buf, n);
    if (s == DT_OK) return dt_atomic_commit(&f);
    dt_atomic_abort(&f);
    return s;
}

dt_status dt_read_file(const char *path, char **out, size_t *len, size_t max_len) {
    return dt_input_read(path, NULL, out, len, max_len);
}
