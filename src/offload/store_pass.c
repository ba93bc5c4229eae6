/* The nvme pass: blocks move through nslots host slots. The current block is handed out
 * in place (DIRTY); when the pass moves on it is written back behind (WRITING) while the
 * next blocks, read ahead up to `ahead` past the current one, are already on their way.
 * A slot is reused once its block is outside the window [current, current + ahead] and its
 * transfer has finished, so with 3 slots one is read, one used and one written at once. */
#include "../core/timer.h"
#include "store_internal.h"

int store_find_slot(const dt_store *s, size_t b) {
    for (int i = 0; i < s->nslots; i++)
        if (s->slot[i].block == (long long)b) return i;
    return -1;
}

/* The slot's transfer has been waited for with outcome st. */
static dt_status slot_done(dt_store *s, int i, dt_status st) {
    store_slot *sl = &s->slot[i];
    if (st != DT_OK) {
        sl->st = SLOT_EMPTY; /* a failed read holds nothing; a failed write left the file wrong anyway */
        sl->block = -1;
    } else if (sl->st == SLOT_READING || sl->st == SLOT_WRITING) {
        sl->st = SLOT_CLEAN;
    }
    return st;
}

dt_status store_slot_finish(dt_store *s, int i) {
    if (!dt_aio_pending(s->aio, i)) return DT_OK;
    return slot_done(s, i, dt_aio_wait(s->aio, i));
}

dt_status store_settle(dt_store *s) {
    dt_status first = DT_OK;
    for (int i = 0; i < s->nslots; i++) {
        dt_status st = store_slot_finish(s, i);
        if (first == DT_OK) first = st;
    }
    return first;
}

/* A transfer that could not start leaves the slot empty. */
static dt_status started(store_slot *sl, dt_status st) {
    if (st != DT_OK) {
        sl->st = SLOT_EMPTY;
        sl->block = -1;
    }
    return st;
}

static dt_status issue_read(dt_store *s, int i, size_t b) {
    store_slot *sl = &s->slot[i];
    sl->block = (long long)b;
    sl->st = SLOT_READING;
    return started(sl, dt_aio_read(s->aio, i, sl->buf, (size_t)s->nfields * s->block_bytes,
                                   (off_t)store_field_offset(s, b, 0)));
}

static dt_status issue_write(dt_store *s, int i) {
    store_slot *sl = &s->slot[i];
    sl->st = SLOT_WRITING;
    return started(sl, dt_aio_write(s->aio, i, sl->buf, (size_t)s->nfields * s->block_bytes,
                                    (off_t)store_field_offset(s, (size_t)sl->block, 0)));
}

/* A slot to read into: one holding no block of [lo, hi] whose transfer has finished (an
 * empty one first, then a clean one). None free: *out = -1, or with may_wait, waits for
 * transfers to finish until one is. */
static dt_status acquire(dt_store *s, long long lo, long long hi, int may_wait, int *out) {
    for (;;) {
        dt_aio_poll(s->aio);
        int pick = -1, rank = 3;
        for (int i = 0; i < s->nslots; i++) {
            const store_slot *sl = &s->slot[i];
            if (sl->st == SLOT_DIRTY || (sl->block >= lo && sl->block <= hi) || dt_aio_busy(s->aio, i)) continue;
            int r = sl->st == SLOT_EMPTY ? 0 : sl->st == SLOT_CLEAN ? 1 : 2; /* 2: finished, not collected */
            if (r < rank) pick = i, rank = r;
        }
        if (pick >= 0) {
            DT_TRY(store_slot_finish(s, pick));
            s->slot[pick].st = SLOT_EMPTY;
            s->slot[pick].block = -1;
            *out = pick;
            return DT_OK;
        }
        *out = -1;
        if (!may_wait) return DT_OK;
        int tag;
        dt_status st = dt_aio_wait_any(s->aio, &tag);
        if (tag >= 0) slot_done(s, tag, st);
        DT_TRY(st);
        if (tag < 0) return dt_fail(DT_ERUNTIME, "%s: no free offload buffer (internal error)", s->what);
    }
}

/* Reads of blocks first .. last not yet in a slot, into free slots, not waiting; keep
 * protects [keep_lo, keep_hi] from reuse. */
static dt_status read_range(dt_store *s, size_t first, size_t last, long long keep_lo, long long keep_hi, int *all) {
    *all = 1;
    for (size_t x = first; x <= last && x < s->nblocks; x++) {
        if (store_find_slot(s, x) >= 0) continue;
        int i;
        DT_TRY(acquire(s, keep_lo, keep_hi, 0, &i));
        if (i < 0) {
            *all = 0;
            return DT_OK;
        }
        DT_TRY(issue_read(s, i, x));
    }
    return DT_OK;
}

/* The first blocks, for the pass to come (they travel while the caller does other work). */
static dt_status prefetch_first(dt_store *s) {
    if (!s->nblocks) return DT_OK;
    size_t last = (size_t)s->nslots - 1;
    int all;
    return read_range(s, 0, last, 0, (long long)last, &all);
}

dt_status store_nvme_pass_begin(dt_store *s) {
    s->cur = -1;
    return prefetch_first(s); /* nothing when the last pass_end did it */
}

/* The current block's write goes behind the pass (if the caller was handed it). */
static dt_status leave_current(dt_store *s) {
    int i = s->cur_slot;
    s->cur = -1;
    return s->slot[i].st == SLOT_DIRTY ? issue_write(s, i) : DT_OK;
}

/* Makes block b the current one, resident and handed out. */
static dt_status enter(dt_store *s, size_t b) {
    int i = store_find_slot(s, b);
    if (i < 0 || s->slot[i].st != SLOT_CLEAN) {
        double t0 = dt_now();
        dt_status st = DT_OK;
        if (i < 0) {
            st = acquire(s, (long long)b, (long long)(b + (size_t)s->ahead), 1, &i);
            if (st == DT_OK) st = issue_read(s, i, b);
        }
        if (st == DT_OK) st = store_slot_finish(s, i);
        s->wait_s += dt_now() - t0;
        DT_TRY(st);
    }
    s->slot[i].st = SLOT_DIRTY; /* touched: written back when the pass leaves it */
    s->cur_slot = i;
    s->cur = (long long)b;
    s->ahead_full = 0;
    return DT_OK;
}

dt_status store_nvme_pass_range(dt_store *s, size_t k, size_t n, void **fields, size_t *got) {
    size_t b = k / s->epb;
    if ((long long)b != s->cur) {
        if (s->cur >= 0) DT_TRY(leave_current(s));
        DT_TRY(enter(s, b));
    }
    /* tried on every call: a slot that was still being written may be free by now */
    if (!s->ahead_full) {
        long long hi = s->cur + s->ahead;
        DT_TRY(read_range(s, b + 1, (size_t)hi, s->cur, hi, &s->ahead_full));
    }
    size_t off = k - b * s->epb, left = store_block_elems(s, b) - off;
    *got = n < left ? n : left;
    unsigned char *buf = s->slot[s->cur_slot].buf;
    for (int f = 0; f < s->nfields; f++) fields[f] = buf + (size_t)f * s->block_bytes + off * s->elem;
    return DT_OK;
}

dt_status store_nvme_pass_end(dt_store *s) {
    dt_status st = s->cur >= 0 ? leave_current(s) : DT_OK;
    double t0 = dt_now();
    for (int i = 0; i < s->nslots; i++)
        if (s->slot[i].st == SLOT_WRITING) {
            dt_status w = store_slot_finish(s, i);
            if (st == DT_OK) st = w;
        }
    s->wait_s += dt_now() - t0;
    return st == DT_OK ? prefetch_first(s) : st;
}
