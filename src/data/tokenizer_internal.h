/* Private to tokenizer.c, gpt2_files.c and hf_tokenizer.c: the tokenizer object and the
 * hashing they use. */
#ifndef DT_TOKENIZER_INTERNAL_H
#define DT_TOKENIZER_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

struct dt_tokenizer {
    int bpe; /* 0: one token per byte */
    int vocab, eot;
    uint32_t *off;        /* token i is bytes[off[i] .. off[i+1]) */
    unsigned char *bytes;
    uint32_t byte_id[256]; /* token of each single byte */
    /* merges (a, b) -> (rank, merged id): open addressing, key ((a << 32) | b) + 1, 0 = empty */
    uint64_t *mkey;
    uint32_t *mrank;
    uint32_t *mout;
    size_t mmask;
    struct dt_hf *hf; /* a tokenizer.json's rules (hf_tokenizer.c); NULL: GPT-2's or bytes */
};

/* A 64-bit key's hash for the open-addressing tables (merges; strings while loading). */
static inline size_t dtk_hash64(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k ^ (k >> 31));
}

/* Table and buffer capacities: the power of two >= n (at least 16). */
static inline size_t dtk_pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* Adds merge (a, b) -> out with its rank to t's table (tokenizer.c). */
void dtk_merge_put(dt_tokenizer *t, unsigned a, unsigned b, uint32_t rank, uint32_t out);
/* Merges table capacity for n merges (allocates mkey, mrank, mout). */
dt_status dtk_merge_alloc(dt_tokenizer *t, size_t n);

/* BPE of one pre-token w[0..m) (its bytes' tokens merged by t's merges, the reference's
 * order), appended to *buf (tokenizer.c); s is working memory kept across calls. */
typedef struct dtk_scratch dtk_scratch;
dtk_scratch *dtk_scratch_new(void);
void dtk_scratch_free(dtk_scratch *s);
dt_status dtk_bpe_append(const dt_tokenizer *t, dtk_scratch *s, const unsigned char *w, size_t m, uint32_t **buf,
                         size_t *n, size_t *cap);
/* Appends one id to *buf */
dt_status dtk_append_id(uint32_t **buf, size_t *n, size_t *cap, uint32_t id);

/* hf_tokenizer.c: encode with a tokenizer.json's rules; free them */
dt_status dt_hf_encode(const dt_tokenizer *t, const char *text, size_t len, uint32_t **buf, size_t *n, size_t *cap);
void dt_hf_free(struct dt_hf *hf);

#endif
