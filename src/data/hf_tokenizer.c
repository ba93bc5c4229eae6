/* Hugging Face tokenizer.json, byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM, ...): the
 * model's vocabulary and merges, its added tokens (matched in the raw text first, longest
 * at a position), its normalizer (none or NFC, by utf8proc), its pre-tokenizer's regular
 * expression run by PCRE2 (a Split regex followed by ByteLevel, or ByteLevel's own GPT-2
 * regex), each piece the regex cuts (and each gap between matches) encoded by the shared
 * BPE engine (tokenizer.c), or whole when it is a token itself and the model sets
 * ignore_merges (Llama 3). Tokens are kept as their raw bytes (the byte-level alphabet's
 * characters mapped back), so decoding is the bytes of each id. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "../core/input_file.h"
#include "tokenizer_internal.h"

typedef struct {
    char *text;
    size_t len;
    uint32_t id;
} added_token;

struct dt_hf {
    pcre2_code *re;
    int nfc, ignore_merges;
    added_token *added; /* longest first */
    int nadded;
    unsigned char added_first[256]; /* a byte that starts some added token */
    uint32_t *sid;                  /* raw bytes -> id + 1 (0: empty), open addressing over t->bytes */
    size_t smask;
};

/* GPT-2's ByteLevel pattern (the regex a ByteLevel pre-tokenizer with use_regex runs) */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void dt_hf_free(struct dt_hf *hf) {
    if (!hf) return;
    pcre2_code_free(hf->re);
    for (int i = 0; i < hf->nadded; i++) free(hf->added[i].text);
    free(hf->added);
    free(hf->sid);
    free(hf);
}

/* ---- the byte-level alphabet: byte b is a printable code point itself, or 256 + n for
 * the n-th other byte; byte_of[cp] maps back (-1: not in the alphabet) ---- */

static void byte_level(int *byte_of) {
    int n = 0;
    for (int c = 0; c < 512; c++) byte_of[c] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_of[printable ? b : 256 + n++] = b;
    }
}

/* A vocabulary string's raw bytes into out (at most 4 bytes per character): byte-level
 * characters back to their byte, any other character as its UTF-8. Returns the length. */
static size_t unmap(const char *s, const int *byte_of, unsigned char *out) {
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    size_t k = 0, n = strlen(s);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t w = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (w <= 0) { /* not UTF-8: the byte itself */
            out[k++] = p[i++];
            continue;
        }
        if (cp < 512 && byte_of[cp] >= 0) out[k++] = (unsigned char)byte_of[cp];
        else memcpy(out + k, p + i, (size_t)w), k += (size_t)w;
        i += (size_t)w;
    }
    return k;
}

/* ---- raw bytes -> id ---- */

static size_t bytes_hash(const unsigned char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return dtk_hash64(h);
}
static long lookup(const dt_tokenizer *t, const unsigned char *s, size_t n) {
    const struct dt_hf *hf = t->hf;
    for (size_t i = bytes_hash(s, n) & hf->smask;; i = (i + 1) & hf->smask) {
        uint32_t v = hf->sid[i];
        if (!v) return -1;
        uint32_t id = v - 1, len = t->off[id + 1] - t->off[id];
        if (len == n && !memcmp(t->bytes + t->off[id], s, n)) return id;
    }
}
static void insert(dt_tokenizer *t, uint32_t id) {
    const unsigned char *s = t->bytes + t->off[id];
    size_t n = t->off[id + 1] - t->off[id];
    if (lookup(t, s, n) >= 0) return; /* the first id of a string keeps it */
    size_t i = bytes_hash(s, n) & t->hf->smask;
    while (t->hf->sid[i]) i = (i + 1) & t->hf->smask;
    t->hf->sid[i] = id + 1;
}

/* ---- loading ---- */

typedef struct {
    const char *path;
    int byte_of[512];
} loader;

static dt_status bad(const loader *l, const char *why) {
    return dt_fail(DT_EINPUT, "tokenizer '%s': %s", l->path, why);
}

/* The pre-tokenizer's regex: ByteLevel (with use_regex: GPT-2's), or Sequence[Split(Regex,
 * Isolated), ByteLevel(use_regex false)]; *pattern points into j or at GPT2_PATTERN. */
static dt_status pre_tokenizer(const loader *l, const cJSON *pt, const char **pattern) {
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pt, "type"));
    if (!type) return bad(l, "no pre_tokenizer (byte-level BPE needs ByteLevel)");
    if (!strcmp(type, "ByteLevel")) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "add_prefix_space")))
            return bad(l, "ByteLevel add_prefix_space true is not supported");
        if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(pt, "use_regex")))
            return bad(l, "a ByteLevel pre-tokenizer without a regex is not supported");
        *pattern = GPT2_PATTERN;
        return DT_OK;
    }
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    if (strcmp(type, "Sequence") != 0 || cJSON_GetArraySize(list) != 2)
        return dt_fail(DT_EINPUT, "tokenizer '%s': pre_tokenizer %s is not supported (ByteLevel, or Split then "
                       "ByteLevel)", l->path, type);
    const cJSON *split = cJSON_GetArrayItem(list, 0), *bl = cJSON_GetArrayItem(list, 1);
    const char *st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(split, "type"));
    const char *bt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bl, "type"));
    const char *behavior = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(split, "behavior"));
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
    const char *re = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pat, "Regex"));
    if (!st || strcmp(st, "Split") || !bt || strcmp(bt, "ByteLevel") || !re || !behavior ||
        strcmp(behavior, "Isolated") || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(split, "invert")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "use_regex")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "add_prefix_space")))
        return bad(l, "pre_tokenizer Sequence: only Split (a Regex, Isolated, not inverted) then ByteLevel "
                   "(no regex, no prefix space) is supported");
    *pattern = re;
    return DT_OK;
}

static dt_status compile(const loader *l, struct dt_hf *hf, const char *pattern) {
    int err;
    PCRE2_SIZE at;
    hf->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                           &err, &at, NULL);
    if (!hf->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dt_fail(DT_EINPUT, "tokenizer '%s': the pre-tokenizer regex does not compile at %zu: %s", l->path,
                       (size_t)at, (const char *)msg);
    }
    (void)pcre2_jit_compile(hf->re, PCRE2_JIT_COMPLETE); /* the interpreter when the JIT is unavailable */
    return DT_OK;
}

/* Token id's raw bytes and the table's size; ids never given bytes stay empty. */
typedef struct {
    unsigned char *bytes;
    size_t len;
} raw;

static int cmp_added(const void *a, const void *b) {
    const added_token *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : (x->id > y->id) - (x->id < y->id);
}

/* The id of tokenizer_config.json's eos_token next to the file, or -1 */
static int eos_of(const dt_tokenizer *t, const char *path) {
    char cfg[4096];
    const char *slash = strrchr(path, '/');
    int dir = slash ? (int)(slash - path) : 0;
    snprintf(cfg, sizeof cfg, "%.*s%stokenizer_config.json", dir, path, slash ? "/" : "");
    char *text;
    size_t len;
    if (dt_input_read(cfg, "tokenizer_config.json", &text, &len, (size_t)64 << 20) != DT_OK) {
        dt_error_clear();
        return -1;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token");
    const char *s = cJSON_IsString(e) ? e->valuestring : cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "content"));
    long id = s ? lookup(t, (const unsigned char *)s, strlen(s)) : -1;
    for (int i = 0; s && id < 0 && i < t->hf->nadded; i++)
        if (!strcmp(t->hf->added[i].text, s)) id = t->hf->added[i].id;
    cJSON_Delete(j);
    return (int)id;
}

static dt_status build(dt_tokenizer *t, loader *l, const cJSON *j) {
    struct dt_hf *hf = t->hf;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(model, "type"));
    if (!mt || strcmp(mt, "BPE") != 0)
        return dt_fail(DT_EINPUT, "tokenizer '%s': model type %s is not supported (byte-level BPE)", l->path,
                       mt ? mt : "(none)");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return bad(l, "byte_fallback BPE (SentencePiece-style: Llama 2, Mistral v1) is not supported");
    const cJSON *csp = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    const cJSON *eow = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    if ((cJSON_IsString(csp) && *csp->valuestring) || (cJSON_IsString(eow) && *eow->valuestring))
        return bad(l, "subword prefixes or suffixes are not supported");
    hf->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const char *nt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(norm, "type"));
        if (!nt || strcmp(nt, "NFC") != 0)
            return dt_fail(DT_EINPUT, "tokenizer '%s': normalizer %s is not supported (none or NFC)", l->path,
                           nt ? nt : "(none)");
        hf->nfc = 1;
    }
    const char *pattern;
    DT_TRY(pre_tokenizer(l, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"), &pattern));
    DT_TRY(compile(l, hf, pattern));

    /* ids: the vocabulary's and the added tokens' */
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    if (!cJSON_IsObject(vocab)) return bad(l, "model.vocab is not an object");
    long maxid = -1;
    size_t total = 0;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (1 << 24) || !v->string)
            return bad(l, "a vocabulary id is not in 0 .. 2^24");
        if ((long)v->valuedouble > maxid) maxid = (long)v->valuedouble;
        total += 4 * strlen(v->string);
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        const char *c = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "content"));
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) || !c || !*c)
            return bad(l, "an added token without an id in 0 .. 2^24 or content");
        if ((long)id->valuedouble > maxid) maxid = (long)id->valuedouble;
        total += strlen(c);
        hf->nadded++;
    }
    if (maxid < 255) return bad(l, "the vocabulary is smaller than the byte alphabet");
    size_t V = (size_t)maxid + 1;
    raw *tok = calloc(V, sizeof *tok);
    unsigned char *pool = malloc(total + 1);
    hf->added = calloc(hf->nadded ? (size_t)hf->nadded : 1, sizeof *hf->added);
    t->off = malloc((V + 1) * sizeof *t->off);
    t->bytes = malloc(total + 1);
    hf->smask = dtk_pow2_at_least(2 * V) - 1;
    hf->sid = calloc(hf->smask + 1, sizeof *hf->sid);
    dt_status s = tok && pool && hf->added && t->off && t->bytes && hf->sid ? DT_OK
                                                                             : dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
    size_t used = 0;
    for (const cJSON *v = vocab->child; s == DT_OK && v; v = v->next) {
        raw *r = &tok[(size_t)v->valuedouble];
        r->bytes = pool + used;
        r->len = unmap(v->string, l->byte_of, r->bytes);
        used += r->len;
    }
    int k = 0;
    for (const cJSON *a = added ? added->child : NULL; s == DT_OK && a; a = a->next, k++) {
        const char *c = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "content"));
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        hf->added[k] = (added_token){strdup(c), strlen(c), id};
        if (!hf->added[k].text) s = dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
        else hf->added_first[(unsigned char)c[0]] = 1;
        if (!tok[id].bytes) { /* its text is its bytes */
            tok[id].bytes = pool + used;
            tok[id].len = strlen(c);
            memcpy(tok[id].bytes, c, tok[id].len);
            used += tok[id].len;
        }
    }
    if (s == DT_OK) {
        qsort(hf->added, (size_t)hf->nadded, sizeof *hf->added, cmp_added);
        t->vocab = (int)V;
        t->off[0] = 0;
        for (size_t i = 0; i < V; i++) {
            memcpy(t->bytes + t->off[i], tok[i].bytes, tok[i].len);
            t->off[i + 1] = t->off[i] + (uint32_t)tok[i].len;
        }
        for (size_t i = 0; i < V; i++)
            if (tok[i].bytes) insert(t, (uint32_t)i);
        for (int b = 0; s == DT_OK && b < 256; b++) {
            unsigned char c = (unsigned char)b;
            long id = lookup(t, &c, 1);
            if (id < 0) s = dt_fail(DT_EINPUT, "tokenizer '%s': the vocabulary lacks byte 0x%02x", l->path, b);
            else t->byte_id[b] = (uint32_t)id;
        }
    }
    /* merges: "a b" strings or [a, b] pairs, in rank order */
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (s == DT_OK && !cJSON_IsArray(merges)) s = bad(l, "model.merges is not a list");
    if (s == DT_OK) s = dtk_merge_alloc(t, (size_t)cJSON_GetArraySize(merges) + 1);
    unsigned char *buf = s == DT_OK ? malloc(4096) : NULL;
    if (s == DT_OK && !buf) s = dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
    uint32_t rank = 0;
    for (const cJSON *m = merges ? merges->child : NULL; s == DT_OK && m; m = m->next, rank++) {
        const char *a = NULL, *b = NULL;
        char pair[2048];
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            size_t la = sp ? (size_t)(sp - m->valuestring) : 0;
            if (!sp || la >= sizeof pair || strchr(sp + 1, ' ')) {
                s = dt_fail(DT_EINPUT, "tokenizer '%s': merge %u ('%.40s') is not two tokens", l->path, rank,
                            m->valuestring);
                break;
            }
            memcpy(pair, m->valuestring, la);
            pair[la] = 0;
            a = pair, b = sp + 1;
        } else if (cJSON_GetArraySize(m) == 2) {
            a = cJSON_GetStringValue(cJSON_GetArrayItem(m, 0)), b = cJSON_GetStringValue(cJSON_GetArrayItem(m, 1));
        }
        if (!a || !b || 4 * (strlen(a) + strlen(b)) >= 4096) {
            s = dt_fail(DT_EINPUT, "tokenizer '%s': merge %u is not two tokens", l->path, rank);
            break;
        }
        size_t na = unmap(a, l->byte_of, buf), nb = unmap(b, l->byte_of, buf + na);
        long ia = lookup(t, buf, na), ib = lookup(t, buf + na, nb), iab = lookup(t, buf, na + nb);
        if (ia < 0 || ib < 0 || iab < 0)
            s = dt_fail(DT_EINPUT, "tokenizer '%s': merge %u ('%.40s' + '%.40s') names a token not in the vocabulary",
                        l->path, rank, a, b);
        else dtk_merge_put(t, (unsigned)ia, (unsigned)ib, rank, (uint32_t)iab);
    }
    free(buf);
    free(tok);
    free(pool);
    if (s == DT_OK) t->eot = eos_of(t, l->path);
    return s;
}

dt_status dt_tokenizer_hf(dt_tokenizer **out, const char *path) {
    *out = NULL;
    char *text;
    size_t len;
    DT_TRY(dt_input_read(path, "--tokenizer", &text, &len, (size_t)1 << 30));
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dt_fail(DT_EINPUT, "tokenizer '%s': not a tokenizer.json (JSON object)", path);
    }
    dt_tokenizer *t = calloc(1, sizeof *t);
    loader l = {.path = path};
    byte_level(l.byte_of);
    dt_status s = t ? DT_OK : dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
    if (s == DT_OK) {
        t->bpe = 1;
        t->hf = calloc(1, sizeof *t->hf);
        s = t->hf ? build(t, &l, j) : dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
    }
    cJSON_Delete(j);
    if (s != DT_OK) {
        dt_tokenizer_free(t);
        return s;
    }
    *out = t;
    return DT_OK;
}

/* ---- encoding ---- */

typedef struct {
    const dt_tokenizer *t;
    dtk_scratch *sc;
    pcre2_match_data *md;
    uint32_t **buf;
    size_t *n, *cap;
} enc;

static dt_status piece(enc *e, const unsigned char *w, size_t m) {
    if (!m) return DT_OK;
    if (e->t->hf->ignore_merges) {
        long id = lookup(e->t, w, m);
        if (id >= 0) return dtk_append_id(e->buf, e->n, e->cap, (uint32_t)id);
    }
    return dtk_bpe_append(e->t, e->sc, w, m, e->buf, e->n, e->cap);
}

/* The pre-tokenizer's pieces of s[0..n) (no added token inside): each match, and each gap
 * between matches (Split's Isolated behaviour) */
static dt_status plain(enc *e, const unsigned char *s, size_t n) {
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(e->t->hf->re, s, n, pos, PCRE2_NOTEMPTY_ATSTART, e->md, NULL);
        if (rc < 0) {
            if (rc != PCRE2_ERROR_NOMATCH) return dt_fail(DT_ERUNTIME, "tokenizer: regex match failed (%d)", rc);
            return piece(e, s + pos, n - pos);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        if (ov[0] > pos) DT_TRY(piece(e, s + pos, ov[0] - pos));
        DT_TRY(piece(e, s + ov[0], ov[1] - ov[0]));
        pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
    }
    return DT_OK;
}

/* The added token at s (the longest), or NULL */
static const added_token *added_at(const struct dt_hf *hf, const unsigned char *s, size_t n) {
    if (!hf->added_first[s[0]]) return NULL;
    for (int i = 0; i < hf->nadded; i++)
        if (hf->added[i].len <= n && !memcmp(s, hf->added[i].text, hf->added[i].len)) return &hf->added[i];
    return NULL;
}

static dt_status encode_text(enc *e, const unsigned char *s, size_t n) {
    size_t from = 0;
    for (size_t i = 0; i < n;) {
        const added_token *a = added_at(e->t->hf, s + i, n - i);
        if (!a) {
            i++;
            continue;
        }
        DT_TRY(plain(e, s + from, i - from));
        DT_TRY(dtk_append_id(e->buf, e->n, e->cap, a->id));
        i += a->len;
        from = i;
    }
    return plain(e, s + from, n - from);
}

dt_status dt_hf_encode(const dt_tokenizer *t, const char *text, size_t len, uint32_t **buf, size_t *n, size_t *cap) {
    enc e = {t, dtk_scratch_new(), pcre2_match_data_create_from_pattern(t->hf->re, NULL), buf, n, cap};
    dt_status s = e.sc && e.md ? DT_OK : dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
    unsigned char *nfc = NULL;
    const unsigned char *in = (const unsigned char *)text;
    if (s == DT_OK && t->hf->nfc && len) {
        utf8proc_uint8_t *out = NULL;
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &out,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0) s = dt_fail(DT_EINPUT, "tokenizer: the text is not valid UTF-8 (NFC: %s)", utf8proc_errmsg(m));
        else nfc = out, in = out, len = (size_t)m;
    }
    if (s == DT_OK) s = encode_text(&e, in, len);
    free(nfc);
    pcre2_match_data_free(e.md);
    dtk_scratch_free(e.sc);
    return s;
}
