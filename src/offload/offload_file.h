/* The NVMe offload store's file, DIR/dtrain-offload-TAG.bin: created (or a stale one from a
 * crashed run reused), locked against other processes, checked for O_DIRECT and sized in
 * full at open, so every problem with the directory shows at start as one line naming the
 * path and the cause (DT_EINPUT: the trainer exits 2), not as an I/O error mid-run. */
#ifndef DT_OFFLOAD_FILE_H
#define DT_OFFLOAD_FILE_H
#include <limits.h>
#include <stddef.h>

#include "../core/status.h"

typedef struct {
    int fd;           /* O_DIRECT, read and write: the store's I/O */
    int lock_fd;      /* holds the flock; sizes the file (buffered: posix_fallocate's fallback writes bytes) */
    int created;      /* this open created the file (a failure removes it) */
    size_t align;     /* O_DIRECT: file offsets, lengths and buffer addresses are multiples of it */
    char path[PATH_MAX];
} dt_offload_file;

/* Opens DIR/dtrain-offload-TAG.bin, locked (flock LOCK_EX, before anything changes it),
 * with O_DIRECT, and reads its alignment (statx's dio alignment, else the device's logical
 * block size, else 4096). The content is not touched yet. On failure nothing is left
 * (a file it created is removed) and f->fd = f->lock_fd = -1. */
dt_status dt_offload_file_open(dt_offload_file *f, const char *dir, const char *tag);
/* Empties the file and allocates bytes of zeros (posix_fallocate: a full disk fails here,
 * with the room needed and free). On failure the file is left empty. */
dt_status dt_offload_file_allocate(dt_offload_file *f, size_t bytes);
/* Closes the file, removing it first (while still locked) when remove is set. */
void dt_offload_file_close(dt_offload_file *f, int remove);

#endif
