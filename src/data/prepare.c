#include "prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/input_file.h"
#include "tokenfile.h"

/* Drops the '%' of every line that is exactly "%", in place; returns the new length. */
static size_t strip_percent_lines(char *s, size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        int line_start = i == 0 || s[i - 1] == '\n';
        if (line_start && s[i] == '%' && (i + 1 == n || s[i + 1] == '\n')) continue;
        s[w++] = s[i];
    }
    return w;
}

/* Text is what prepare tokenizes: a token file (its own output) or other binary data
 * would be turned into nonsense tokens without a word. */
static dt_status check_text(const char *path, const char *s, size_t n) {
    if (n >= 4 && (int32_t)((uint32_t)(unsigned char)s[0] | (uint32_t)(unsigned char)s[1] << 8 |
                            (uint32_t)(unsigned char)s[2] << 16 | (uint32_t)(unsigned char)s[3] << 24) ==
                      DT_TOKENFILE_MAGIC)
        return dt_fail(DT_EINPUT, "prepare: %s is a token file (made by dtrain prepare), not text: pass it to "
                       "train as data.train", path);
    const char *nul = memchr(s, 0, n < 65536 ? n : 65536);
    if (nul)
        return dt_fail(DT_EINPUT, "prepare: %s is binary, not text (a NUL byte at offset %zu)", path,
                       (size_t)(nul - s));
    return DT_OK;
}

dt_status dt_prepare(const dt_tokenizer *t, const char *const *inputs, int ninputs, const char *out_prefix,
                     double val_fraction, int fortune, size_t *ntrain, size_t *nval) {
    if (ntrain) *ntrain = 0;
    if (nval) *nval = 0;
    if (ninputs < 1) return dt_fail(DT_EINPUT, "prepare: no input files");
    if (!out_prefix || !*out_prefix) return dt_fail(DT_EINPUT, "prepare: empty output prefix");
    if (!(val_fraction >= 0 && val_fraction < 1))
        return dt_fail(DT_EINPUT, "prepare: val fraction %g must be in [0, 1)", val_fraction);
    if (dt_tokenizer_vocab(t) > 65536)
        return dt_fail(DT_EINPUT, "prepare: vocab %d does not fit uint16 tokens", dt_tokenizer_vocab(t));
    char train_path[PATH_MAX], val_path[PATH_MAX];
    if ((size_t)snprintf(train_path, sizeof train_path, "%s_train.bin", out_prefix) >= sizeof train_path ||
        (size_t)snprintf(val_path, sizeof val_path, "%s_val.bin", out_prefix) >= sizeof val_path)
        return dt_fail(DT_EINPUT, "prepare: output prefix too long");

    uint16_t *tok = NULL;
    size_t n = 0, cap = 0;
    dt_status st = DT_OK;
    int eot = dt_tokenizer_eot(t);
    int ends_line = 1; /* the text so far ends a line (or is empty) */
    for (int k = 0; k < ninputs && st == DT_OK; k++) {
        char *text;
        size_t len;
        st = dt_input_read(inputs[k], "prepare --input", &text, &len, (size_t)1 << 36);
        if (st != DT_OK) break;
        st = check_text(inputs[k], text, len);
        if (st != DT_OK) {
            free(text);
            break;
        }
        if (fortune) len = strip_percent_lines(text, len);
        if (k > 0 && eot >= 0) {
            uint16_t e = (uint16_t)eot;
            if (n == cap) {
                size_t c = cap ? cap * 2 : 4096;
                uint16_t *p = realloc(tok, c * sizeof *p);
                if (!p) st = dt_fail(DT_ERUNTIME, "prepare: out of memory");
                else tok = p, cap = c;
            }
            if (st == DT_OK) tok[n++] = e;
        } else if (k > 0 && !ends_line) {
            st = dt_tokenizer_encode(t, "\n", 1, &tok, &n, &cap);
            ends_line = 1;
        }
        if (len > 0) ends_line = text[len - 1] == '\n';
        if (st == DT_OK) {
            st = dt_tokenizer_encode(t, text, len, &tok, &n, &cap);
            if (st != DT_OK) dt_error_context("%s", inputs[k]);
        }
        free(text);
    }
    size_t nv = 0;
    if (st == DT_OK && n == 0) st = dt_fail(DT_EINPUT, "prepare: the inputs contain no text");
    if (st == DT_OK && val_fraction > 0) {
        nv = (size_t)((double)n * val_fraction);
        if (nv == 0) nv = 1;
        if (nv >= n)
            st = dt_fail(DT_EINPUT, "prepare: %zu tokens are too few to split off a validation set", n);
    }
    const char *name = dt_tokenizer_name(t);
    int vocab = dt_tokenizer_vocab(t);
    if (st == DT_OK) st = dt_tokenfile_write(train_path, tok, n - nv, name, vocab);
    if (st == DT_OK && nv) st = dt_tokenfile_write(val_path, tok + (n - nv), nv, name, vocab);
    if (st == DT_OK && !nv && unlink(val_path) != 0 && errno != ENOENT)
        st = dt_fail(DT_ERUNTIME, "%s: cannot remove stale val file: %s", val_path, strerror(errno));
    free(tok);
    if (st == DT_OK) {
        if (ntrain) *ntrain = n - nv;
        if (nval) *nval = nv;
    }
    return st;
}
