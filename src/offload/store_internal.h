/* Private to the files that implement store.h: store.c (open, close, the cpu kind, the
 * calls' checks), store_pass.c (nvme: the slots and the pass through them) and
 * store_random.c (nvme: random access outside a pass). */
#ifndef DT_OFFLOAD_STORE_INTERNAL_H
#define DT_OFFLOAD_STORE_INTERNAL_H
#include <stddef.h>

#include "aio.h"
#include "offload_file.h"
#include "store.h"

/* A slot holds one block (all its fields) in host memory. Its aio tag is its index: at
 * most one transfer per slot, so the queue never holds more than nslots. */
typedef enum {
    SLOT_EMPTY,   /* holds nothing valid */
    SLOT_READING, /* the block's read is in flight */
    SLOT_CLEAN,   /* the block, as in the file */
    SLOT_DIRTY,   /* the pass's current block, handed out to the caller */
    SLOT_WRITING, /* written back, the write in flight (the data stays valid) */
} slot_state;

typedef struct {
    unsigned char *buf; /* nfields x block_bytes; field f at f·block_bytes */
    long long block;    /* -1 when EMPTY */
    slot_state st;
} store_slot;

struct dt_store {
    dt_store_kind kind;
    size_t n, elem;
    int nfields;
    char what[64];
    void (*host_free)(void *p);
    int in_pass;
    size_t next_k; /* a pass's next range starts at or after it */
    unsigned char **field; /* cpu: the state, one array per field */
    /* nvme */
    dt_offload_file file;
    dt_aio *aio;
    size_t block_bytes, epb, nblocks; /* epb: elements per block (per field) */
    int nslots, ahead;                /* ahead: blocks read ahead of the current one */
    store_slot *slot;
    long long cur; /* the pass's current block (-1: none yet) */
    int cur_slot;
    int ahead_full; /* every block of the read-ahead window is in a slot */
    _Atomic double wait_s; /* read by the metrics while a delayed update's thread waits */
    struct dt_store *next_open; /* the process's open stores (dt_store_totals) */
    /* read-ahead (store_fetch.c): its buffer, aio tag nslots, the range in flight */
    unsigned char *fetch_buf;
    size_t fetch_bytes, fetch_max, fetch_align, fetch_k, fetch_n, fetch_lo;
    int fetch_on;
};

/* Elements of field data in block b (the last block may be short). */
static inline size_t store_block_elems(const dt_store *s, size_t b) {
    size_t left = s->n - b * s->epb;
    return left < s->epb ? left : s->epb;
}
/* File offset of field f of block b. */
static inline long long store_field_offset(const dt_store *s, size_t b, int f) {
    return ((long long)b * s->nfields + f) * (long long)s->block_bytes;
}

/* store_pass.c */
int store_find_slot(const dt_store *s, size_t b);
dt_status store_slot_finish(dt_store *s, int i); /* waits for the slot's transfer: CLEAN (or EMPTY on error) */
dt_status store_settle(dt_store *s);             /* finishes every transfer in flight */
dt_status store_nvme_pass_begin(dt_store *s);
dt_status store_nvme_pass_range(dt_store *s, size_t k, size_t n, void **fields, size_t *got);
dt_status store_nvme_pass_end(dt_store *s);
/* store_fetch.c: waits for the read-ahead in flight, if any, and forgets it */
void store_fetch_drop(dt_store *s);
/* store_random.c */
dt_status store_nvme_read(dt_store *s, int f, size_t k, size_t n, void *dst);
dt_status store_nvme_write(dt_store *s, int f, size_t k, size_t n, const void *src);

#endif
