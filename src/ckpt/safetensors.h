/* Hugging Face safetensors files: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
 * then the raw little-endian tensor data; offsets are relative to the start of the data.
 * Files are untrusted input: st_open validates every size and offset before anything uses it.
 * Checksums: our writer records each tensor's CRC-32 (zlib's, as Python's zlib.crc32) of its
 * data bytes in the metadata, "crc32.<tensor name>": 8 lowercase hex digits. Reading a whole
 * tensor (st_read) or st_verify checks it; files without them (Hugging Face's) load as before. */
#ifndef DT_SAFETENSORS_H
#define DT_SAFETENSORS_H
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef enum { ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL } st_dtype;

#define ST_MAX_NDIM 8
#define ST_MAX_HEADER (100u << 20) /* 100 MiB, as in the reference implementation */

typedef struct {
    char name[256];
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_NDIM];
    uint64_t begin, end; /* relative to data_start; end - begin == numel * dtype size */
    int has_crc;         /* the metadata records crc for this tensor */
    uint32_t crc;
} st_entry;

#define ST_CRC_PREFIX "crc32."

typedef struct {
    FILE *fp;
    char path[1024];
    uint64_t file_size, data_start;
    int n;
    st_entry *entries; /* sorted by name (st_find uses binary search) */
    cJSON *metadata;   /* the "__metadata__" object (all values strings), or NULL */
} st_file;

/* Opens the file and reads and fully validates the header. Bad files: DT_EINPUT with a
 * message naming the file and the problem. On failure *f is left closed (st_close is safe). */
dt_status st_open(st_file *f, const char *path);
/* NULL if there is no tensor with this name. */
const st_entry *st_find(const st_file *f, const char *name);
/* Reads one tensor's bytes; dst_bytes must equal e->end - e->begin. A recorded checksum
 * that the bytes do not match: DT_EINPUT naming the file and the tensor. */
dt_status st_read(st_file *f, const st_entry *e, void *dst, uint64_t dst_bytes);
/* Reads bytes [offset, offset + bytes) of one tensor's data (a shard's run); the range
 * must lie inside the tensor. */
dt_status st_read_range(st_file *f, const st_entry *e, uint64_t offset, void *dst, uint64_t bytes);
/* Reads the tensor's bytes (in pieces) and checks them against its recorded checksum (DT_OK
 * when it has none): for readers of parts of a tensor, and for whole-checkpoint checks. */
dt_status st_verify(st_file *f, const st_entry *e);
/* Metadata value, or NULL if absent. */
const char *st_metadata(const st_file *f, const char *key);
/* Safe on a closed or zeroed st_file, and twice. */
void st_close(st_file *f);

size_t st_dtype_size(st_dtype d);
const char *st_dtype_name(st_dtype d);

typedef struct {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_NDIM];
    const void *data; /* may be NULL only for an empty tensor */
} st_tensor_ref;

/* Writes atomically (via atomic_file): data in the order given, packed with no gaps (as the
 * reference loader requires); header keys "__metadata__" first (the caller's keys, then a
 * checksum per tensor in name order, computed as the data is written and patched into the
 * header's fixed-width slots at the end), then tensors sorted by name;
 * header JSON padded with spaces so the data starts 8-byte aligned. meta_keys[i] -> meta_vals[i];
 * both may be NULL when nmeta == 0. Names must be unique, non-empty, < 256 bytes. */
dt_status st_write(const char *path, const st_tensor_ref *t, int n, const char *const *meta_keys,
                   const char *const *meta_vals, int nmeta);
/* The same file, tensor i's data (t[i].data is not read) asked of fetch(ctx, i, &data) just
 * before it is written, in the order given: valid until the next call (a streamed save
 * holds one tensor at a time). A fetch error stops the write (the file is not created). */
typedef dt_status (*st_fetch_fn)(void *ctx, int i, const void **data);
dt_status st_write_fetch(const char *path, const st_tensor_ref *t, int n, const char *const *meta_keys,
                         const char *const *meta_vals, int nmeta, st_fetch_fn fetch, void *ctx);

#endif
