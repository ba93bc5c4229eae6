/* nvme read-ahead of one range (store.h's dt_store_fetch_begin/take): ZeRO-3 reads the next
 * unit's slice of its parameter shard while the current unit computes. One field makes
 * the range contiguous in the file (block b at b·block_bytes), so it is read straight from
 * the file, widened to the O_DIRECT alignment, into a buffer of its own under aio tag
 * nslots: the slots and the pass are not touched. */
#include <string.h>

#include "store_internal.h"

void store_fetch_drop(dt_store *s) {
    if (!s->fetch_on) return;
    s->fetch_on = 0;
    if (dt_aio_wait(s->aio, s->nslots) != DT_OK) dt_error_clear(); /* nobody needs what it read */
}

void dt_store_fetch_begin(dt_store *s, size_t k, size_t n) {
    if (!s->fetch_buf || s->in_pass || n == 0 || n > s->fetch_max || k > s->n || n > s->n - k) return;
    store_fetch_drop(s);
    for (int i = 0; i < s->nslots; i++) /* a change not in the file yet: read it when taken */
        if (s->slot[i].st == SLOT_DIRTY || s->slot[i].st == SLOT_WRITING) return;
    size_t r = s->fetch_align, file = s->nblocks * s->block_bytes;
    size_t lo = k * s->elem / r * r, hi = ((k + n) * s->elem + r - 1) / r * r;
    if (hi > file) hi = file; /* a multiple of the file's alignment */
    if (dt_aio_read(s->aio, s->nslots, s->fetch_buf, hi - lo, (off_t)lo) != DT_OK) {
        dt_error_clear(); /* taken synchronously instead */
        return;
    }
    s->fetch_on = 1;
    s->fetch_k = k;
    s->fetch_n = n;
    s->fetch_lo = lo;
}

dt_status dt_store_fetch_take(dt_store *s, size_t k, size_t n, void *dst) {
    if (s->fetch_on && s->fetch_k == k && s->fetch_n == n) {
        s->fetch_on = 0;
        DT_TRY(dt_aio_wait(s->aio, s->nslots));
        memcpy(dst, s->fetch_buf + (k * s->elem - s->fetch_lo), n * s->elem);
        return DT_OK;
    }
    store_fetch_drop(s);
    return dt_store_read(s, 0, k, n, dst);
}
