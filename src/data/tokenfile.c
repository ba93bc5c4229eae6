#include "tokenfile.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/input_file.h"
#include "../core/mem.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define DT_BIG_ENDIAN 1
#else
#define DT_BIG_ENDIAN 0
#endif

static int32_t le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static void put_le32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)u, p[1] = (unsigned char)(u >> 8), p[2] = (unsigned char)(u >> 16),
    p[3] = (unsigned char)(u >> 24);
}

/* Reads exactly n bytes; returns 0, or -1 with errno set (errno 0: end of file came first). */
static int read_full(int fd, void *buf, size_t n) {
    unsigned char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The tokenizer record (header bytes 12..23): all zero, or a name of [a-z0-9_-] (NUL-padded)
 * and a vocabulary in 1..65536. Returns 0, or -1 when the bytes are neither. */
static int parse_record(const unsigned char *hdr, char *name, int *vocab, int32_t max_vocab) {
    const unsigned char *p = hdr + 12;
    int32_t v = le32(hdr + 20);
    memset(name, 0, DT_TOKENFILE_NAME_BYTES + 1);
    *vocab = 0;
    int zero = v == 0;
    for (int i = 0; i < DT_TOKENFILE_NAME_BYTES; i++) zero &= p[i] == 0;
    if (zero) return 0;
    int len = 0;
    while (len < DT_TOKENFILE_NAME_BYTES && p[len]) len++;
    if (len == 0 || v < 1 || v > max_vocab) return -1;
    for (int i = 0; i < DT_TOKENFILE_NAME_BYTES; i++) {
        int c = p[i];
        if (i >= len ? c != 0 : !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return -1;
    }
    memcpy(name, p, (size_t)len);
    *vocab = v;
    return 0;
}

void dt_tokenfile_free(dt_tokenfile *f) {
    if (!f) return;
    dt_free(f->tokens);
    dt_free(f->tokens32);
    free(f->doc_start);
    free(f->mask);
    f->tokens = NULL;
    f->tokens32 = NULL;
    f->doc_start = NULL;
    f->mask = NULL;
    f->count = f->ndocs = 0;
}

static uint64_t le64(const unsigned char *p) { return (uint64_t)(uint32_t)le32(p) | (uint64_t)(uint32_t)le32(p + 4) << 32; }

/* Version 3's tail: the document starts and the loss mask, read and checked. */
static dt_status read_docs(dt_tokenfile *f, int fd, const char *path, size_t n, size_t ndocs, int has_mask) {
    unsigned char *raw = malloc((ndocs + 1) * 8);
    f->doc_start = malloc((ndocs + 1) * sizeof *f->doc_start);
    if (!raw || !f->doc_start) {
        free(raw);
        return dt_fail(DT_ERUNTIME, "%s: out of memory (%zu document starts)", path, ndocs);
    }
    int bad = read_full(fd, raw, (ndocs + 1) * 8) != 0;
    for (size_t d = 0; d <= ndocs && !bad; d++) f->doc_start[d] = le64(raw + 8 * d);
    free(raw);
    if (bad) return dt_fail(DT_EINPUT, "%s: truncated while reading document starts", path);
    f->ndocs = ndocs;
    if (f->doc_start[0] != 0)
        return dt_fail(DT_EINPUT, "%s: the first document starts at token %llu, not 0", path,
                       (unsigned long long)f->doc_start[0]);
    for (size_t d = 0; d < ndocs; d++)
        if (f->doc_start[d + 1] <= f->doc_start[d])
            return dt_fail(DT_EINPUT, "%s: document %zu is empty or out of order (starts at token %llu, the next at "
                           "%llu)", path, d, (unsigned long long)f->doc_start[d], (unsigned long long)f->doc_start[d + 1]);
    if (f->doc_start[ndocs] != n)
        return dt_fail(DT_EINPUT, "%s: the documents end at token %llu, the file has %zu tokens", path,
                       (unsigned long long)f->doc_start[ndocs], n);
    if (!has_mask) return DT_OK;
    if (!(f->mask = malloc(n + 1))) return dt_fail(DT_ERUNTIME, "%s: out of memory (loss mask)", path);
    if (read_full(fd, f->mask, n) != 0) return dt_fail(DT_EINPUT, "%s: truncated while reading the loss mask", path);
    for (size_t i = 0; i < n; i++)
        if (f->mask[i] > 1)
            return dt_fail(DT_EINPUT, "%s: loss mask byte %u at token %zu (0 or 1 expected)", path, f->mask[i], i);
    return DT_OK;
}

/* n ids of width bytes from fd into tok (uint16) or tok32 (uint32), each checked against
 * the vocabulary. */
static dt_status read_ids(int fd, const char *path, uint16_t *tok, uint32_t *tok32, size_t n, int width,
                          int vocab_size) {
    if (width == 2) {
        if (read_full(fd, tok, n * 2) != 0)
            return dt_fail(DT_EINPUT, "%s: truncated while reading tokens: %s", path, errno ? strerror(errno) : "file shrank");
#if DT_BIG_ENDIAN
        for (size_t i = 0; i < n; i++) tok[i] = (uint16_t)(tok[i] >> 8 | tok[i] << 8);
#endif
        for (size_t i = 0; i < n; i++)
            if (tok[i] >= vocab_size)
                return dt_fail(DT_EINPUT, "%s: token %u at position %zu is >= vocab size %d", path, tok[i], i, vocab_size);
        return DT_OK;
    }
    unsigned char buf[4 * 4096];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < 4096 ? n - i : 4096;
        if (read_full(fd, buf, 4 * k) != 0) return dt_fail(DT_EINPUT, "%s: truncated while reading tokens", path);
        for (size_t j = 0; j < k; j++, i++) {
            uint32_t v = (uint32_t)le32(buf + 4 * j);
            if ((int64_t)v >= vocab_size)
                return dt_fail(DT_EINPUT, "%s: token %u at position %zu is >= vocab size %d", path, v, i, vocab_size);
            tok32[i] = v;
        }
    }
    return DT_OK;
}

dt_status dt_tokenfile_read(dt_tokenfile *f, const char *path, int vocab_size) {
    memset(f, 0, sizeof *f);
    if (strlen(path) >= sizeof f->path) return dt_fail(DT_EINPUT, "%.200s...: token file path too long", path);
    if (vocab_size <= 0) return dt_fail(DT_EINPUT, "%s: invalid vocab size %d", path, vocab_size);
    int fd;
    DT_TRY(dt_input_open(path, NULL, &fd)); /* the caller names the key */
    dt_status st = DT_OK;
    uint16_t *tok = NULL;
    uint32_t *tok32 = NULL;
    struct stat sb;
    unsigned char hdr[DT_TOKENFILE_HEADER_BYTES];
    if (fstat(fd, &sb) != 0) {
        st = dt_fail(DT_EINPUT, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    long long size = (long long)sb.st_size;
    if (size < DT_TOKENFILE_HEADER_BYTES) {
        st = dt_fail(DT_EINPUT, "%s: too short for a token file: %lld bytes, the header alone is %d", path, size,
                     DT_TOKENFILE_HEADER_BYTES);
        goto done;
    }
    if (read_full(fd, hdr, sizeof hdr) != 0) {
        st = dt_fail(DT_EINPUT, "%s: cannot read header: %s", path, errno ? strerror(errno) : "file shrank");
        goto done;
    }
    int32_t magic = le32(hdr), version = le32(hdr + 4), count = le32(hdr + 8);
    if (magic != DT_TOKENFILE_MAGIC) {
        st = dt_fail(DT_EINPUT, "%s: bad magic %d (expected %d): not a token file", path, magic,
                     DT_TOKENFILE_MAGIC);
        goto done;
    }
    if (version != DT_TOKENFILE_VERSION && version != DT_TOKENFILE_VERSION_DOCS) {
        st = dt_fail(DT_EINPUT, "%s: unsupported version %d (1: uint16 tokens, 3: documents)", path, version);
        goto done;
    }
    if (count < 0) {
        st = dt_fail(DT_EINPUT, "%s: negative token count %d in header", path, count);
        goto done;
    }
    char name[DT_TOKENFILE_NAME_BYTES + 1];
    int rec_vocab;
    int docs = version == DT_TOKENFILE_VERSION_DOCS;
    if (parse_record(hdr, name, &rec_vocab, docs ? INT32_MAX : 65536) != 0) {
        st = dt_fail(DT_EINPUT, "%s: header bytes 12..23 are not a tokenizer record (a name of [a-z0-9_-] and a "
                     "vocabulary of 1..%d, or zeros)", path, docs ? INT32_MAX : 65536);
        goto done;
    }
    int32_t width = docs ? le32(hdr + 24) : 2, ndocs = docs ? le32(hdr + 28) : 0, flags = docs ? le32(hdr + 32) : 0;
    if (docs && (width != 2 && width != 4)) {
        st = dt_fail(DT_EINPUT, "%s: %d bytes per token id in the header (2 or 4)", path, width);
        goto done;
    }
    if (docs && (ndocs < 0 || (count > 0 && ndocs == 0) || ndocs > count || (flags & ~1))) {
        st = dt_fail(DT_EINPUT, "%s: header has %d documents for %d tokens, flags %d (documents: 1..tokens; flags: "
                     "0 or 1)", path, ndocs, count, flags);
        goto done;
    }
    for (int i = 36; docs && i < DT_TOKENFILE_HEADER_BYTES; i++)
        if (hdr[i]) {
            st = dt_fail(DT_EINPUT, "%s: header byte %d is not zero (a later version's file?)", path, i);
            goto done;
        }
    long long expect = DT_TOKENFILE_HEADER_BYTES + (long long)width * count +
                       (docs ? 8LL * ((long long)ndocs + 1) + ((flags & 1) ? count : 0) : 0);
    if (size != expect) {
        st = dt_fail(DT_EINPUT, "%s: %s: the header says %d tokens of %d bytes%s%s (%lld bytes) but the file has "
                     "%lld bytes", path, size < expect ? "truncated" : "trailing bytes", count, width,
                     docs ? ", their document starts" : "", (flags & 1) ? " and a loss mask" : "", expect, size);
        goto done;
    }
    size_t n = (size_t)count;
    st = width == 4 ? dt_alloc((void **)&tok32, n * sizeof *tok32, "token file")
                    : dt_alloc((void **)&tok, n * sizeof *tok, "token file");
    if (st != DT_OK) {
        dt_error_context("%s", path);
        goto done;
    }
    st = read_ids(fd, path, tok, tok32, n, width, vocab_size);
    if (st == DT_OK && docs) st = read_docs(f, fd, path, n, (size_t)ndocs, flags & 1);
    if (st != DT_OK) goto done;
    unsigned top = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned v = tok32 ? tok32[i] : tok[i];
        if (v > top) top = v;
    }
    f->max_token = top;
    memcpy(f->tokenizer, name, sizeof f->tokenizer);
    f->tokenizer_vocab = rec_vocab;
    f->tokens = tok;
    f->tokens32 = tok32;
    f->count = n;
    f->version = version;
    memcpy(f->path, path, strlen(path) + 1);
    tok = NULL;
    tok32 = NULL;
done:
    dt_free(tok);
    dt_free(tok32);
    close(fd);
    if (st != DT_OK) dt_tokenfile_free(f), memset(f, 0, sizeof *f);
    return st;
}

/* Makes the rename durable; best effort (some filesystems refuse fsync on directories). */
static void fsync_parent(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static void put_le64(unsigned char *p, uint64_t v) {
    put_le32(p, (int32_t)(uint32_t)v);
    put_le32(p + 4, (int32_t)(uint32_t)(v >> 32));
}

/* Little-endian values of width bytes (2, 4 or 8) from src (uint16, uint16 widened, or
 * uint64), n of them, in chunks. */
static int write_le(int fd, const void *src, size_t n, int in_width, int width) {
    unsigned char buf[8 * 4096];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < 4096 ? n - i : 4096;
        for (size_t j = 0; j < k; j++) {
            uint64_t v = in_width == 8   ? ((const uint64_t *)src)[i + j]
                         : in_width == 4 ? ((const uint32_t *)src)[i + j]
                                         : ((const uint16_t *)src)[i + j];
            if (width == 8) put_le64(buf + 8 * j, v);
            else if (width == 4) put_le32(buf + 4 * j, (int32_t)(uint32_t)v);
            else buf[2 * j] = (unsigned char)v, buf[2 * j + 1] = (unsigned char)(v >> 8);
        }
        if (write_full(fd, buf, k * (size_t)width) != 0) return -1;
        i += k;
    }
    return 0;
}

/* tokens: in_width bytes each (2: uint16, 4: uint32) */
static dt_status write_file(const char *path, const void *tokens, int in_width, size_t count, const uint64_t *doc_start,
                            size_t ndocs, const uint8_t *mask, const char *tokenizer, int vocab, int version) {
    if (count > INT32_MAX || ndocs > INT32_MAX)
        return dt_fail(DT_EINPUT, "%s: %zu tokens do not fit a token file header", path, count);
    size_t name_len = tokenizer ? strlen(tokenizer) : 0;
    if (name_len > DT_TOKENFILE_NAME_BYTES || (name_len && (vocab < 1 || (version == 1 && vocab > 65536))))
        return dt_fail(DT_EINPUT, "%s: tokenizer record '%s' (vocab %d) does not fit the header", path,
                       tokenizer ? tokenizer : "", vocab);
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return dt_fail(DT_EINPUT, "%.200s...: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dt_fail(DT_ERUNTIME, "%s: cannot create: %s", tmp, strerror(errno));
    unsigned char hdr[DT_TOKENFILE_HEADER_BYTES] = {0};
    int width = version == 3 && vocab > 65536 ? 4 : 2;
    put_le32(hdr, DT_TOKENFILE_MAGIC);
    put_le32(hdr + 4, version);
    put_le32(hdr + 8, (int32_t)count);
    if (name_len) {
        memcpy(hdr + 12, tokenizer, name_len);
        put_le32(hdr + 20, vocab);
    }
    if (version == 3) {
        put_le32(hdr + 24, width);
        put_le32(hdr + 28, (int32_t)ndocs);
        put_le32(hdr + 32, mask ? 1 : 0);
    }
    int bad = write_full(fd, hdr, sizeof hdr) != 0;
    if (!bad) bad = write_le(fd, tokens, count, in_width, width) != 0;
    if (!bad && version == 3) bad = write_le(fd, doc_start, ndocs + 1, 8, 8) != 0;
    if (!bad && version == 3 && mask && count) bad = write_full(fd, mask, count) != 0;
    if (!bad) bad = fsync(fd) != 0;
    int err = errno;
    if (close(fd) != 0 && !bad) bad = 1, err = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        return dt_fail(DT_ERUNTIME, "%s: write failed: %s", path, strerror(err));
    }
    fsync_parent(path);
    return DT_OK;
}

dt_status dt_tokenfile_write(const char *path, const uint16_t *tokens, size_t count, const char *tokenizer,
                             int vocab) {
    return write_file(path, tokens, 2, count, NULL, 0, NULL, tokenizer, vocab, 1);
}

dt_status dt_tokenfile_write_docs(const char *path, const uint32_t *tokens, size_t count, const uint64_t *doc_start,
                                  size_t ndocs, const uint8_t *mask, const char *tokenizer, int vocab) {
    return write_file(path, tokens, 4, count, doc_start, ndocs, mask, tokenizer, vocab, 3);
}

dt_status dt_tokenfile_check(const dt_tokenfile *f, const char *what, const char *tokenizer, int vocab_size,
                             char *note, size_t cap) {
    if (cap) note[0] = 0;
    if (f->tokenizer[0]) {
        int v = f->tokenizer_vocab;
        long long room = ((long long)v + 1023) / 1024 * 1024;
        if (strcmp(f->tokenizer, tokenizer) != 0)
            return dt_fail(DT_EINPUT, "%s: '%s' was made by the %s tokenizer (vocab %d), but this run has "
                           "data.tokenizer %s and model.vocab_size %d; use data prepared with --tokenizer %s, or set "
                           "data.tokenizer=%s and model.vocab_size=%d", what, f->path, f->tokenizer, v, tokenizer,
                           vocab_size, tokenizer, f->tokenizer, v);
        if (vocab_size < v || vocab_size > room)
            return dt_fail(DT_EINPUT, "%s: '%s' was made by the %s tokenizer (vocab %d), but this run has "
                           "data.tokenizer %s and model.vocab_size %d; set model.vocab_size=%d (or up to %lld, "
                           "padded)", what, f->path, f->tokenizer, v, tokenizer, vocab_size, v, room);
        return DT_OK;
    }
    if (f->count > 0 && 4LL * f->max_token < vocab_size && cap)
        snprintf(note, cap, "%s: '%s' records no tokenizer (an llm.c file, or older dtrain) and its largest token "
                 "id %u is far below model.vocab_size %d: is it data for this model? (byte data has vocab 256)",
                 what, f->path, f->max_token, vocab_size);
    return DT_OK;
}
