/* The tokenizer object: the byte tokenizer, GPT-2's merge table, BPE encoding over the
 * pre-tokens (pretokenize.h) and decoding. Loading GPT-2's files: gpt2_files.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pretokenize.h"
#include "tokenizer_internal.h"


static int merge_find(const dt_tokenizer *t, unsigned a, unsigned b, uint32_t *rank, uint32_t *out) {
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    for (size_t h = dtk_hash64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        if (t->mkey[h] == key) {
            *rank = t->mrank[h];
            *out = t->mout[h];
            return 1;
        }
        if (t->mkey[h] == 0) return 0;
    }
}

/* Later duplicates overwrite the rank, as dict(zip(merges, range(n))) does in the reference. */
dt_status dtk_merge_alloc(dt_tokenizer *t, size_t n) {
    t->mmask = dtk_pow2_at_least(n * 2) - 1;
    t->mkey = calloc(t->mmask + 1, sizeof *t->mkey);
    t->mrank = malloc((t->mmask + 1) * sizeof *t->mrank);
    t->mout = malloc((t->mmask + 1) * sizeof *t->mout);
    return t->mkey && t->mrank && t->mout ? DT_OK : dt_fail(DT_ERUNTIME, "tokenizer: out of memory (merges)");
}

void dtk_merge_put(dt_tokenizer *t, unsigned a, unsigned b, uint32_t rank, uint32_t out) {
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    size_t h = dtk_hash64(key) & t->mmask;
    while (t->mkey[h] != 0 && t->mkey[h] != key) h = (h + 1) & t->mmask;
    t->mkey[h] = key;
    t->mrank[h] = rank;
    t->mout[h] = out;
}

void dt_tokenizer_free(dt_tokenizer *t) {
    if (!t) return;
    free(t->off);
    free(t->bytes);
    free(t->mkey);
    free(t->mrank);
    free(t->mout);
    dt_hf_free(t->hf);
    free(t);
}

dt_status dt_tokenizer_byte(dt_tokenizer **out) {
    *out = NULL;
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dt_fail(DT_ERUNTIME, "out of memory creating byte tokenizer");
    t->vocab = 256;
    t->eot = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = (uint32_t)b;
    *out = t;
    return DT_OK;
}

int dt_tokenizer_vocab(const dt_tokenizer *t) { return t->vocab; }
int dt_tokenizer_eot(const dt_tokenizer *t) { return t->eot; }
const char *dt_tokenizer_name(const dt_tokenizer *t) { return t->hf ? "hf" : t->bpe ? "gpt2" : "byte"; }


/* ---- encoding ---- */

typedef struct {
    uint32_t rank;
    int32_t pos; /* left symbol of the pair */
    uint32_t a, b, out;
} pair_ent;

/* Per-call working memory for bpe(), grown to the longest pre-token seen. */
typedef struct {
    uint32_t *id;
    int32_t *prev, *next, *list;
    size_t cap;
    pair_ent *heap;
    size_t hn, hcap;
} scratch;

static void scratch_free(scratch *s) {
    free(s->id);
    free(s->prev);
    free(s->next);
    free(s->list);
    free(s->heap);
}

static dt_status scratch_reserve(scratch *s, size_t m) {
    if (m <= s->cap) return DT_OK;
    if (m > (size_t)INT32_MAX / 2) return dt_fail(DT_EINPUT, "tokenizer: a single word of %zu bytes is too long", m);
    size_t c = dtk_pow2_at_least(m);
    uint32_t *id = realloc(s->id, c * sizeof *id);
    if (id) s->id = id;
    int32_t *prev = realloc(s->prev, c * sizeof *prev);
    if (prev) s->prev = prev;
    int32_t *next = realloc(s->next, c * sizeof *next);
    if (next) s->next = next;
    int32_t *list = realloc(s->list, 2 * c * sizeof *list); /* a position can be queued twice */
    if (list) s->list = list;
    if (!id || !prev || !next || !list) return dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
    s->cap = c;
    return DT_OK;
}

static dt_status heap_push(scratch *s, pair_ent e) {
    if (s->hn == s->hcap) {
        size_t c = s->hcap ? s->hcap * 2 : 256;
        pair_ent *h = realloc(s->heap, c * sizeof *h);
        if (!h) return dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
        s->heap = h;
        s->hcap = c;
    }
    size_t i = s->hn++;
    while (i > 0 && s->heap[(i - 1) / 2].rank > e.rank) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
    return DT_OK;
}

static pair_ent heap_pop(scratch *s) {
    pair_ent top = s->heap[0], last = s->heap[--s->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->hn) break;
        if (c + 1 < s->hn && s->heap[c + 1].rank < s->heap[c].rank) c++;
        if (s->heap[c].rank >= last.rank) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->hn) s->heap[i] = last;
    return top;
}

/* Queues the pair whose left symbol is i, if it is a known merge. */
static dt_status push_pair(const dt_tokenizer *t, scratch *s, int32_t i) {
    int32_t j = s->next[i];
    pair_ent e = {0, i, s->id[i], s->id[j], 0};
    if (!merge_find(t, e.a, e.b, &e.rank, &e.out)) return DT_OK;
    return heap_push(s, e);
}

static int pair_live(const scratch *s, const pair_ent *e) {
    int32_t j = s->next[e->pos]; /* -1: last symbol, -2: merged away */
    return j >= 0 && s->id[e->pos] == e->a && s->id[j] == e->b;
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* The reference bpe(): while some adjacent pair is a merge, take the lowest-ranked one and
 * merge all its occurrences left to right. A min-heap of live pairs makes this O(m log m);
 * a merge never creates another pair of the same rank, so one rank is one batch. */
static dt_status bpe(const dt_tokenizer *t, scratch *s, const unsigned char *w, size_t m, uint32_t *dst,
                     size_t *ndst) {
    if (m == 1) {
        dst[(*ndst)++] = t->byte_id[w[0]];
        return DT_OK;
    }
    DT_TRY(scratch_reserve(s, m));
    int32_t mi = (int32_t)m;
    for (int32_t i = 0; i < mi; i++) {
        s->id[i] = t->byte_id[w[i]];
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < mi ? i + 1 : -1;
    }
    s->hn = 0;
    for (int32_t i = 0; i + 1 < mi; i++) DT_TRY(push_pair(t, s, i));
    while (s->hn) {
        pair_ent top = heap_pop(s);
        if (!pair_live(s, &top)) continue;
        size_t nl = 0;
        s->list[nl++] = top.pos;
        while (s->hn && s->heap[0].rank == top.rank) {
            pair_ent e = heap_pop(s);
            if (pair_live(s, &e)) s->list[nl++] = e.pos;
        }
        if (nl > 1) qsort(s->list, nl, sizeof *s->list, cmp_i32);
        size_t nm = 0;
        for (size_t k = 0; k < nl; k++) {
            int32_t i = s->list[k];
            top.pos = i; /* top is the (a, b) template */
            if (!pair_live(s, &top)) continue; /* overlapped by the previous merge (a == b) */
            int32_t j = s->next[i], jn = s->next[j];
            s->id[i] = top.out;
            s->next[i] = jn;
            if (jn >= 0) s->prev[jn] = i;
            s->next[j] = -2;
            s->list[nm++] = i;
        }
        for (size_t k = 0; k < nm; k++) {
            int32_t i = s->list[k];
            if (s->prev[i] >= 0) DT_TRY(push_pair(t, s, s->prev[i]));
            if (s->next[i] >= 0) DT_TRY(push_pair(t, s, i));
        }
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) dst[(*ndst)++] = s->id[i];
    return DT_OK;
}

static dt_status reserve_tokens(uint32_t **buf, size_t *n, size_t *cap, size_t extra) {
    if (*n > *cap || (!*buf && *cap)) return dt_fail(DT_EINPUT, "tokenizer: inconsistent output buffer");
    if (*cap - *n >= extra) return DT_OK;
    if (extra > SIZE_MAX / 4 - *n) return dt_fail(DT_ERUNTIME, "tokenizer: output too large");
    size_t c = *cap ? *cap : 4096;
    while (c < *n + extra) c *= 2;
    uint32_t *p = realloc(*buf, c * sizeof *p);
    if (!p) return dt_fail(DT_ERUNTIME, "tokenizer: out of memory for %zu tokens", c);
    *buf = p;
    *cap = c;
    return DT_OK;
}


struct dtk_scratch {
    scratch s;
};
dt_status dtk_append_id(uint32_t **buf, size_t *n, size_t *cap, uint32_t id) {
    DT_TRY(reserve_tokens(buf, n, cap, 1));
    (*buf)[(*n)++] = id;
    return DT_OK;
}
dtk_scratch *dtk_scratch_new(void) { return calloc(1, sizeof(dtk_scratch)); }
void dtk_scratch_free(dtk_scratch *s) {
    if (s) scratch_free(&s->s);
    free(s);
}
dt_status dtk_bpe_append(const dt_tokenizer *t, dtk_scratch *s, const unsigned char *w, size_t m, uint32_t **buf,
                         size_t *n, size_t *cap) {
    DT_TRY(reserve_tokens(buf, n, cap, m));
    return bpe(t, &s->s, w, m, *buf, n);
}

dt_status dt_tokenizer_encode(const dt_tokenizer *t, const char *text, size_t len, uint32_t **buf, size_t *n,
                              size_t *cap) {
    if (t->hf) return dt_hf_encode(t, text, len, buf, n, cap);
    const unsigned char *s = (const unsigned char *)text;
    if (!t->bpe) {
        DT_TRY(reserve_tokens(buf, n, cap, len));
        for (size_t i = 0; i < len; i++) (*buf)[(*n)++] = s[i];
        return DT_OK;
    }
    scratch sc = {0};
    dt_status st = DT_OK;
    for (size_t i = 0; i < len && st == DT_OK;) {
        size_t end = dt_pretoken_end(s, len, i);
        st = reserve_tokens(buf, n, cap, end - i);
        if (st == DT_OK) st = bpe(t, &sc, s + i, end - i, *buf, n);
        i = end;
    }
    scratch_free(&sc);
    return st;
}

size_t dt_tokenizer_decode(const dt_tokenizer *t, int token, char *out, size_t cap) {
    if (token < 0 || token >= t->vocab) return 0;
    if (!t->bpe) {
        if (cap < 1) return 0;
        out[0] = (char)token;
        return 1;
    }
    size_t k = t->off[token + 1] - t->off[token];
    if (k > cap) k = cap;
    memcpy(out, t->bytes + t->off[token], k);
    return k;
}
