/* nvme random access outside a pass (checkpoints, init, load). Whatever is in flight is
 * finished first, so every slot is then empty or clean (equal to the file). A clean slot
 * holding the block serves a read and takes a write (the slot and the file both change:
 * they stay equal, and the next pass's prefetched blocks stay valid). Otherwise one field
 * of the block moves through a scratch slot, which holds no block after: O_DIRECT moves
 * whole aligned blocks, so a partial write reads the field's block, changes it, writes it. */
#include <string.h>

#include "store_internal.h"

/* An empty slot, else the clean one with the highest block (the low ones are what the
 * next pass starts with), emptied. */
static int scratch_slot(dt_store *s) {
    int pick = -1;
    for (int i = 0; i < s->nslots; i++) {
        if (s->slot[i].st == SLOT_EMPTY) return i;
        if (pick < 0 || s->slot[i].block > s->slot[pick].block) pick = i;
    }
    s->slot[pick].st = SLOT_EMPTY;
    s->slot[pick].block = -1;
    return pick;
}

/* One field of block b between buf (in slot i) and the file, waited for; a failure
 * leaves the slot empty. */
static dt_status field_io(dt_store *s, int i, unsigned char *buf, int write, size_t b, int f) {
    off_t off = (off_t)store_field_offset(s, b, f);
    dt_status st = write ? dt_aio_write(s->aio, i, buf, s->block_bytes, off)
                         : dt_aio_read(s->aio, i, buf, s->block_bytes, off);
    if (st == DT_OK) st = dt_aio_wait(s->aio, i);
    if (st != DT_OK) {
        s->slot[i].st = SLOT_EMPTY;
        s->slot[i].block = -1;
    }
    return st;
}

dt_status store_nvme_read(dt_store *s, int f, size_t k, size_t n, void *dst) {
    DT_TRY(store_settle(s));
    unsigned char *d = dst;
    while (n) {
        size_t b = k / s->epb, off = k - b * s->epb, cnt = s->epb - off;
        if (cnt > n) cnt = n;
        int i = store_find_slot(s, b);
        const unsigned char *from;
        if (i >= 0) {
            from = s->slot[i].buf + (size_t)f * s->block_bytes;
        } else {
            i = scratch_slot(s);
            DT_TRY(field_io(s, i, s->slot[i].buf, 0, b, f));
            from = s->slot[i].buf;
        }
        memcpy(d, from + off * s->elem, cnt * s->elem);
        d += cnt * s->elem;
        k += cnt;
        n -= cnt;
    }
    return DT_OK;
}

dt_status store_nvme_write(dt_store *s, int f, size_t k, size_t n, const void *src) {
    store_fetch_drop(s); /* it may be reading what changes */
    DT_TRY(store_settle(s));
    const unsigned char *from = src;
    while (n) {
        size_t b = k / s->epb, off = k - b * s->epb, cnt = s->epb - off;
        if (cnt > n) cnt = n;
        int i = store_find_slot(s, b);
        unsigned char *buf;
        if (i >= 0) {
            buf = s->slot[i].buf + (size_t)f * s->block_bytes;
        } else {
            i = scratch_slot(s);
            buf = s->slot[i].buf;
            size_t have = store_block_elems(s, b);
            if (cnt < have)
                DT_TRY(field_io(s, i, buf, 0, b, f));
            else /* the whole field: nothing to keep; the padding past the last element is zeros */
                memset(buf + have * s->elem, 0, s->block_bytes - have * s->elem);
        }
        memcpy(buf + off * s->elem, from, cnt * s->elem);
        DT_TRY(field_io(s, i, buf, 1, b, f));
        from += cnt * s->elem;
        k += cnt;
        n -= cnt;
    }
    return DT_OK;
}
