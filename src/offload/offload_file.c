#include "offload_file.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* O_DIRECT's alignment: statx reports it where the kernel knows (6.1+: the larger of the
 * offset and the memory alignment, so one number serves file offsets, lengths and
 * addresses inside a buffer); else the logical block size of the device under the file;
 * else 4096, which every device divides. */
static void read_alignment(dt_offload_file *f) {
    size_t align = 0;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(f->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_offset_align) {
        align = sx.stx_dio_offset_align;
        if (sx.stx_dio_mem_align > align) align = sx.stx_dio_mem_align;
    }
#endif
    struct stat st;
    if (!align && fstat(f->fd, &st) == 0) {
        char dev[64];
        snprintf(dev, sizeof dev, "/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
        int bfd = open(dev, O_RDONLY | O_CLOEXEC);
        int sz = 0;
        if (bfd >= 0 && ioctl(bfd, BLKSSZGET, &sz) == 0 && sz > 0) align = (size_t)sz;
        if (bfd >= 0) close(bfd);
    }
    if (!align || (align & (align - 1))) align = 4096; /* not a power of two: not a value to trust */
    f->align = align;
}

/* Creates the file, or opens one already there (never truncating: another process may
 * hold it); 1 when created, 0 when opened, -1 with errno on failure. */
static int create_or_open(dt_offload_file *f) {
    for (int tries = 0; tries < 4; tries++) {
        f->lock_fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (f->lock_fd >= 0) return 1;
        if (errno != EEXIST) return -1;
        f->lock_fd = open(f->path, O_RDWR | O_CLOEXEC);
        if (f->lock_fd >= 0) return 0;
        if (errno != ENOENT) return -1; /* removed in between (its owner closed it): create again */
    }
    errno = EEXIST;
    return -1;
}

/* Closes what is open; removes the file if this open created it and holds its lock. */
static dt_status give_up(dt_offload_file *f, int locked, dt_status st) {
    if (f->fd >= 0) close(f->fd);
    if (f->lock_fd >= 0) {
        if (locked && f->created) unlink(f->path);
        close(f->lock_fd);
    }
    f->fd = f->lock_fd = -1;
    return st;
}

/* Creates and locks; 0 when the file at the path is the one locked, 1 when the path was
 * replaced in between (its owner removed it at close: try again), or a failure. */
static dt_status lock_file(dt_offload_file *f, const char *dir, int *retry) {
    *retry = 0;
    int c = create_or_open(f);
    if (c < 0) {
        int e = errno;
        if (e == EACCES || e == EPERM || e == EROFS)
            return dt_fail(DT_EINPUT, "offload.nvme_path '%s': not writable (creating %s: %s)", dir, f->path,
                           e == EROFS ? "read-only filesystem" : strerror(e));
        return dt_fail(DT_EINPUT, "offload file '%s': cannot create: %s", f->path, strerror(e));
    }
    f->created = c;
    struct stat st, at_path;
    if (fstat(f->lock_fd, &st) != 0 || !S_ISREG(st.st_mode))
        return give_up(f, 0, dt_fail(DT_EINPUT, "offload file '%s': exists and is not a regular file", f->path));
    /* the lock comes before any change: never truncate a file another process holds */
    if (flock(f->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK)
            return give_up(f, 0, dt_fail(DT_EINPUT, "offload file '%s': in use by another process (another "
                                                    "rank or job using the same offload.nvme_path?)",
                                         f->path));
        return give_up(f, 0, dt_fail(DT_EINPUT, "offload file '%s': cannot lock: %s", f->path, strerror(e)));
    }
    if (stat(f->path, &at_path) != 0 || at_path.st_ino != st.st_ino || at_path.st_dev != st.st_dev) {
        give_up(f, 0, DT_OK);
        *retry = 1;
    }
    return DT_OK;
}

dt_status dt_offload_file_open(dt_offload_file *f, const char *dir, const char *tag) {
    memset(f, 0, sizeof *f);
    f->fd = f->lock_fd = -1;
    if (!dir || !*dir) return dt_fail(DT_EINPUT, "offload.nvme_path is not set: name a directory on a local disk");
    if (!tag || !*tag || strchr(tag, '/'))
        return dt_fail(DT_EINPUT, "offload file tag '%s' is empty or has a '/'", tag ? tag : "");
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) return dt_fail(DT_EINPUT, "offload.nvme_path '%s': no such directory", dir);
        return dt_fail(DT_EINPUT, "offload.nvme_path '%s': %s", dir, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) return dt_fail(DT_EINPUT, "offload.nvme_path '%s': not a directory", dir);
    if (snprintf(f->path, sizeof f->path, "%s/dtrain-offload-%s.bin", dir, tag) >= (int)sizeof f->path)
        return dt_fail(DT_EINPUT, "offload.nvme_path '%s': path too long", dir);
    for (int tries = 0;; tries++) {
        int retry;
        DT_TRY(lock_file(f, dir, &retry));
        if (!retry) break;
        if (tries == 3)
            return dt_fail(DT_EINPUT, "offload file '%s': in use by another process (replaced while opening)", f->path);
    }
    /* a second descriptor does the I/O: O_DIRECT bypasses the page cache (the store is
     * streamed once per step, caching it would only evict what the host needs) */
    f->fd = open(f->path, O_RDWR | O_DIRECT | O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        if (e == EINVAL)
            return give_up(f, 1, dt_fail(DT_EINPUT, "offload.nvme_path '%s': filesystem does not support O_DIRECT "
                                                    "(tmpfs, ramfs?): use a directory on a local disk",
                                         dir));
        return give_up(f, 1, dt_fail(DT_EINPUT, "offload file '%s': cannot open with O_DIRECT: %s", f->path,
                                     strerror(e)));
    }
    read_alignment(f);
    return DT_OK;
}

dt_status dt_offload_file_allocate(dt_offload_file *f, size_t bytes) {
    if (ftruncate(f->lock_fd, 0) != 0)
        return dt_fail(DT_EINPUT, "offload file '%s': cannot truncate: %s", f->path, strerror(errno));
    if (bytes == 0) return DT_OK;
    struct statvfs vfs;
    double avail = statvfs(f->path, &vfs) == 0 ? (double)vfs.f_bavail * (double)vfs.f_frsize : -1;
    int e = posix_fallocate(f->lock_fd, 0, (off_t)bytes); /* returns the error, errno untouched */
    if (e == 0) return DT_OK;
    (void)!ftruncate(f->lock_fd, 0); /* give back what was allocated; the error below says why */
    const double mib = 1024.0 * 1024.0;
    unsigned long long need = (unsigned long long)(((double)bytes + mib - 1) / mib);
    if (e == ENOSPC || e == EDQUOT) {
        if (avail < 0)
            return dt_fail(DT_EINPUT, "offload file '%s': no room: %llu MiB needed", f->path, need);
        return dt_fail(DT_EINPUT, "offload file '%s': no room: %llu MiB needed, %llu MiB free", f->path, need,
                       (unsigned long long)(avail / mib));
    }
    return dt_fail(DT_EINPUT, "offload file '%s': cannot allocate %llu MiB: %s", f->path, need, strerror(e));
}

void dt_offload_file_close(dt_offload_file *f, int remove) {
    if (f->lock_fd >= 0 && remove) unlink(f->path); /* while locked: no one else can take it half-removed */
    if (f->fd >= 0) close(f->fd);
    if (f->lock_fd >= 0) close(f->lock_fd);
    f->fd = f->lock_fd = -1;
}
