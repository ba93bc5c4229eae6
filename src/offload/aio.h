/* Asynchronous file I/O through io_uring (liburing): reads and writes of whole buffers at
 * file offsets, each under a tag (0 .. depth-1, one operation per tag at a time), so the
 * offload store keeps several blocks in flight on one O_DIRECT file. A short transfer is
 * resubmitted for the rest (and one over 1 GiB goes in pieces), so an operation completes
 * with all its bytes or with an error. Errors are DT_ERUNTIME naming the file, the
 * operation, the offset and the cause. */
#ifndef DT_OFFLOAD_AIO_H
#define DT_OFFLOAD_AIO_H
#include <stddef.h>
#include <sys/types.h>

#include "../core/status.h"

typedef struct dt_aio dt_aio;

/* A queue of depth tags on fd; path names the file in messages. DT_EINPUT, one line, when
 * the kernel or a container forbids io_uring (ENOSYS, EPERM). */
dt_status dt_aio_open(dt_aio **out, int fd, int depth, const char *path);
/* Waits for whatever is in flight (the kernel may still be using the buffers), frees the
 * queue (NULL: nothing). */
void dt_aio_close(dt_aio *a);

/* Starts reading len bytes at off into buf / writing len bytes of buf at off. The tag must
 * be idle (never used, or its last operation waited for); buf must stay valid until then. */
dt_status dt_aio_read(dt_aio *a, int tag, void *buf, size_t len, off_t off);
dt_status dt_aio_write(dt_aio *a, int tag, const void *buf, size_t len, off_t off);

/* Collects completions that have arrived, without waiting. */
void dt_aio_poll(dt_aio *a);
/* 1 while the tag's operation is still moving (dt_aio_wait would block), 0 once it has
 * finished (or the tag is idle). */
int dt_aio_busy(const dt_aio *a, int tag);
/* 1 while the tag holds an operation not yet waited for (moving or finished). */
int dt_aio_pending(const dt_aio *a, int tag);
/* Waits for the tag's operation and returns its outcome; the tag is idle after (DT_OK
 * at once for an idle tag). */
dt_status dt_aio_wait(dt_aio *a, int tag);
/* Waits for any one operation not yet waited for (a finished one first), sets *tag to it
 * and returns its outcome; *tag = -1 and DT_OK when none is pending. */
dt_status dt_aio_wait_any(dt_aio *a, int *tag);

/* Bytes moved since open. */
double dt_aio_read_bytes(const dt_aio *a);
double dt_aio_write_bytes(const dt_aio *a);

#endif
