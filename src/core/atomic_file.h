/* Crash-safe file replacement for checkpoints and other outputs.
 * Data goes to "<path>.tmp.<pid>" in the same directory; commit fsyncs it, renames it
 * over <path> and fsyncs the directory, so a reader sees either the old file or the
 * complete new one, never a torn write, even after a crash or power loss. */
#ifndef DT_ATOMIC_FILE_H
#define DT_ATOMIC_FILE_H
#include <stddef.h>

#include "status.h"

/* Open while tmp_path[0] != 0. A zero-initialised struct is a valid "closed" state,
 * so dt_atomic_abort() is always safe on it. */
typedef struct {
    int fd;
    char final_path[1024];
    char tmp_path[1100];
} dt_atomic_file;

/* Creates "<path>.tmp.<pid>" (O_EXCL, mode 0644 minus umask). A stale temp file of that
 * name (left by a crashed process whose pid got reused) is removed first. */
dt_status dt_atomic_open(dt_atomic_file *f, const char *path);
/* Writes all n bytes (loops on short writes and EINTR). */
dt_status dt_atomic_write(dt_atomic_file *f, const void *buf, size_t n);
/* Rewrites n bytes already written at offset off (a header patched once the data it
 * describes has been streamed); the file position is unchanged. */
dt_status dt_atomic_pwrite(dt_atomic_file *f, const void *buf, size_t n, unsigned long long off);
/* fsync, close, rename over the final path, fsync the directory. On failure before the
 * rename the temp file is removed and the old file is untouched; if only the final
 * directory fsync fails the new file is in place but may not survive a power loss. */
dt_status dt_atomic_commit(dt_atomic_file *f);
/* Closes and unlinks the temp file; a no-op after commit, after a failed open, or twice. */
void dt_atomic_abort(dt_atomic_file *f);
/* open + write + commit (aborting on failure). */
dt_status dt_write_file_atomic(const char *path, const void *buf, size_t n);
/* Makes a rename/create inside dir durable. */
dt_status dt_fsync_dir(const char *dir);
/* Reads a whole small file into a malloc'd, NUL-terminated buffer (free() it).
 * *len excludes the NUL. Missing, not a regular file or larger than max_len bytes:
 * DT_EINPUT. dt_input_read (input_file.h) with no key named. */
dt_status dt_read_file(const char *path, char **out, size_t *len, size_t max_len);

#endif
