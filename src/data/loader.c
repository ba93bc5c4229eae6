#include "loader.h"

#include <stdlib.h>
#include <string.h>

#include "../core/rng.h"

static void make_perm(dt_loader *l) {
    for (size_t i = 0; i < l->nseq; i++) l->perm[i] = (uint32_t)i;
    if (!l->shuffle) return;
    dt_rng r;
    dt_rng_seed(&r, l->seed * 0x9e3779b97f4a7c15ULL + (uint64_t)l->epoch + 1);
    for (size_t i = l->nseq - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = (size_t)dt_rng_below(&r, i + 1);
        uint32_t t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
}

dt_status dt_loader_init(dt_loader *l, const dt_tokenfile *f, int T, int global_batch, int shuffle, uint64_t seed) {
    memset(l, 0, sizeof *l);
    l->file = f;
    l->T = T;
    l->global_batch = global_batch;
    l->shuffle = shuffle;
    l->seed = seed;
    l->nseq = f->count > 0 ? (f->count - 1) / (size_t)T : 0;
    if (l->nseq < (size_t)global_batch)
        return dt_fail(DT_EINPUT, "data file '%s' is too short: %zu tokens give %zu sequences of %d+1 tokens, "
                                  "a global batch needs %d", f->path, f->count, l->nseq, T, global_batch);
    if (l->nseq > UINT32_MAX) return dt_fail(DT_EINPUT, "data file '%s' has too many sequences", f->path);
    l->perm = malloc(l->nseq * sizeof(uint32_t));
    if (!l->perm) return dt_fail(DT_ERUNTIME, "out of memory (data order)");
    make_perm(l);
    return DT_OK;
}

void dt_loader_free(dt_loader *l) {
    free(l->perm);
    l->perm = NULL;
}

dt_status dt_loader_seek(dt_loader *l, long long epoch, size_t pos) {
    if (epoch < 0 || pos > l->nseq || pos % (size_t)l->global_batch != 0)
        return dt_fail(DT_EINPUT, "checkpoint data position (epoch %lld, sequence %zu) does not fit data file '%s' "
                       "(%zu sequences, global batch %d)", epoch, pos, l->file->path, l->nseq, l->global_batch);
    l->epoch = epoch;
    l->pos = pos;
    make_perm(l);
    return DT_OK;
}

void dt_loader_next_batch(dt_loader *l) {
    if (l->pos + (size_t)l->global_batch > l->nseq) { /* drop the partial batch, start a new epoch */
        l->epoch++;
        l->pos = 0;
        make_perm(l);
    }
    l->batch_pos = l->pos;
    l->pos += (size_t)l->global_batch;
}

/* A saved position never sits at the start of an epoch (an epoch's end wraps only when the
 * next batch is drawn), so a resumed run announces an epoch exactly when the straight run does. */
int dt_loader_starts_epoch(const dt_loader *l) { return l->epoch > 0 && l->batch_pos == 0; }

void dt_loader_window(const dt_tokenfile *f, int T, size_t i, dt_token *inputs, dt_token *targets) {
    size_t at = i * (size_t)T; /* i < nseq, so token at + T is inside the file */
    const uint16_t *src = f->tokens + at;
    const uint8_t *mask = f->mask ? f->mask + at + 1 : NULL; /* the targets' loss mask */
    for (int t = 0; t < T; t++) {
        inputs[t] = src[t];
        targets[t] = mask && !mask[t] ? DT_IGNORE : src[t + 1];
    }
}

long long dt_loader_window_loss_tokens(const dt_tokenfile *f, int T, size_t i) {
    if (!f->mask) return T;
    const uint8_t *mask = f->mask + i * (size_t)T + 1;
    long long n = 0;
    for (int t = 0; t < T; t++) n += mask[t];
    return n;
}

long long dt_loader_loss_tokens(const dt_loader *l) {
    long long n = 0;
    for (int k = 0; k < l->global_batch; k++)
        n += dt_loader_window_loss_tokens(l->file, l->T, l->perm[l->batch_pos + (size_t)k]);
    return n;
}

void dt_loader_fill(const dt_loader *l, int first, int count, dt_token *inputs, dt_token *targets) {
    for (int k = 0; k < count; k++) {
        size_t idx = l->perm[l->batch_pos + (size_t)first + (size_t)k];
        dt_loader_window(l->file, l->T, idx, inputs + (size_t)k * l->T, targets + (size_t)k * l->T);
    }
}
