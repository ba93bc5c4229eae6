/* Token files in the llm.c / nanoGPT layout: a header of 256 little-endian int32
 * (header[0] = magic 20240520, header[1] = version, header[2] = token count), then the
 * tokens, little-endian.
 *
 * Version 1 (llm.c's): `count` uint16 tokens, one stream.
 * Version 3 (documents; 2 is llm.c's uint32 stream, kept clear of; docs/config.md): header[6] = bytes per token id (2, or 4 for
 * vocabularies over 65,536), header[7] = document count D (at least 1 when there are
 * tokens), header[8] = flags (bit 0: a loss mask follows; no other bit set). After the
 * tokens, D + 1 uint64 document starts (0 first, strictly increasing: no empty document,
 * `count` last), then with the flag `count` bytes of loss mask (1: the token is predicted
 * in the loss, 0: it is not, e.g. a prompt). Every other header byte is zero.
 *
 * The tokenizer record (dtrain's, in header bytes llm.c leaves zero, so llm.c still reads a version 1
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
#define DT_TOKENFILE_VERSION_DOCS 3
#define DT_TOKENFILE_HEADER_BYTES 1024

#define DT_TOKENFILE_NAME_BYTES 8 /* header bytes 12..19 */

typedef struct {
    uint16_t *tokens;   /* 2-byte ids (every version 1 file, version 3 with width 2) */
    uint32_t *tokens32; /* 4-byte ids (version 3 with width 4: vocabularies over 65,536); one of the two is set */
    size_t count;
    char path[1024];
    char tokenizer[DT_TOKENFILE_NAME_BYTES + 1]; /* "" : not recorded */
    int tokenizer_vocab;                         /* 0 : not recorded */
    unsigned max_token;                          /* the largest id in the file (0 when empty) */
    int version;                                 /* 1: a token stream; 3: documents */
    size_t ndocs;                                /* version 3: documents (doc_start has ndocs + 1 entries) */
    uint64_t *doc_start;                         /* version 3: where each document starts; NULL in version 1 */
    uint8_t *mask;                               /* version 3 with a loss mask: 1 = in the loss; else NULL */
} dt_tokenfile;

/* Reads the whole file into memory. Validates: file exists/readable, size >= 1024 bytes,
 * magic, version (1 or 3), count >= 0, the file's size exactly what the header describes
 * (too short -> "truncated", too long -> "trailing bytes"), every token < vocab_size
 * (error names the first bad position and value; 4-byte ids are held as 4 bytes, 2-byte
 * ids as 2), a tokenizer record that is all zero or a name of [a-z0-9_-]
 * with a vocabulary in 1..65536 (1..2^31 in version 3); version 3: the width, the flags,
 * the document starts (the first empty document named) and the mask's bytes (0 or 1, the
 * first other named). All DT_EINPUT with a one-line message that names the file and the
 * cause; *f is zeroed on failure. */
dt_status dt_tokenfile_read(dt_tokenfile *f, const char *path, int vocab_size);
/* Token i (i < count), whichever width the file has. */
static inline uint32_t dt_tokenfile_at(const dt_tokenfile *f, size_t i) {
    return f->tokens32 ? f->tokens32[i] : f->tokens[i];
}
void dt_tokenfile_free(dt_tokenfile *f);
/* Writes atomically: to "<path>.tmp.<pid>", fsync, rename (then fsyncs the directory).
 * count must fit the header's int32. tokenizer (NULL or "": none) and vocab are the
 * tokenizer record. A version 1 file. */
dt_status dt_tokenfile_write(const char *path, const uint16_t *tokens, size_t count, const char *tokenizer,
                             int vocab);
/* The same as a version 3 file: ndocs documents starting at doc_start[0..ndocs) (doc_start
 * has ndocs + 1 entries, the last = count), mask NULL or count bytes of 0/1; ids written
 * in 4 bytes when vocab > 65536, else 2. */
dt_status dt_tokenfile_write_docs(const char *path, const uint32_t *tokens, size_t count, const uint64_t *doc_start,
                                  size_t ndocs, const uint8_t *mask, const char *tokenizer, int vocab);

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
