/* The store's open and close, the cpu kind (the state in host memory: a pass hands out
 * pointers into it), and the checks every call makes before the nvme code runs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_internal.h"

/* The process's stores: the per-step I/O metrics sum them (a rank's optimizer and
 * parameter stores). One thread opens and closes them. */
static dt_store *open_stores;
static dt_store_stats closed;

/* Zeroed host memory, aligned to align (a power of two): the caller's allocator (page-locked
 * for a GPU) or posix_memalign. */
static dt_status host_alloc(const dt_store_opts *o, void **p, size_t bytes, size_t align, const char *what) {
    *p = NULL;
    if (bytes == 0) bytes = align; /* a real buffer even for an empty store: no NULL special cases */
    if (o->host_alloc) {
        DT_TRY(o->host_alloc(p, bytes, what));
        if ((uintptr_t)*p % align) {
            o->host_free(*p);
            *p = NULL;
            return dt_fail(DT_ERUNTIME, "the host allocator's buffer for %s is not %zu-byte aligned (O_DIRECT)", what,
                           align);
        }
    } else if (posix_memalign(p, align, bytes) != 0) {
        *p = NULL;
        return dt_fail(DT_ERUNTIME, "out of host memory (%zu bytes)", bytes);
    }
    memset(*p, 0, bytes);
    return DT_OK;
}

static void host_free(const dt_store *s, void *p) {
    if (!p) return;
    if (s->host_free)
        s->host_free(p);
    else
        free(p);
}

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static dt_status open_cpu(dt_store *s, const dt_store_opts *o) {
    size_t bytes;
    if (__builtin_mul_overflow(s->n, s->elem, &bytes)) return dt_fail(DT_EINPUT, "%zu elements: too large", s->n);
    if (!(s->field = calloc((size_t)s->nfields, sizeof *s->field)))
        return dt_fail(DT_ERUNTIME, "out of host memory");
    for (int f = 0; f < s->nfields; f++) DT_TRY(host_alloc(o, (void **)&s->field[f], bytes, page_size(), s->what));
    return DT_OK;
}

/* Slots: enough to read ahead, use one block and write one back (buffers >= 3), but never
 * more than the blocks there are. */
static dt_status open_nvme(dt_store *s, const dt_store_opts *o) {
    if (o->block_bytes == 0 || o->buffers < 3)
        return dt_fail(DT_EINPUT, "offload block of %zu bytes and %d buffers (at least 3)", o->block_bytes,
                       o->buffers);
    DT_TRY(dt_offload_file_open(&s->file, o->dir, o->tag));
    size_t a = s->file.align, file_bytes, slot_bytes;
    s->block_bytes = (o->block_bytes + a - 1) / a * a;
    if (s->block_bytes < s->elem) s->block_bytes = (s->elem + a - 1) / a * a;
    s->epb = s->block_bytes / s->elem;
    s->nblocks = (s->n + s->epb - 1) / s->epb;
    if (__builtin_mul_overflow((size_t)s->nfields, s->block_bytes, &slot_bytes) ||
        __builtin_mul_overflow(s->nblocks, slot_bytes, &file_bytes) || file_bytes > (size_t)INT64_MAX)
        return dt_fail(DT_EINPUT, "%zu elements: too large for one file", s->n);
    DT_TRY(dt_offload_file_allocate(&s->file, file_bytes));
    s->nslots = o->buffers;
    if ((size_t)s->nslots > s->nblocks) s->nslots = s->nblocks ? (int)s->nblocks : 1;
    /* one slot being written back, one in use, the rest read ahead (fewer slots: all ahead) */
    s->ahead = s->nslots >= 3 ? s->nslots - 2 : s->nslots - 1;
    size_t buf_align = a > page_size() ? a : page_size();
    if (!(s->slot = calloc((size_t)s->nslots, sizeof *s->slot))) return dt_fail(DT_ERUNTIME, "out of host memory");
    for (int i = 0; i < s->nslots; i++) {
        s->slot[i].block = -1;
        DT_TRY(host_alloc(o, (void **)&s->slot[i].buf, slot_bytes, buf_align, s->what));
    }
    if (o->fetch_max && s->nfields == 1) { /* the read-ahead: its range widened to whole 4 KiB (or alignment) pieces */
        size_t r = a > 4096 ? a : 4096, bytes;
        if (__builtin_mul_overflow(o->fetch_max, s->elem, &bytes) || bytes > file_bytes) bytes = file_bytes;
        s->fetch_max = o->fetch_max;
        s->fetch_align = r;
        s->fetch_bytes = (bytes + r - 1) / r * r + r;
        DT_TRY(host_alloc(o, (void **)&s->fetch_buf, s->fetch_bytes, buf_align, s->what));
    }
    return dt_aio_open(&s->aio, s->file.fd, s->nslots + (s->fetch_buf != NULL), s->file.path);
}

dt_status dt_store_open(dt_store **out, size_t n, int nfields, size_t elem, const dt_store_opts *o,
                        const char *what) {
    *out = NULL;
    what = what ? what : "offloaded state";
    if (nfields < 1 || elem == 0 || !o || (o->kind != DT_STORE_CPU && o->kind != DT_STORE_NVME) ||
        (o->host_alloc && !o->host_free))
        return dt_fail(DT_EINPUT, "%s: bad store (%d fields of %zu-byte elements, kind %d)", what, nfields, elem,
                       o ? (int)o->kind : 0);
    dt_store *s = calloc(1, sizeof *s);
    if (!s) return dt_fail(DT_ERUNTIME, "%s: out of host memory", what);
    s->kind = o->kind;
    s->n = n;
    s->nfields = nfields;
    s->elem = elem;
    snprintf(s->what, sizeof s->what, "%s", what);
    s->host_free = o->host_alloc ? o->host_free : NULL;
    s->file.fd = s->file.lock_fd = -1;
    s->cur = -1;
    dt_status st = o->kind == DT_STORE_CPU ? open_cpu(s, o) : open_nvme(s, o);
    if (st != DT_OK) {
        /* a file this open did not create is not removed (dt_store_close would) */
        if (s->kind == DT_STORE_NVME) dt_offload_file_close(&s->file, s->file.created);
        dt_error_context("%s", s->what);
        dt_store_close(s);
        return st;
    }
    *out = s;
    s->next_open = open_stores;
    open_stores = s;
    return DT_OK;
}

void dt_store_close(dt_store *s) {
    if (!s) return;
    for (dt_store **p = &open_stores; *p; p = &(*p)->next_open)
        if (*p == s) { /* its counts stay in the process's totals */
            dt_store_stats st;
            dt_store_stats_of(s, &st);
            closed.read_bytes += st.read_bytes;
            closed.write_bytes += st.write_bytes;
            closed.wait_s += st.wait_s;
            *p = s->next_open;
            break;
        }
    dt_aio_close(s->aio); /* waits: the kernel may still be using the buffers */
    if (s->kind == DT_STORE_NVME) dt_offload_file_close(&s->file, 1);
    if (s->field)
        for (int f = 0; f < s->nfields; f++) host_free(s, s->field[f]);
    if (s->slot)
        for (int i = 0; i < s->nslots; i++) host_free(s, s->slot[i].buf);
    if (s->fetch_buf) host_free(s, s->fetch_buf);
    free(s->field);
    free(s->slot);
    free(s);
}

dt_status dt_store_pass_begin(dt_store *s) {
    if (s->in_pass) return dt_fail(DT_ERUNTIME, "%s: pass begun twice", s->what);
    s->in_pass = 1;
    s->next_k = 0;
    store_fetch_drop(s); /* the pass writes the file */
    return s->kind == DT_STORE_NVME ? store_nvme_pass_begin(s) : DT_OK;
}

dt_status dt_store_pass_range(dt_store *s, size_t k, size_t n, void **fields, size_t *got) {
    *got = 0;
    if (!s->in_pass) return dt_fail(DT_ERUNTIME, "%s: pass_range outside a pass", s->what);
    if (k < s->next_k || k > s->n || n > s->n - k)
        return dt_fail(DT_ERUNTIME, "%s: pass range [%zu, +%zu) out of order (next at or after %zu) or past %zu",
                       s->what, k, n, s->next_k, s->n);
    if (n == 0) {
        for (int f = 0; f < s->nfields; f++) fields[f] = NULL;
        return DT_OK;
    }
    if (s->kind == DT_STORE_NVME) {
        DT_TRY(store_nvme_pass_range(s, k, n, fields, got));
    } else {
        for (int f = 0; f < s->nfields; f++) fields[f] = s->field[f] + k * s->elem;
        *got = n;
    }
    s->next_k = k + *got;
    return DT_OK;
}

dt_status dt_store_pass_end(dt_store *s) {
    if (!s->in_pass) return dt_fail(DT_ERUNTIME, "%s: pass_end outside a pass", s->what);
    s->in_pass = 0;
    return s->kind == DT_STORE_NVME ? store_nvme_pass_end(s) : DT_OK;
}

static dt_status check_random(const dt_store *s, int f, size_t k, size_t n, const char *op) {
    if (s->in_pass) return dt_fail(DT_ERUNTIME, "%s: %s during a pass", s->what, op);
    if (f < 0 || f >= s->nfields || k > s->n || n > s->n - k)
        return dt_fail(DT_ERUNTIME, "%s: %s of field %d [%zu, +%zu) outside %d fields of %zu", s->what, op, f, k, n,
                       s->nfields, s->n);
    return DT_OK;
}

dt_status dt_store_read(dt_store *s, int f, size_t k, size_t n, void *dst) {
    DT_TRY(check_random(s, f, k, n, "read"));
    if (n == 0) return DT_OK;
    if (s->kind == DT_STORE_NVME) return store_nvme_read(s, f, k, n, dst);
    memcpy(dst, s->field[f] + k * s->elem, n * s->elem);
    return DT_OK;
}

dt_status dt_store_write(dt_store *s, int f, size_t k, size_t n, const void *src) {
    DT_TRY(check_random(s, f, k, n, "write"));
    if (n == 0) return DT_OK;
    if (s->kind == DT_STORE_NVME) return store_nvme_write(s, f, k, n, src);
    memcpy(s->field[f] + k * s->elem, src, n * s->elem);
    return DT_OK;
}

size_t dt_store_host_bytes(const dt_store *s) {
    return s->kind == DT_STORE_CPU ? s->n * s->elem * (size_t)s->nfields
                                   : (size_t)s->nslots * (size_t)s->nfields * s->block_bytes + s->fetch_bytes;
}

size_t dt_store_file_bytes(const dt_store *s) {
    return s->kind == DT_STORE_CPU ? 0 : s->nblocks * (size_t)s->nfields * s->block_bytes;
}

void dt_store_stats_of(const dt_store *s, dt_store_stats *st) {
    st->read_bytes = s->aio ? dt_aio_read_bytes(s->aio) : 0;
    st->write_bytes = s->aio ? dt_aio_write_bytes(s->aio) : 0;
    st->wait_s = s->wait_s;
}

void dt_store_totals(dt_store_stats *st) {
    *st = closed;
    for (const dt_store *s = open_stores; s; s = s->next_open) {
        dt_store_stats one;
        dt_store_stats_of(s, &one);
        st->read_bytes += one.read_bytes;
        st->write_bytes += one.write_bytes;
        st->wait_s += one.wait_s;
    }
}
