#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include "../core/atomic_file.h"

/* Tensor bytes are copied verbatim between file and memory, which is only right on a
 * little-endian host (the format is little-endian); byte swapping is not implemented. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif
_Static_assert(sizeof(off_t) == 8, "need 64-bit file offsets");

static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2}, [ST_F64] = {"F64", 8},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2},   [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},
};
#define N_DTYPES ((int)(sizeof DTYPES / sizeof DTYPES[0]))

size_t st_dtype_size(st_dtype d) { return (int)d >= 0 && (int)d < N_DTYPES ? DTYPES[d].size : 0; }

const char *st_dtype_name(st_dtype d) { return (int)d >= 0 && (int)d < N_DTYPES ? DTYPES[d].name : "?"; }

static int dtype_from_name(const char *s, st_dtype *out) {
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(s, DTYPES[i].name) == 0) {
            *out = (st_dtype)i;
            return 1;
        }
    return 0;
}

/* Bytes of a tensor, or 0 with *ok = 0 on a bad shape or overflow. */
static uint64_t tensor_bytes(st_dtype d, int ndim, const int64_t *shape, int *ok) {
    uint64_t n = st_dtype_size(d);
    *ok = n > 0 && ndim >= 0 && ndim <= ST_MAX_NDIM;
    for (int i = 0; *ok && i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n)) *ok = 0;
    return *ok ? n : 0;
}

/* ---------------------------------------------------------------- reading */

/* Every header problem is reported as "<path>: <cause>". */
__attribute__((format(printf, 2, 3))) static dt_status bad(const st_file *f, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_fail(DT_EINPUT, "%s: %s", f->path, msg);
}

/* cJSON parses numbers as doubles: accept only exact non-negative integers below 2^53, so
 * nothing is silently rounded (no real file has offsets or dims that large). */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0 && v < 9007199254740992.0)) return 0; /* also rejects NaN */
    uint64_t u = (uint64_t)v;
    if ((double)u != v) return 0; /* fractional */
    *out = u;
    return 1;
}

static dt_status parse_entry(const st_file *f, const cJSON *j, st_entry *e, uint64_t data_size) {
    const char *name = j->string;
    if (strlen(name) >= sizeof e->name) return bad(f, "tensor name '%.64s...' is too long", name);
    strcpy(e->name, name);
    if (!cJSON_IsObject(j)) return bad(f, "header entry for tensor '%s' is not a JSON object", name);

    /* cJSON keeps duplicate keys; reject them so no reader can pick a different one. */
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *c = j->child; c; c = c->next) {
        const cJSON **slot = strcmp(c->string, "dtype") == 0          ? &jd
                             : strcmp(c->string, "shape") == 0        ? &js
                             : strcmp(c->string, "data_offsets") == 0 ? &jo
                                                                      : NULL;
        if (!slot) continue; /* unknown keys are ignored, as in the reference implementation */
        if (*slot) return bad(f, "tensor '%s': duplicate key '%s' in header", name, c->string);
        *slot = c;
    }

    if (!cJSON_IsString(jd)) return bad(f, "tensor '%s': dtype is missing or not a string", name);
    if (!dtype_from_name(jd->valuestring, &e->dtype))
        return bad(f, "tensor '%s': unknown dtype '%.32s'", name, jd->valuestring);

    if (!cJSON_IsArray(js)) return bad(f, "tensor '%s': shape is missing or not an array", name);
    int ndim = cJSON_GetArraySize(js);
    if (ndim > ST_MAX_NDIM) return bad(f, "tensor '%s': shape has %d dims (max %d)", name, ndim, ST_MAX_NDIM);
    e->ndim = ndim;
    int i = 0;
    for (const cJSON *c = js->child; c; c = c->next, i++) {
        uint64_t d;
        if (!json_u64(c, &d)) return bad(f, "tensor '%s': shape[%d] is not an integer in [0, 2^53)", name, i);
        e->shape[i] = (int64_t)d; /* < 2^53, fits */
    }
    int ok;
    uint64_t nbytes = tensor_bytes(e->dtype, e->ndim, e->shape, &ok);
    if (!ok) return bad(f, "tensor '%s': shape is too large (size overflows)", name);

    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_u64(jo->child, &e->begin) ||
        !json_u64(jo->child->next, &e->end))
        return bad(f, "tensor '%s': data_offsets must be two integers [begin, end] in [0, 2^53)", name);
    if (e->begin > e->end)
        return bad(f, "tensor '%s': data_offsets begin %" PRIu64 " > end %" PRIu64, name, e->begin, e->end);
    if (e->end - e->begin != nbytes)
        return bad(f,
                   "tensor '%s': data_offsets span %" PRIu64 " bytes but shape and dtype %s need %" PRIu64,
                   name, e->end - e->begin, DTYPES[e->dtype].name, nbytes);
    if (e->end > data_size)
        return bad(f,
                   "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the data "
                   "(%" PRIu64 " bytes; file truncated?)",
                   name, e->begin, e->end, data_size);
    return DT_OK;
}

static dt_status parse_metadata(const st_file *f, const cJSON *j) {
    if (!cJSON_IsObject(j)) return bad(f, "__metadata__ in header is not a JSON object");
    for (const cJSON *c = j->child; c; c = c->next) {
        if (!cJSON_IsString(c)) return bad(f, "__metadata__ value for '%.64s' is not a string", c->string);
        for (const cJSON *d = j->child; d != c; d = d->next)
            if (strcmp(d->string, c->string) == 0)
                return bad(f, "duplicate key '%.64s' in __metadata__", c->string);
    }
    return DT_OK;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int cmp_range(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Holes between tensors (and trailing bytes) are accepted: they are harmless to us, and the
 * reference implementation's "no holes" rule only matters for zero-copy mmap loaders.
 * Overlaps are rejected: they would let one write alias another tensor. Empty tensors
 * occupy no bytes and never overlap. */
static dt_status check_overlaps(const st_file *f) {
    if (f->n < 2) return DT_OK;
    const st_entry **by_off = malloc((size_t)f->n * sizeof *by_off);
    if (!by_off) return dt_fail(DT_ERUNTIME, "%s: out of memory reading header", f->path);
    for (int i = 0; i < f->n; i++) by_off[i] = &f->entries[i];
    qsort(by_off, (size_t)f->n, sizeof *by_off, cmp_range);
    const st_entry *last = NULL; /* non-empty entry reaching furthest so far */
    dt_status s = DT_OK;
    for (int i = 0; i < f->n && s == DT_OK; i++) {
        const st_entry *e = by_off[i];
        if (e->begin == e->end) continue;
        if (last && e->begin < last->end)
            s = bad(f, "tensors '%s' and '%s' overlap in the data section", last->name, e->name);
        if (!last || e->end > last->end) last = e;
    }
    free(by_off);
    return s;
}

/* CRC-32 of n bytes, continuing crc (0 to start): zlib's, in pieces its length type holds. */
static uint32_t crc_update(uint32_t crc, const void *p, uint64_t n) {
    const unsigned char *b = p;
    while (n > 0) {
        size_t k = n > (1u << 30) ? (size_t)1 << 30 : (size_t)n;
        crc = (uint32_t)crc32_z(crc, b, k);
        b += k;
        n -= k;
    }
    return crc;
}

static int hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

/* The metadata's "crc32.<name>" entries onto their tensors. A checksum for a tensor the
 * file does not hold is ignored (metadata is free-form); a malformed one is a bad header. */
static dt_status apply_checksums(st_file *f, const cJSON *meta) {
    size_t plen = strlen(ST_CRC_PREFIX);
    for (const cJSON *c = meta ? meta->child : NULL; c; c = c->next) {
        if (strncmp(c->string, ST_CRC_PREFIX, plen) != 0) continue;
        st_entry *e = (st_entry *)st_find(f, c->string + plen);
        if (!e) continue;
        const char *v = c->valuestring;
        int ok = strlen(v) == 8;
        for (int i = 0; ok && i < 8; i++) ok = hex_digit(v[i]);
        if (!ok) return bad(f, "tensor '%s': checksum '%s' in __metadata__ is not 8 lowercase hex digits", e->name, v);
        e->crc = (uint32_t)strtoul(v, NULL, 16);
        e->has_crc = 1;
    }
    return DT_OK;
}

/* Header bytes -> entries and metadata. hdr is NUL-terminated at hdr[len]. */
static dt_status parse_header(st_file *f, const char *hdr, size_t len) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, len, &end, 0);
    if (!root) return bad(f, "header is not valid JSON (near byte %zu)", end ? (size_t)(end - hdr) : (size_t)0);
    dt_status s = DT_OK;
    /* Only padding may follow the JSON value (the writer pads with spaces). */
    for (const char *p = end; p < hdr + len && s == DT_OK; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            s = bad(f, "header has trailing bytes after the JSON object (at byte %zu)", (size_t)(p - hdr));
    if (s == DT_OK && !cJSON_IsObject(root)) s = bad(f, "header is not a JSON object");

    uint64_t data_size = f->file_size - f->data_start;
    int n = 0, n_meta = 0;
    if (s == DT_OK)
        for (const cJSON *c = root->child; c; c = c->next) {
            if (strcmp(c->string, "__metadata__") == 0) n_meta++;
            else n++;
        }
    if (s == DT_OK && n_meta > 1) s = bad(f, "duplicate __metadata__ in header");
    if (s == DT_OK) {
        f->entries = calloc(n ? (size_t)n : 1, sizeof *f->entries);
        if (!f->entries) s = dt_fail(DT_ERUNTIME, "%s: out of memory reading header (%d tensors)", f->path, n);
    }
    cJSON *meta = NULL;
    for (const cJSON *c = s == DT_OK ? root->child : NULL; c && s == DT_OK; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            s = parse_metadata(f, c);
            meta = (cJSON *)c;
        } else {
            s = parse_entry(f, c, &f->entries[f->n], data_size);
            if (s == DT_OK) f->n++;
        }
    }
    if (s == DT_OK) {
        /* Sorted by name for st_find; also catches duplicate names, which cJSON allows. */
        qsort(f->entries, (size_t)f->n, sizeof *f->entries, cmp_name);
        for (int i = 1; i < f->n && s == DT_OK; i++)
            if (strcmp(f->entries[i - 1].name, f->entries[i].name) == 0)
                s = bad(f, "duplicate tensor name '%s' in header", f->entries[i].name);
    }
    if (s == DT_OK) s = check_overlaps(f);
    if (s == DT_OK) s = apply_checksums(f, meta);
    if (s == DT_OK && meta) f->metadata = cJSON_DetachItemViaPointer(root, meta);
    cJSON_Delete(root);
    return s;
}

dt_status st_open(st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    size_t plen = strlen(path);
    if (plen >= sizeof f->path) return dt_fail(DT_EINPUT, "%.64s...: path too long", path);
    memcpy(f->path, path, plen + 1);

    /* O_NONBLOCK: a FIFO (an untrusted directory may hold one) must not block the open;
     * the S_ISREG check below refuses it */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return dt_fail(DT_EINPUT, "cannot open %s: %s", path, strerror(errno));
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    f->fp = fdopen(fd, "rb");
    if (!f->fp) {
        close(fd);
        return dt_fail(DT_ERUNTIME, "cannot open %s: %s", path, strerror(errno));
    }
    dt_status s = DT_OK;
    char *hdr = NULL;
    struct stat st;
    unsigned char lenbuf[8];
    uint64_t hlen = 0;
    if (fstat(fileno(f->fp), &st) != 0) {
        s = dt_fail(DT_ERUNTIME, "cannot stat %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        s = bad(f, "not a regular file");
        goto out;
    }
    f->file_size = (uint64_t)st.st_size;
    if (f->file_size < 8) {
        s = bad(f, "file is too short (%" PRIu64 " bytes) to hold a safetensors header", f->file_size);
        goto out;
    }
    if (fread(lenbuf, 1, 8, f->fp) != 8) {
        s = bad(f, "cannot read the header length (file truncated?)");
        goto out;
    }
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenbuf[i];
    if (hlen == 0) {
        s = bad(f, "header length is 0");
        goto out;
    }
    if (hlen > ST_MAX_HEADER) {
        s = bad(f, "header length %" PRIu64 " exceeds the %u MiB limit (not a safetensors file?)", hlen,
                ST_MAX_HEADER >> 20);
        goto out;
    }
    if (hlen > f->file_size - 8) {
        s = bad(f, "header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)", hlen,
                f->file_size);
        goto out;
    }
    f->data_start = 8 + hlen;
    hdr = malloc((size_t)hlen + 1);
    if (!hdr) {
        s = dt_fail(DT_ERUNTIME, "%s: out of memory for a %" PRIu64 "-byte header", path, hlen);
        goto out;
    }
    if (fread(hdr, 1, (size_t)hlen, f->fp) != (size_t)hlen) {
        s = ferror(f->fp) ? dt_fail(DT_ERUNTIME, "cannot read %s: %s", path, strerror(errno))
                          : bad(f, "header is truncated (file changed while reading?)");
        goto out;
    }
    hdr[hlen] = 0;
    s = parse_header(f, hdr, (size_t)hlen);
out:
    free(hdr);
    if (s != DT_OK) st_close(f);
    return s;
}

const st_entry *st_find(const st_file *f, const char *name) {
    if (!f->entries || strlen(name) >= sizeof f->entries[0].name) return NULL;
    st_entry key;
    strcpy(key.name, name);
    return bsearch(&key, f->entries, (size_t)f->n, sizeof *f->entries, cmp_name);
}

/* e must be one of ours: its offsets were validated against this file. */
static dt_status check_entry(const st_file *f, const st_entry *e) {
    if (!f->fp) return dt_fail(DT_ERUNTIME, "st_read: %s is not open", f->path);
    uintptr_t pe = (uintptr_t)e, p0 = (uintptr_t)f->entries, p1 = (uintptr_t)(f->entries + f->n);
    if (!e || pe < p0 || pe >= p1) return dt_fail(DT_ERUNTIME, "st_read: entry does not belong to %s", f->path);
    return DT_OK;
}

dt_status st_read_range(st_file *f, const st_entry *e, uint64_t offset, void *dst, uint64_t bytes) {
    DT_TRY(check_entry(f, e));
    uint64_t n = e->end - e->begin;
    if (offset > n || bytes > n - offset)
        return bad(f, "tensor '%s' has %" PRIu64 " bytes; bytes [%" PRIu64 ", %" PRIu64 ") were asked for", e->name,
                   n, offset, offset + bytes);
    if (bytes == 0) return DT_OK;
    if (bytes > SIZE_MAX) return dt_fail(DT_ERUNTIME, "%s: tensor '%s' is too large for memory", f->path, e->name);
    /* data_start + end <= file_size was checked at open, so this cannot overflow. */
    if (fseeko(f->fp, (off_t)(f->data_start + e->begin + offset), SEEK_SET) != 0)
        return dt_fail(DT_ERUNTIME, "cannot seek in %s: %s", f->path, strerror(errno));
    if (fread(dst, 1, (size_t)bytes, f->fp) != (size_t)bytes) {
        if (ferror(f->fp)) return dt_fail(DT_ERUNTIME, "cannot read %s: %s", f->path, strerror(errno));
        return bad(f, "file ended while reading tensor '%s' (truncated after opening?)", e->name);
    }
    return DT_OK;
}

static dt_status check_crc(const st_file *f, const st_entry *e, uint32_t crc) {
    if (!e->has_crc || crc == e->crc) return DT_OK;
    return bad(f, "tensor '%s': checksum mismatch (its data has crc32 %08x, the header records %08x): the file is "
               "damaged", e->name, crc, e->crc);
}

dt_status st_read(st_file *f, const st_entry *e, void *dst, uint64_t dst_bytes) {
    DT_TRY(check_entry(f, e));
    if (dst_bytes != e->end - e->begin)
        return bad(f, "tensor '%s' has %" PRIu64 " bytes but %" PRIu64 " were expected", e->name, e->end - e->begin,
                   dst_bytes);
    DT_TRY(st_read_range(f, e, 0, dst, dst_bytes));
    return e->has_crc ? check_crc(f, e, crc_update(0, dst, dst_bytes)) : DT_OK;
}

dt_status st_verify(st_file *f, const st_entry *e) {
    DT_TRY(check_entry(f, e));
    if (!e->has_crc) return DT_OK;
    enum { PIECE = 4 << 20 };
    uint64_t n = e->end - e->begin, done = 0;
    unsigned char *buf = n ? malloc(n < PIECE ? (size_t)n : PIECE) : NULL;
    if (n && !buf) return dt_fail(DT_ERUNTIME, "%s: out of memory checking tensor '%s'", f->path, e->name);
    uint32_t crc = 0;
    dt_status s = DT_OK;
    while (s == DT_OK && done < n) {
        uint64_t k = n - done < PIECE ? n - done : PIECE;
        s = st_read_range(f, e, done, buf, k);
        if (s == DT_OK) crc = crc_update(crc, buf, k);
        done += k;
    }
    free(buf);
    return s == DT_OK ? check_crc(f, e, crc) : s;
}

const char *st_metadata(const st_file *f, const char *key) {
    const cJSON *v = f->metadata ? cJSON_GetObjectItemCaseSensitive(f->metadata, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

void st_close(st_file *f) {
    if (f->fp) fclose(f->fp);
    free(f->entries);
    cJSON_Delete(f->metadata);
    f->fp = NULL;
    f->entries = NULL;
    f->metadata = NULL;
    f->n = 0;
}

/* ---------------------------------------------------------------- writing */

/* Growable string; an allocation failure sticks and is reported once at the end. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v) {
    char tmp[24];
    sb_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%" PRIu64, v));
}

/* JSON string literal; bytes >= 0x80 pass through (names are expected to be UTF-8). */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            sb_put(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", *p));
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_ref_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor_ref *const *)a)->name, (*(const st_tensor_ref *const *)b)->name);
}

/* Checks the arguments and computes each tensor's data offsets. */
static dt_status plan_write(const char *path, const st_tensor_ref *t, int n, const char *const *mk,
                            const char *const *mv, int nmeta, int fetched, uint64_t *begin,
                            const st_tensor_ref **sorted) {
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name;
        if (!name || !name[0] || strlen(name) >= sizeof ((st_entry *)0)->name || !strcmp(name, "__metadata__"))
            return dt_fail(DT_EINPUT, "%s: tensor %d has an empty, reserved or too long name", path, i);
        int ok;
        uint64_t nb = tensor_bytes(t[i].dtype, t[i].ndim, t[i].shape, &ok);
        if (!ok) return dt_fail(DT_EINPUT, "%s: tensor '%s' has a bad dtype, ndim or shape", path, name);
        if (nb && !t[i].data && !fetched) return dt_fail(DT_EINPUT, "%s: tensor '%s' has no data", path, name);
        begin[i] = off;
        if (__builtin_add_overflow(off, nb, &off)) return dt_fail(DT_EINPUT, "%s: tensors too large", path);
        sorted[i] = &t[i];
    }
    begin[n] = off;
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_ref_name);
    for (int i = 1; i < n; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            return dt_fail(DT_EINPUT, "%s: duplicate tensor name '%s'", path, sorted[i]->name);
    for (int i = 0; i < nmeta; i++) {
        if (!mk[i] || !mv[i]) return dt_fail(DT_EINPUT, "%s: metadata entry %d is NULL", path, i);
        if (!strncmp(mk[i], ST_CRC_PREFIX, strlen(ST_CRC_PREFIX)))
            return dt_fail(DT_EINPUT, "%s: metadata key '%s' is reserved for checksums", path, mk[i]);
        for (int k = 0; k < i; k++)
            if (strcmp(mk[k], mk[i]) == 0) return dt_fail(DT_EINPUT, "%s: duplicate metadata key '%s'", path, mk[i]);
    }
    return DT_OK;
}

dt_status st_write(const char *path, const st_tensor_ref *t, int n, const char *const *meta_keys,
                   const char *const *meta_vals, int nmeta) {
    return st_write_fetch(path, t, n, meta_keys, meta_vals, nmeta, NULL, NULL);
}

dt_status st_write_fetch(const char *path, const st_tensor_ref *t, int n, const char *const *meta_keys,
                         const char *const *meta_vals, int nmeta, st_fetch_fn fetch, void *ctx) {
    if (n < 0 || nmeta < 0 || (n > 0 && !t) || (nmeta > 0 && (!meta_keys || !meta_vals)))
        return dt_fail(DT_EINPUT, "%s: st_write called with bad arguments", path);
    uint64_t *begin = malloc(((size_t)n + 1) * sizeof *begin);
    const st_tensor_ref **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    size_t *slot = malloc(((size_t)n + 1) * sizeof *slot); /* where tensor i's checksum goes in the header */
    sbuf h = {0};
    dt_status s = DT_OK;
    if (!begin || !sorted || !slot) {
        s = dt_fail(DT_ERUNTIME, "%s: out of memory", path);
        goto out;
    }
    s = plan_write(path, t, n, meta_keys, meta_vals, nmeta, fetch != NULL, begin, sorted);
    if (s != DT_OK) goto out;

    sb_str(&h, "{");
    if (nmeta + n > 0) {
        sb_str(&h, "\"__metadata__\":{");
        for (int i = 0; i < nmeta; i++) {
            if (i) sb_str(&h, ",");
            sb_json_str(&h, meta_keys[i]);
            sb_str(&h, ":");
            sb_json_str(&h, meta_vals[i]);
        }
        for (int k = 0; k < n; k++) { /* a fixed-width placeholder each, filled in once the data is written */
            if (k || nmeta > 0) sb_str(&h, ",");
            char key[sizeof ST_CRC_PREFIX + sizeof((st_entry *)0)->name];
            snprintf(key, sizeof key, "%s%s", ST_CRC_PREFIX, sorted[k]->name); /* names < 256 bytes: fits */
            sb_json_str(&h, key);
            sb_str(&h, ":\"");
            slot[sorted[k] - t] = h.len;
            sb_str(&h, "00000000\"");
        }
        sb_str(&h, "}");
    }
    for (int k = 0; k < n; k++) {
        const st_tensor_ref *r = sorted[k];
        size_t i = (size_t)(r - t); /* data order is the caller's: tensor i spans begin[i]..begin[i+1] */
        if (k || nmeta + n > 0) sb_str(&h, ",");
        sb_json_str(&h, r->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, DTYPES[r->dtype].name);
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < r->ndim; d++) {
            if (d) sb_str(&h, ",");
            sb_u64(&h, (uint64_t)r->shape[d]);
        }
        sb_str(&h, "],\"data_offsets\":[");
        sb_u64(&h, begin[i]);
        sb_str(&h, ",");
        sb_u64(&h, begin[i + 1]);
        sb_str(&h, "]}");
    }
    sb_str(&h, "}");
    /* Pad with spaces so 8 + header length is a multiple of 8: data starts aligned. */
    while (!h.oom && h.len % 8) sb_str(&h, " ");
    if (h.oom) {
        s = dt_fail(DT_ERUNTIME, "%s: out of memory building the header", path);
        goto out;
    }
    if (h.len > ST_MAX_HEADER) {
        s = dt_fail(DT_EINPUT, "%s: header would be %zu bytes, over the %u MiB limit", path, h.len,
                    ST_MAX_HEADER >> 20);
        goto out;
    }

    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    dt_atomic_file af;
    s = dt_atomic_open(&af, path);
    if (s != DT_OK) goto out;
    s = dt_atomic_write(&af, lenbuf, 8);
    if (s == DT_OK) s = dt_atomic_write(&af, h.p, h.len);
    for (int i = 0; i < n && s == DT_OK; i++) {
        const void *data = t[i].data;
        if (fetch) s = fetch(ctx, i, &data);
        uint64_t nb = begin[i + 1] - begin[i];
        if (s == DT_OK) s = dt_atomic_write(&af, data, (size_t)nb);
        if (s == DT_OK) {
            char hex[9];
            snprintf(hex, sizeof hex, "%08x", (unsigned)crc_update(0, data, nb));
            memcpy(h.p + slot[i], hex, 8);
        }
    }
    if (s == DT_OK) s = dt_atomic_pwrite(&af, h.p, h.len, 8); /* the header with the checksums filled in */
    if (s == DT_OK) s = dt_atomic_commit(&af);
    else dt_atomic_abort(&af);
out:
    free(begin);
    free(sorted);
    free(slot);
    free(h.p);
    return s;
}
