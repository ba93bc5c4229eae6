/* Token files in the llm.c / nanoGPT layout: a header of 256 little-endian int32
 * (header[0] = magic 20240520, header[1] = version 1, header[2] = token count),
 * then `count` little-endian uint16 tokens.
 *
 * The tokenizer record (dtrain's, in header bytes llm.c leaves zero, so llm.c still reads
 * the file): bytes 12..19 the tokenizer's name (ASCII, NUL-padded: "byte", "gpt2"),
 * bytes 20..23 its vocabulary size (int32). All zero: not recorded (llm.c's files, dtrain's
 * before the record). The record keeps these bytes in every later header version. */
#ifndef DT_TOKENFILE_H
#define DT_TOKENFILE_H
#include <stddef.h>
#include <stdint.h>
#include "../core/status.h"

#define DT_TOKENFILE_MAGIC 20240520
#define DT_TOKENFILE_VERSION 1
#define DT_TOKENFILE_HEADER_BYTES 1024

#define DT_TOKENFILE_NAME_BYTES 8 /* header bytes 12..19 */

typedef struct {
    uint16_t *tokens;
    size_t count;
    char path[1024];
    char tokenizer[DT_TOKENFILE_NAME_BYTES + 1]; /* "" : not recorded */
    int tokenizer_vocab;                         /* 0 : not recorded */
    unsigned max_token;                          /* the largest id in the file (0 when empty) */
} dt_tokenfile;

/* Reads the whole file into memory (one allocation). Validates: file exists/readable,
 * size >= 1024 bytes, magic, version, count >= 0, file size == 1024 + 2*count exactly
 * (too short -> "truncated", too long -> "trailing bytes"), every token < vocab_size
 * (error names the first bad position and value), a tokenizer record that is all zero or
 * a name of [a-z0-9_-] with a vocabulary in 1..65536. All DT_EINPUT with a one-line message
 * that names the file and the cause; *f is zeroed on failure. */
dt_status dt_tokenfile_read(dt_tokenfile *f, const char *path, int vocab_size);
void dt_tokenfile_free(dt_tokenfile *f);
/* Writes atomically: to "<path>.tmp.<pid>", fsync, rename (then fsyncs the directory).
 * count must fit the header's int32. tokenizer (NULL or "": none) and vocab are the
 * tokenizer record. */
dt_status dt_tokenfile_write(const char *path, const uint16_t *tokens, size_t count, const char *tokenizer,
                             int vocab);

/* Whether the file is data for this run (pure; what = the config key naming it, e.g.
 * "data.train"). A recorded tokenizer must be `tokenizer` (data.tokenizer) and its
 * vocabulary V must fit model.vocab_size without leaving most of it unused:
 * V <= vocab_size <= V rounded up to a multiple of 1024 (room for padding such as llm.c's
 * 50304); else DT_EINPUT naming the file and both. A file without a record is accepted;
 * when its largest id is far below the vocabulary (below vocab_size / 4: byte data with
 * GPT-2's vocabulary), *note gets a one-line warning, else "". */
dt_status dt_tokenfile_check(const dt_tokenfile *f, const char *what, const char *tokenizer, int vocab_size,
                             char *note, size_t cap);

#endif
