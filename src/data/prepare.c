#include "prepare.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/input_file.h"
#include "pretokenize.h"
#include "tokenfile.h"

int dt_prep_format_of(const char *name, dt_prep_format *f) {
    static const char *const names[] = {"text", "fortune", "jsonl", "prompt", "chat"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(name, names[i])) {
            *f = (dt_prep_format)i;
            return 0;
        }
    return -1;
}

/* The documents so far: the token stream, a mask byte per token, where each document starts. */
typedef struct {
    const dt_tokenizer *t;
    uint32_t *tok;
    size_t n, cap;
    uint8_t *mask;
    size_t mask_cap;
    uint64_t *start;
    size_t ndocs, start_cap;
    int masked; /* some token is out of the loss */
    const char *where; /* the input file, for messages */
    long line;         /* its line (JSON Lines), 0 for a whole file */
} docs;

static dt_status grow_mask(docs *d) {
    if (d->mask_cap >= d->cap) return DT_OK;
    uint8_t *m = realloc(d->mask, d->cap + 1);
    if (!m) return dt_fail(DT_ERUNTIME, "prepare: out of memory");
    d->mask = m;
    d->mask_cap = d->cap;
    return DT_OK;
}

/* Appends text's tokens, in the loss or not. */
static dt_status add_text(docs *d, const char *text, size_t len, int in_loss) {
    size_t from = d->n;
    dt_status s = dt_tokenizer_encode(d->t, text, len, &d->tok, &d->n, &d->cap);
    if (s != DT_OK) {
        if (d->line) dt_error_context("%s line %ld", d->where, d->line);
        else dt_error_context("%s", d->where);
        return s;
    }
    if (d->n == from) return DT_OK; /* nothing encoded (the buffers may not exist yet) */
    DT_TRY(grow_mask(d));
    memset(d->mask + from, in_loss ? 1 : 0, d->n - from);
    if (!in_loss) d->masked = 1;
    return DT_OK;
}

static dt_status add_token(docs *d, uint32_t id) {
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 4096;
        uint32_t *p = realloc(d->tok, c * sizeof *p);
        if (!p) return dt_fail(DT_ERUNTIME, "prepare: out of memory");
        d->tok = p;
        d->cap = c;
    }
    DT_TRY(grow_mask(d));
    d->mask[d->n] = 1;
    d->tok[d->n++] = id;
    return DT_OK;
}

static dt_status begin_doc(docs *d) {
    if (d->ndocs + 1 >= d->start_cap) {
        size_t c = d->start_cap ? d->start_cap * 2 : 1024;
        uint64_t *p = realloc(d->start, c * sizeof *p);
        if (!p) return dt_fail(DT_ERUNTIME, "prepare: out of memory");
        d->start = p;
        d->start_cap = c;
    }
    d->start[d->ndocs] = d->n;
    return DT_OK;
}

/* The document's end (eot, or a newline where its text does not end in one), in the loss:
 * predicting where a document ends is part of learning it. last: its last character. */
static dt_status end_doc(docs *d, int last) {
    int eot = dt_tokenizer_eot(d->t);
    if (eot >= 0) DT_TRY(add_token(d, (uint32_t)eot));
    else if (last != '\n') DT_TRY(add_text(d, "\n", 1, 1));
    if (d->n == d->start[d->ndocs]) {
        if (d->line) return dt_fail(DT_EINPUT, "prepare: %s line %ld: an empty document", d->where, d->line);
        return dt_fail(DT_EINPUT, "prepare: %s: an empty document", d->where);
    }
    d->ndocs++;
    return DT_OK;
}

/* Text must be valid UTF-8: the GPT-2 tokenizer's classes and the byte tokenizer's text
 * both assume it; a file of another encoding is named, not silently garbled. */
static dt_status check_utf8(const docs *d, const char *s, size_t n, const char *what) {
    for (size_t i = 0; i < n;) {
        size_t w;
        if (dt_utf8_at((const unsigned char *)s, n, i, &w) == DT_CP_INVALID) {
            if (d->line)
                return dt_fail(DT_EINPUT, "prepare: %s line %ld: invalid UTF-8 in %s at byte %zu", d->where, d->line,
                               what, i);
            return dt_fail(DT_EINPUT, "prepare: %s: invalid UTF-8 at byte offset %zu", d->where, i);
        }
        i += w;
    }
    return DT_OK;
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

/* One text document (text, or a fortune entry); an empty one is passed over. */
static dt_status text_doc(docs *d, const char *s, size_t n) {
    if (n == 0) return DT_OK;
    DT_TRY(begin_doc(d));
    DT_TRY(add_text(d, s, n, 1));
    return end_doc(d, (unsigned char)s[n - 1]);
}

/* fortune(6): entries end at a line that is exactly "%", which becomes an empty line at
 * the entry's end (so the byte stream is the file's with each "%" removed). */
static dt_status fortune_docs(docs *d, char *s, size_t n) {
    size_t w = 0, entry = 0;
    for (size_t i = 0; i < n; i++) {
        int line_start = i == 0 || s[i - 1] == '\n';
        if (line_start && s[i] == '%' && (i + 1 == n || s[i + 1] == '\n')) {
            if (i + 1 < n) s[w++] = s[++i]; /* the line's newline stays, the entry ends with it */
            DT_TRY(text_doc(d, s + entry, w - entry));
            entry = w;
            continue;
        }
        s[w++] = s[i];
    }
    return text_doc(d, s + entry, w - entry);
}

/* The string field key of a JSON object, its length in *len; NULL with the error set. */
static const char *string_field(docs *d, const cJSON *obj, const char *key, size_t *len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(v) || !v->valuestring) {
        if (v) dt_fail(DT_EINPUT, "prepare: %s line %ld: \"%s\" is not a string", d->where, d->line, key);
        else dt_fail(DT_EINPUT, "prepare: %s line %ld: no \"%s\" field", d->where, d->line, key);
        return NULL;
    }
    *len = strlen(v->valuestring);
    if (check_utf8(d, v->valuestring, *len, key) != DT_OK) return NULL;
    return v->valuestring;
}

/* One JSON Lines record as a document. */
static dt_status json_doc(docs *d, const cJSON *obj, const dt_prep_opts *o) {
    size_t a, b;
    const char *x, *y;
    DT_TRY(begin_doc(d));
    switch (o->format) {
    case DT_PREP_JSONL:
        if (!(x = string_field(d, obj, o->field ? o->field : "text", &a))) return DT_EINPUT;
        if (!a) return dt_fail(DT_EINPUT, "prepare: %s line %ld: an empty document", d->where, d->line);
        DT_TRY(add_text(d, x, a, 1));
        return end_doc(d, a ? (unsigned char)x[a - 1] : '\n');
    case DT_PREP_PROMPT:
        if (!(x = string_field(d, obj, "prompt", &a)) || !(y = string_field(d, obj, "completion", &b))) return DT_EINPUT;
        if (!b) return dt_fail(DT_EINPUT, "prepare: %s line %ld: an empty completion", d->where, d->line);
        DT_TRY(add_text(d, x, a, 0));
        DT_TRY(add_text(d, y, b, 1));
        return end_doc(d, (unsigned char)y[b - 1]);
    default: { /* chat */
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages"), *m;
        if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
            return dt_fail(DT_EINPUT, "prepare: %s line %ld: no \"messages\" array (of role/content objects)", d->where,
                           d->line);
        int assistant = 0;
        cJSON_ArrayForEach(m, msgs) {
            if (!cJSON_IsObject(m))
                return dt_fail(DT_EINPUT, "prepare: %s line %ld: a message that is not an object", d->where, d->line);
            if (!(x = string_field(d, m, "role", &a)) || !(y = string_field(d, m, "content", &b))) return DT_EINPUT;
            int mine = !strcmp(x, "assistant");
            if (!mine && strcmp(x, "user") && strcmp(x, "system"))
                return dt_fail(DT_EINPUT, "prepare: %s line %ld: role \"%s\" (system, user or assistant)", d->where,
                               d->line, x);
            assistant |= mine;
            DT_TRY(add_text(d, x, a, 0));
            DT_TRY(add_text(d, ": ", 2, 0));
            DT_TRY(add_text(d, y, b, mine));
            DT_TRY(add_text(d, "\n", 1, mine));
        }
        if (!assistant)
            return dt_fail(DT_EINPUT, "prepare: %s line %ld: no assistant message (nothing to learn)", d->where,
                           d->line);
        return end_doc(d, '\n');
    }
    }
}

static dt_status jsonl_docs(docs *d, char *s, size_t n, const dt_prep_opts *o) {
    d->line = 0;
    size_t i = n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a UTF-8 byte order mark is not part of line 1 */
    while (i < n) {
        char *nl = memchr(s + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - s) : n;
        d->line++;
        if (memchr(s + i, 0, e - i)) /* the JSON parser would stop there and drop the rest */
            return dt_fail(DT_EINPUT, "prepare: %s line %ld: a NUL byte", d->where, d->line);
        s[e] = 0; /* a line at a time (the buffer has a byte past n) */
        const char *p = s + i;
        while (*p == ' ' || *p == '\t' || *p == '\r') p++;
        if (*p) { /* blank lines are passed over */
            cJSON *obj = cJSON_ParseWithOpts(p, NULL, 1);
            dt_status st = cJSON_IsObject(obj)
                               ? json_doc(d, obj, o)
                               : dt_fail(DT_EINPUT, "prepare: %s line %ld: not a JSON object", d->where, d->line);
            cJSON_Delete(obj);
            DT_TRY(st);
        }
        i = e + 1;
    }
    d->line = 0;
    return DT_OK;
}

/* The train/val cut: the document boundary nearest n - nv, if it is within nv/2 of it (so
 * val holds about the fraction asked for); else n - nv, inside a document. */
static size_t val_cut(const docs *d, size_t nv) {
    size_t want = d->n - nv, best = 0;
    for (size_t k = 1; k < d->ndocs; k++) {
        size_t b = (size_t)d->start[k];
        if (!best || (b > want ? b - want : want - b) < (best > want ? best - want : want - best)) best = b;
    }
    size_t off = best > want ? best - want : want - best;
    return best && 2 * off <= nv ? best : want;
}

/* Writes tokens [lo, hi) with their documents (cut at lo and hi) and mask. */
static dt_status write_part(const docs *d, const char *path, size_t lo, size_t hi) {
    size_t first = 0, last = 0;
    while (first + 1 < d->ndocs && d->start[first + 1] <= lo) first++;
    last = first;
    while (last < d->ndocs && d->start[last] < hi) last++;
    size_t nd = last - first;
    uint64_t *st = malloc((nd + 1) * sizeof *st);
    if (!st) return dt_fail(DT_ERUNTIME, "prepare: out of memory");
    for (size_t k = 0; k < nd; k++) st[k] = (d->start[first + k] > lo ? d->start[first + k] : lo) - lo;
    st[nd] = hi - lo;
    dt_status s = dt_tokenfile_write_docs(path, d->tok + lo, hi - lo, st, nd, d->masked ? d->mask + lo : NULL,
                                          dt_tokenizer_name(d->t), dt_tokenizer_vocab(d->t));
    free(st);
    return s;
}

dt_status dt_prepare_check_out(const char *out) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash) return DT_OK;
    *slash = 0;
    if (dir[0] && access(dir, W_OK) != 0)
        return dt_fail(DT_EINPUT, "prepare: --out %s: directory '%s' %s", out, dir,
                       access(dir, F_OK) ? "does not exist" : "is not writable");
    return DT_OK;
}

dt_status dt_prepare(const dt_tokenizer *t, const char *const *inputs, int ninputs, const char *out_prefix,
                     const dt_prep_opts *o, size_t *ntrain, size_t *nval, size_t *ndocs) {
    if (ntrain) *ntrain = 0;
    if (nval) *nval = 0;
    if (ndocs) *ndocs = 0;
    if (ninputs < 1) return dt_fail(DT_EINPUT, "prepare: no input files");
    if (!out_prefix || !*out_prefix) return dt_fail(DT_EINPUT, "prepare: empty output prefix");
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return dt_fail(DT_EINPUT, "prepare: val fraction %g must be in [0, 1)", o->val_fraction);
    if (dt_tokenizer_vocab(t) > (1 << 24))
        return dt_fail(DT_EINPUT, "prepare: vocab %d exceeds 16777216", dt_tokenizer_vocab(t));
    char train_path[PATH_MAX], val_path[PATH_MAX];
    if ((size_t)snprintf(train_path, sizeof train_path, "%s_train.bin", out_prefix) >= sizeof train_path ||
        (size_t)snprintf(val_path, sizeof val_path, "%s_val.bin", out_prefix) >= sizeof val_path)
        return dt_fail(DT_EINPUT, "prepare: output prefix too long");

    docs d = {.t = t};
    dt_status st = DT_OK;
    for (int k = 0; k < ninputs && st == DT_OK; k++) {
        char *text;
        size_t len;
        st = dt_input_read(inputs[k], "prepare --input", &text, &len, (size_t)1 << 36);
        if (st != DT_OK) break;
        d.where = inputs[k];
        d.line = 0;
        st = check_text(inputs[k], text, len);
        if (st == DT_OK && o->format <= DT_PREP_FORTUNE) st = check_utf8(&d, text, len, "the text");
        if (st == DT_OK && o->format == DT_PREP_TEXT) st = text_doc(&d, text, len);
        else if (st == DT_OK && o->format == DT_PREP_FORTUNE) st = fortune_docs(&d, text, len);
        else if (st == DT_OK) st = jsonl_docs(&d, text, len, o);
        free(text);
    }
    size_t nv = 0, cut = d.n;
    if (st == DT_OK && d.n == 0) st = dt_fail(DT_EINPUT, "prepare: the inputs contain no text");
    if (st == DT_OK && o->val_fraction > 0) {
        nv = (size_t)((double)d.n * o->val_fraction);
        if (nv == 0) nv = 1;
        if (nv >= d.n) st = dt_fail(DT_EINPUT, "prepare: %zu tokens are too few to split off a validation set", d.n);
        else cut = val_cut(&d, nv);
    }
    if (st == DT_OK) st = write_part(&d, train_path, 0, cut);
    if (st == DT_OK && cut < d.n) st = write_part(&d, val_path, cut, d.n);
    if (st == DT_OK && cut == d.n && unlink(val_path) != 0 && errno != ENOENT)
        st = dt_fail(DT_ERUNTIME, "%s: cannot remove stale val file: %s", val_path, strerror(errno));
    if (st == DT_OK) {
        if (ntrain) *ntrain = cut;
        if (nval) *nval = d.n - cut;
        if (ndocs) *ndocs = d.ndocs;
    }
    free(d.tok);
    free(d.mask);
    free(d.start);
    return st;
}
