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
static int parse_record(const unsigned char *hdr, char *name, int *vocab) {
    const unsigned char *p = hdr + 12;
    int32_t v = le32(hdr + 20);
    memset(name, 0, DT_TOKENFILE_NAME_BYTES + 1);
    *vocab = 0;
    int zero = v == 0;
    for (int i = 0; i < DT_TOKENFILE_NAME_BYTES; i++) zero &= p[i] == 0;
    if (zero) return 0;
    int len = 0;
    while (len < DT_TOKENFILE_NAME_BYTES && p[len]) len++;
    if (len == 0 || v < 1 || v > 65536) return -1;
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
    f->tokens = NULL;
    f->count = 0;
}

dt_status dt_tokenfile_read(dt_tokenfile *f, const char *path, int vocab_size) {
    memset(f, 0, sizeof *f);
    if (strlen(path) >= sizeof f->path) return dt_fail(DT_EINPUT, "%.200s...: token file path too long", path);
    if (vocab_size <= 0) return dt_fail(DT_EINPUT, "%s: invalid vocab size %d", path, vocab_size);
    int fd;
    DT_TRY(dt_input_open(path, NULL, &fd)); /* the caller names the key */
    dt_status st = DT_OK;
    uint16_t *tok = NULL;
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
    if (version != DT_TOKENFILE_VERSION) {
        st = dt_fail(DT_EINPUT, "%s: unsupported version %d (expected %d, uint16 tokens)", path, version,
                     DT_TOKENFILE_VERSION);
        goto done;
    }
    if (count < 0) {
        st = dt_fail(DT_EINPUT, "%s: negative token count %d in header", path, count);
        goto done;
    }
    char name[DT_TOKENFILE_NAME_BYTES + 1];
    int rec_vocab;
    if (parse_record(hdr, name, &rec_vocab) != 0) {
        st = dt_fail(DT_EINPUT, "%s: header bytes 12..23 are not a tokenizer record (a name of [a-z0-9_-] and a "
                     "vocabulary of 1..65536, or zeros)", path);
        goto done;
    }
    long long expect = DT_TOKENFILE_HEADER_BYTES + 2LL * count;
    if (size != expect) {
        st = dt_fail(DT_EINPUT, "%s: %s: header says %d tokens (%lld bytes) but the file has %lld bytes", path,
                     size < expect ? "truncated" : "trailing bytes", count, expect, size);
        goto done;
    }
    size_t n = (size_t)count;
    st = dt_alloc((void **)&tok, n * sizeof *tok, "token file");
    if (st != DT_OK) {
        dt_error_context("%s", path);
        goto done;
    }
    if (read_full(fd, tok, n * sizeof *tok) != 0) {
        st = dt_fail(DT_EINPUT, "%s: truncated while reading tokens: %s", path,
                     errno ? strerror(errno) : "file shrank");
        goto done;
    }
#if DT_BIG_ENDIAN
    for (size_t i = 0; i < n; i++) tok[i] = (uint16_t)(tok[i] >> 8 | tok[i] << 8);
#endif
    unsigned top = 0;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] >= vocab_size) {
            st = dt_fail(DT_EINPUT, "%s: token %u at position %zu is >= vocab size %d", path, tok[i], i, vocab_size);
            goto done;
        }
        if (tok[i] > top) top = tok[i];
    }
    f->max_token = top;
    memcpy(f->tokenizer, name, sizeof f->tokenizer);
    f->tokenizer_vocab = rec_vocab;
    f->tokens = tok;
    f->count = n;
    memcpy(f->path, path, strlen(path) + 1);
    tok = NULL;
done:
    dt_free(tok);
    close(fd);
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

dt_status dt_tokenfile_write(const char *path, const uint16_t *tokens, size_t count, const char *tokenizer,
                             int vocab) {
    if (count > INT32_MAX) return dt_fail(DT_EINPUT, "%s: %zu tokens do not fit a token file header", path, count);
    size_t name_len = tokenizer ? strlen(tokenizer) : 0;
    if (name_len > DT_TOKENFILE_NAME_BYTES || (name_len && (vocab < 1 || vocab > 65536)))
        return dt_fail(DT_EINPUT, "%s: tokenizer record '%s' (vocab %d) does not fit the header", path,
                       tokenizer ? tokenizer : "", vocab);
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return dt_fail(DT_EINPUT, "%.200s...: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dt_fail(DT_ERUNTIME, "%s: cannot create: %s", tmp, strerror(errno));
    unsigned char hdr[DT_TOKENFILE_HEADER_BYTES] = {0};
    put_le32(hdr, DT_TOKENFILE_MAGIC);
    put_le32(hdr + 4, DT_TOKENFILE_VERSION);
    put_le32(hdr + 8, (int32_t)count);
    if (name_len) {
        memcpy(hdr + 12, tokenizer, name_len);
        put_le32(hdr + 20, vocab);
    }
    int bad = write_full(fd, hdr, sizeof hdr) != 0;
#if DT_BIG_ENDIAN
    uint16_t chunk[4096];
    for (size_t i = 0; i < count && !bad; i += 4096) {
        size_t k = count - i < 4096 ? count - i : 4096;
        for (size_t j = 0; j < k; j++) chunk[j] = (uint16_t)(tokens[i + j] >> 8 | tokens[i + j] << 8);
        bad = write_full(fd, chunk, k * sizeof *chunk) != 0;
    }
#else
    if (!bad && count) bad = write_full(fd, tokens, count * sizeof *tokens) != 0;
#endif
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
