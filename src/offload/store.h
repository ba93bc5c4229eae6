/* Off-device state (ZeRO-Offload, ZeRO-Infinity): nfields arrays of n elements each (the
 * optimizer's fp32 master weights and AdamW moments, or ZeRO-3's parameter shard) kept in
 * host memory (cpu) or in one file under a directory (nvme), and streamed through a pass
 * in blocks: with nvme the file is read and written in aligned blocks with the page cache
 * bypassed (O_DIRECT) through io_uring (liburing), buffer_count blocks in flight, so that
 * reading block k+1 and writing block k-1 overlap the work on block k. docs/offload.md.
 *
 * On disk a block is its fields one after another (field f of block b at
 * (b·nfields + f)·block_bytes), so one read brings everything an update of the block needs.
 * The file is scratch: created (truncated) and sized at open, locked so no other process
 * uses it, removed at close; it never outlives a run as state (a resume starts from a
 * checkpoint), so a crash cannot leave anything a later run mistakes for valid. */
#ifndef DT_OFFLOAD_STORE_H
#define DT_OFFLOAD_STORE_H
#include <stddef.h>

#include "../core/status.h"

typedef enum { DT_STORE_CPU = 1, DT_STORE_NVME = 2 } dt_store_kind;

typedef struct {
    dt_store_kind kind;
    const char *dir;     /* nvme: the directory the file goes in (must exist, be writable, take O_DIRECT) */
    const char *tag;     /* names the file: DIR/dtrain-offload-TAG.bin, e.g. "optimizer-rank3" */
    size_t block_bytes;  /* nvme: bytes per field per block, rounded up to the file's O_DIRECT alignment */
    int buffers;         /* nvme: blocks resident at once (>= 3: read ahead, in use, written back;
                          * no more are allocated than the store has blocks) */
    /* host memory for the buffers (cpu: the whole state): NULL = page-aligned malloc;
     * a GPU's page-locked allocator otherwise (offload.pin_memory) */
    dt_status (*host_alloc)(void **p, size_t bytes, const char *what);
    void (*host_free)(void *p);
    size_t fetch_max; /* nvme, one field: elements of the largest read-ahead (dt_store_fetch_begin; 0: none) */
} dt_store_opts;

typedef struct dt_store dt_store;

/* A store of nfields x n elements of elem bytes, every element zero. DT_EINPUT, one line
 * naming the path and the cause, when the directory does not exist, is not writable, has
 * no room for the file (it is allocated in full here, so a full disk fails now, not in
 * step 900), refuses O_DIRECT, or the file is in use by another process; what names the
 * state in messages ("optimizer state"). On failure *out is NULL and nothing is left. */
dt_status dt_store_open(dt_store **out, size_t n, int nfields, size_t elem, const dt_store_opts *o,
                        const char *what);
/* o's block size for a state of n elements of elem bytes: at most the state's own size
 * (rounded up to 4 KiB), so a small state is not padded to a whole block in the file and
 * in every pass's writes. */
static inline size_t dt_store_block_for(const dt_store_opts *o, size_t n, size_t elem) {
    size_t whole = n <= (size_t)-1 / elem - 4096 ? (n * elem + 4095) / 4096 * 4096 : o->block_bytes;
    return whole < o->block_bytes ? whole : o->block_bytes;
}
/* Waits for what is in flight, removes the file, frees the buffers (NULL: nothing). */
void dt_store_close(dt_store *s);

/* A pass over the elements in ascending order: ranges asked of pass_range start at or
 * after the end of the previous one (gaps are fine: blocks never asked for are neither
 * waited for nor written). pass_range gives field f's elements [k, k + *got) at fields[f],
 * host memory the caller may read and write until the pass leaves that block (*got <= n:
 * nvme stops at the end of the block, ask again for the rest; cpu gives all n). A block
 * a range touched is written back when the pass leaves it, read or changed. pass_end
 * writes back every block touched, waits for the writes, then starts reading the first
 * blocks of the next pass (they travel while the caller does other work). Out-of-order
 * ranges, a range past n, nested passes: DT_ERUNTIME. */
dt_status dt_store_pass_begin(dt_store *s);
dt_status dt_store_pass_range(dt_store *s, size_t k, size_t n, void **fields, size_t *got);
dt_status dt_store_pass_end(dt_store *s);

/* Random access outside a pass (checkpoints, init, load): field f's elements [k, k + n)
 * copied to / from host memory (nvme: transfers in flight are finished first; the field's
 * block is read, changed, written back, and a block resident for the next pass is changed
 * with it, so the pass sees every write). Inside a pass: DT_ERUNTIME. */
dt_status dt_store_read(dt_store *s, int f, size_t k, size_t n, void *dst);
dt_status dt_store_write(dt_store *s, int f, size_t k, size_t n, const void *src);

/* Read-ahead of one range of a one-field nvme store (ZeRO-3's parameter shard: the next
 * unit's slice read while the current one computes). fetch_begin starts reading field 0's
 * [k, k + n) (n <= the store's fetch_max) into a buffer of its own, from the file (not
 * when a block changed in memory has not reached the file yet: then nothing starts); a
 * read that cannot start is left to fetch_take. fetch_take copies [k, k + n) to dst: from
 * the read-ahead when it is that range (waiting for it), else by dt_store_read. One
 * read-ahead at a time: another begin, a write or a pass drops the one in flight. Other
 * stores: begin does nothing, take reads. */
void dt_store_fetch_begin(dt_store *s, size_t k, size_t n);
dt_status dt_store_fetch_take(dt_store *s, size_t k, size_t n, void *dst);
/* Bytes held in host memory (cpu: the state; nvme: the buffers, the read-ahead's included),
 * bytes of the file (0: cpu). */
size_t dt_store_host_bytes(const dt_store *s);
size_t dt_store_file_bytes(const dt_store *s);
/* Since open: bytes read from and written to the file, and seconds the caller waited for
 * I/O (pass_range waiting for a read, pass_end for the writes). */
typedef struct {
    double read_bytes, write_bytes, wait_s;
} dt_store_stats;
void dt_store_stats_of(const dt_store *s, dt_store_stats *st);
/* The same summed over every store this process has opened (the per-step metrics). */
void dt_store_totals(dt_store_stats *st);

#endif
