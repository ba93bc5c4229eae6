/* Loading GPT-2's published tokenizer files (encoder.json and vocab.bpe) into a tokenizer:
 * the byte alphabet, the vocabulary, the merges, each validated as untrusted input. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/input_file.h"
#include "pretokenize.h"
#include "tokenizer_internal.h"

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
 * bytes for U+0100.. in byte order. unichar_byte is the inverse (-1: not in the alphabet). */
static void byte_alphabet(int16_t unichar_byte[324]) {
    for (int c = 0; c < 324; c++) unichar_byte[c] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unichar_byte[printable ? b : 256 + n++] = (int16_t)b;
    }
}

/* Maps a token string (UTF-8 of alphabet characters) to its bytes; dst may be NULL to count.
 * Returns the byte count, or -1 if a character is outside the alphabet. */
static long unichars_to_bytes(const int16_t *unichar_byte, const char *s, size_t n, unsigned char *dst) {
    size_t i = 0;
    long k = 0;
    while (i < n) {
        size_t w;
        uint32_t cp = dt_utf8_at((const unsigned char *)s, n, i, &w);
        if (cp >= 324 || unichar_byte[cp] < 0) return -1;
        if (dst) dst[k] = (unsigned char)unichar_byte[cp];
        k++;
        i += w;
    }
    return k;
}

/* Byte string -> token id, used only while loading (merges name tokens by string). */
typedef struct {
    int32_t *slot;
    size_t mask;
} strmap;

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int strmap_find(const strmap *m, const dt_tokenizer *t, const unsigned char *p, size_t n) {
    for (size_t h = dtk_hash64(hash_bytes(p, n)) & m->mask;; h = (h + 1) & m->mask) {
        int32_t id = m->slot[h];
        if (id < 0) return -1;
        if (t->off[id + 1] - t->off[id] == n && memcmp(t->bytes + t->off[id], p, n) == 0) return id;
    }
}


static dt_status load_encoder(dt_tokenizer *t, strmap *map, const char *path, const int16_t *unichar_byte) {
    char *text;
    size_t len;
    DT_TRY(dt_input_read(path, "data.encoder_json", &text, &len, (size_t)1 << 30));
    dt_status st = DT_OK;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_fail(DT_EINPUT, "%s: malformed JSON (expected an object mapping token strings to ids)", path);
    }
    int n = cJSON_GetArraySize(root);
    if (n < 256 || n > 65536) {
        cJSON_Delete(root);
        return dt_fail(DT_EINPUT, "%s: %d tokens, expected 256..65536", path, n);
    }
    t->vocab = n;
    t->off = calloc((size_t)n + 1, sizeof *t->off);
    uint32_t *tlen = calloc((size_t)n, sizeof *tlen);
    char *seen = calloc((size_t)n, 1);
    if (!t->off || !tlen || !seen) {
        st = dt_fail(DT_ERUNTIME, "%s: out of memory", path);
        goto done;
    }
    /* Pass 1: validate ids (dense 0..n-1, each once) and measure token lengths. */
    const cJSON *e;
    size_t total = 0;
    cJSON_ArrayForEach(e, root) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!e->string || v < 0 || v >= n || v != (double)(int)v) {
            st = dt_fail(DT_EINPUT, "%s: entry \"%.40s\": id must be an integer in 0..%d", path,
                         e->string ? e->string : "", n - 1);
            goto done;
        }
        int id = (int)v;
        if (seen[id]) {
            st = dt_fail(DT_EINPUT, "%s: id %d used twice", path, id);
            goto done;
        }
        seen[id] = 1;
        long k = unichars_to_bytes(unichar_byte, e->string, strlen(e->string), NULL);
        if (k <= 0) {
            st = dt_fail(DT_EINPUT, "%s: token \"%.40s\" is empty or not in GPT-2's byte alphabet", path, e->string);
            goto done;
        }
        tlen[id] = (uint32_t)k;
        total += (size_t)k;
    }
    for (int i = 0; i < n; i++) t->off[i + 1] = t->off[i] + tlen[i];
    t->bytes = malloc(total ? total : 1);
    map->mask = dtk_pow2_at_least((size_t)n * 2) - 1;
    map->slot = malloc((map->mask + 1) * sizeof *map->slot);
    if (!t->bytes || !map->slot) {
        st = dt_fail(DT_ERUNTIME, "%s: out of memory", path);
        goto done;
    }
    memset(map->slot, 0xff, (map->mask + 1) * sizeof *map->slot);
    /* Pass 2: token bytes, and the string -> id map (token strings must be distinct). */
    cJSON_ArrayForEach(e, root) {
        int id = (int)e->valuedouble;
        unsigned char *p = t->bytes + t->off[id];
        unichars_to_bytes(unichar_byte, e->string, strlen(e->string), p);
        if (strmap_find(map, t, p, tlen[id]) >= 0) {
            st = dt_fail(DT_EINPUT, "%s: token \"%.40s\" appears twice", path, e->string);
            goto done;
        }
        size_t h = dtk_hash64(hash_bytes(p, tlen[id])) & map->mask;
        while (map->slot[h] >= 0) h = (h + 1) & map->mask;
        map->slot[h] = id;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        int id = strmap_find(map, t, &c, 1);
        if (id < 0) {
            st = dt_fail(DT_EINPUT, "%s: no token for byte 0x%02x", path, b);
            goto done;
        }
        t->byte_id[b] = (uint32_t)id;
    }
    t->eot = strmap_find(map, t, (const unsigned char *)"<|endoftext|>", 13);
done:
    free(tlen);
    free(seen);
    cJSON_Delete(root);
    return st;
}

/* vocab.bpe: "#version" line, then one merge "A B" per line, ranked by line order. */
static dt_status load_merges(dt_tokenizer *t, const strmap *map, const char *path, const int16_t *unichar_byte) {
    char *text;
    size_t len;
    DT_TRY(dt_input_read(path, "data.vocab_bpe", &text, &len, (size_t)1 << 30));
    dt_status st = DT_OK;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    unsigned char *tmp = malloc(len + 1);
    if (dtk_merge_alloc(t, lines) != DT_OK || !tmp) {
        st = dt_fail(DT_ERUNTIME, "%s: out of memory", path);
        goto done;
    }
    uint32_t rank = 0;
    size_t lineno = 0;
    for (char *line = text; line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        char *next = nl ? nl + 1 : text + len;
        lineno++;
        if (end > line && end[-1] == '\r') end--;
        size_t n = (size_t)(end - line);
        if (n == 0 || (lineno == 1 && n >= 8 && memcmp(line, "#version", 8) == 0)) {
            line = next;
            continue;
        }
        char *sp = memchr(line, ' ', n);
        size_t na = sp ? (size_t)(sp - line) : 0, nb = sp ? n - na - 1 : 0;
        if (!sp || na == 0 || nb == 0 || memchr(sp + 1, ' ', nb)) {
            st = dt_fail(DT_EINPUT, "%s:%zu: bad merges line \"%.*s\" (expected two symbols)", path, lineno,
                         (int)(n < 60 ? n : 60), line);
            goto done;
        }
        long ka = unichars_to_bytes(unichar_byte, line, na, tmp);
        long kb = ka < 0 ? -1 : unichars_to_bytes(unichar_byte, sp + 1, nb, tmp + ka);
        int a = ka > 0 ? strmap_find(map, t, tmp, (size_t)ka) : -1;
        int b = kb > 0 ? strmap_find(map, t, tmp + ka, (size_t)kb) : -1;
        int ab = a >= 0 && b >= 0 ? strmap_find(map, t, tmp, (size_t)(ka + kb)) : -1;
        if (ab < 0) {
            st = dt_fail(DT_EINPUT, "%s:%zu: bad merges line \"%.*s\" (%s not in the encoder)", path, lineno,
                         (int)(n < 60 ? n : 60), line,
                         a < 0 ? "first symbol" : b < 0 ? "second symbol" : "merged token");
            goto done;
        }
        dtk_merge_put(t, (unsigned)a, (unsigned)b, rank++, (uint32_t)ab);
        line = next;
    }
done:
    free(tmp);
    free(text);
    return st;
}

dt_status dt_tokenizer_gpt2(dt_tokenizer **out, const char *encoder_json, const char *vocab_bpe) {
    *out = NULL;
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dt_fail(DT_ERUNTIME, "out of memory creating GPT-2 tokenizer");
    t->bpe = 1;
    int16_t unichar_byte[324];
    byte_alphabet(unichar_byte);
    strmap map = {0};
    dt_status st = load_encoder(t, &map, encoder_json, unichar_byte);
    if (st == DT_OK) st = load_merges(t, &map, vocab_bpe, unichar_byte);
    free(map.slot);
    if (st != DT_OK) {
        dt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DT_OK;
}
