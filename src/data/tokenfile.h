/* Token files in the llm.c / nanoGPT layout: a header of 256 little-endian int32
 * (header[0] = magic 20240520, header[1] = version 1, header[2] = token count),
 * then `count` little-endian uint16 tokens. */
#ifndef DT_TOKENFILE_H
#define DT_TOKENFILE_H
#include <stddef.h>
#include <stdint.h>
#include "../core/status.h"

#define DT_TOKENFILE_MAGIC 20240520
#define DT_TOKENFILE_VERSION 1
#define DT_TOKENFILE_HEADER_BYTES 1024

typedef struct {
    uint16_t *tokens;
    size_t count;
    char path[1024];
} dt_tokenfile;

/* Reads the whole file into memory (one allocation). Validates: file exists/readable,
 * size >= 1024 bytes, magic, version, count >= 0, file size == 1024 + 2*count exactly
 * (too short -> "truncated", too long -> "trailing bytes"), every token < vocab_size
 * (error names the first bad position and value). All DT_EINPUT with a one-line message
 * that names the file and the cause; *f is zeroed on failure. */
dt_status dt_tokenfile_read(dt_tokenfile *f, const char *path, int vocab_size);
void dt_tokenfile_free(dt_tokenfile *f);
/* Writes atomically: to "<path>.tmp.<pid>", fsync, rename (then fsyncs the directory).
 * count must fit the header's int32. */
dt_status dt_tokenfile_write(const char *path, const uint16_t *tokens, size_t count);

#endif
