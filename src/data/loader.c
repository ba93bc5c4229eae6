#include "loader.h"

#include <stdlib.h>
#include <string.h>

#include "../core/rng.h"
#include "budget.h"

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

int dt_rows_parse(const char *name) {
    static const char *names[] = {"stream", "pack", "pad", "budget"};
    for (int k = 0; k < 4; k++)
        if (!strcmp(name, names[k])) return k;
    return -1;
}

dt_uneven dt_uneven_parse(const char *name) {
    return !strcmp(name, "join") ? DT_UNEVEN_JOIN : !strcmp(name, "error") ? DT_UNEVEN_ERROR : DT_UNEVEN_DROP;
}

static size_t ndocs(const dt_tokenfile *f) { return f->doc_start ? f->ndocs : f->count > 0; }
static size_t doc_start(const dt_tokenfile *f, size_t d) { return f->doc_start ? (size_t)f->doc_start[d] : d ? f->count : 0; }

/* The document holding token a (a < count): the last start <= a. */
static size_t doc_of(const dt_tokenfile *f, size_t a) {
    size_t lo = 0, hi = ndocs(f); /* doc_start(lo) <= a < doc_start(hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (doc_start(f, mid) <= a) lo = mid;
        else hi = mid;
    }
    return lo;
}

size_t dt_rows_count(const dt_tokenfile *f, int T, dt_rows how) {
    if (how == DT_ROWS_PAD || how == DT_ROWS_BUDGET) return ndocs(f);
    return f->count > 0 ? (f->count - 1) / (size_t)T : 0;
}

static dt_token target_at(const dt_tokenfile *f, size_t a) { return f->mask && !f->mask[a] ? DT_IGNORE : (dt_token)dt_tokenfile_at(f, a); }

size_t dt_rows_length(const dt_tokenfile *f, int T, size_t i) {
    size_t L = doc_start(f, i + 1) - doc_start(f, i);
    return L < (size_t)T ? L : (size_t)T;
}

long long dt_rows_build(const dt_tokenfile *f, int T, dt_rows how, size_t i, dt_token *inputs, dt_token *targets,
                        int *seg) {
    long long n = 0;
    if (how == DT_ROWS_PAD || how == DT_ROWS_BUDGET) { /* document i, cut at T + 1 tokens, padded */
        size_t s = doc_start(f, i), L = doc_start(f, i + 1) - s, nin = L < (size_t)T ? L : (size_t)T;
        for (int t = 0; t < T; t++) {
            int real = (size_t)t < nin;
            inputs[t] = real ? (dt_token)dt_tokenfile_at(f, s + t) : 0;
            targets[t] = real && (size_t)t + 1 < L ? target_at(f, s + t + 1) : DT_IGNORE;
            seg[t] = real ? 0 : t; /* padding: a segment of its own */
            n += targets[t] != DT_IGNORE;
        }
        return n;
    }
    size_t w = i * (size_t)T; /* i < rows, so token w + T is inside the file */
    size_t d = how == DT_ROWS_PACK ? doc_of(f, w) : 0, end = how == DT_ROWS_PACK ? doc_start(f, d + 1) : f->count;
    for (int t = 0; t < T; t++) {
        size_t a = w + (size_t)t;
        while (a >= end) end = doc_start(f, ++d + 1); /* pack: the next document */
        size_t start = doc_start(f, d);
        inputs[t] = (dt_token)dt_tokenfile_at(f, a);
        targets[t] = a + 1 < end ? target_at(f, a + 1) : DT_IGNORE; /* never the next document's first token */
        seg[t] = how == DT_ROWS_PACK && start > w ? (int)(start - w) : 0;
        n += targets[t] != DT_IGNORE;
    }
    return n;
}

dt_status dt_loader_init(dt_loader *l, const dt_tokenfile *f, dt_rows how, int T, int global_batch, int shuffle,
                         uint64_t seed, dt_uneven uneven, int dp, int micro) {
    memset(l, 0, sizeof *l);
    l->file = f;
    l->how = how;
    l->uneven = uneven;
    l->T = T;
    l->global_batch = global_batch;
    l->shuffle = shuffle;
    l->seed = seed;
    l->nseq = dt_rows_count(f, T, how);
    if (l->nseq < (size_t)global_batch) {
        if (how == DT_ROWS_PAD)
            return dt_fail(DT_EINPUT, "data file '%s' is too short: %zu documents give %zu rows (data.layout pad), a "
                                      "global batch needs %d", f->path, ndocs(f), l->nseq, global_batch);
        return dt_fail(DT_EINPUT, "data file '%s' is too short: %zu tokens give %zu sequences of %d+1 tokens, "
                                  "a global batch needs %d", f->path, f->count, l->nseq, T, global_batch);
    }
    if (l->nseq > UINT32_MAX) return dt_fail(DT_EINPUT, "data file '%s' has too many sequences", f->path);
    if (uneven == DT_UNEVEN_ERROR && l->nseq % (size_t)global_batch != 0)
        return dt_fail(DT_EINPUT, "data file '%s' gives %zu rows, not a whole number of global batches of %d (an "
                       "epoch's last batch would hold %zu); data.uneven is error: use drop or join, or another "
                       "train.global_batch", f->path, l->nseq, global_batch, l->nseq % (size_t)global_batch);
    l->perm = malloc(l->nseq * sizeof(uint32_t));
    l->scratch = malloc(3 * (size_t)T * sizeof(dt_token));
    if (!l->perm || !l->scratch) return dt_fail(DT_ERUNTIME, "out of memory (data order)");
    if (how == DT_ROWS_BUDGET) DT_TRY(dt_budget_create(&l->budget, dp, micro, T, global_batch));
    make_perm(l);
    return DT_OK;
}

int dt_loader_micro_steps(const dt_loader *l) { return l->budget ? l->budget->m : 0; }
int dt_loader_step_uneven(const dt_loader *l) { return l->budget && l->budget->uneven; }

void dt_loader_free(dt_loader *l) {
    free(l->perm);
    free(l->scratch);
    dt_budget_free(l->budget);
    l->budget = NULL;
    l->perm = NULL;
    l->scratch = NULL;
}

size_t dt_loader_batches_per_epoch(const dt_loader *l) {
    size_t g = (size_t)l->global_batch;
    return l->uneven == DT_UNEVEN_JOIN ? (l->nseq + g - 1) / g : l->nseq / g;
}

dt_status dt_loader_seek(dt_loader *l, long long epoch, size_t pos) {
    if (epoch < 0 || pos > dt_loader_batches_per_epoch(l) * (size_t)l->global_batch ||
        pos % (size_t)l->global_batch != 0)
        return dt_fail(DT_EINPUT, "checkpoint data position (epoch %lld, sequence %zu) does not fit data file '%s' "
                       "(%zu sequences, global batch %d)", epoch, pos, l->file->path, l->nseq, l->global_batch);
    l->epoch = epoch;
    l->pos = pos;
    make_perm(l);
    return DT_OK;
}

void dt_loader_next_batch(dt_loader *l) {
    /* the epoch ends: its rows are all drawn, or (drop) too few are left for a batch */
    if (l->pos >= l->nseq || (l->uneven != DT_UNEVEN_JOIN && l->pos + (size_t)l->global_batch > l->nseq)) {
        l->epoch++;
        l->pos = 0;
        make_perm(l);
    }
    l->batch_pos = l->pos;
    l->pos += (size_t)l->global_batch;
    if (l->budget) dt_budget_plan(l->budget, l, l->uneven);
}

/* A saved position never sits at the start of an epoch (an epoch's end wraps only when the
 * next batch is drawn), so a resumed run announces an epoch exactly when the straight run does. */
int dt_loader_starts_epoch(const dt_loader *l) { return l->epoch > 0 && l->batch_pos == 0; }

int dt_loader_batch_rows(const dt_loader *l) {
    size_t left = l->nseq - l->batch_pos;
    return left < (size_t)l->global_batch ? (int)left : l->global_batch;
}

void dt_loader_fill(const dt_loader *l, int first, int count, dt_token *inputs, dt_token *targets, int *seg) {
    if (l->budget) {
        dt_budget_fill(l->budget, l, first, count, inputs, targets, seg);
        return;
    }
    int rows = dt_loader_batch_rows(l);
    for (int k = 0; k < count; k++) {
        size_t at = (size_t)k * l->T;
        if (first + k >= rows) { /* join: past the batch's rows, a row that adds nothing */
            for (int t = 0; t < l->T; t++) inputs[at + t] = 0, targets[at + t] = DT_IGNORE, seg[at + t] = t;
            continue;
        }
        size_t idx = l->perm[l->batch_pos + (size_t)first + (size_t)k];
        dt_rows_build(l->file, l->T, l->how, idx, inputs + at, targets + at, seg + at);
    }
}

long long dt_loader_real_tokens(const dt_loader *l) {
    int rows = dt_loader_batch_rows(l);
    if (l->how != DT_ROWS_PAD && l->how != DT_ROWS_BUDGET) return (long long)rows * l->T;
    long long n = 0;
    for (int k = 0; k < rows; k++)
        if (!l->budget || l->budget->mb[k] < l->budget->m) /* budget, drop: the documents the step trains */
            n += (long long)dt_rows_length(l->file, l->T, l->perm[l->batch_pos + (size_t)k]);
    return n;
}

long long dt_loader_loss_tokens(const dt_loader *l) {
    if (l->budget) return dt_budget_loss_tokens(l->budget, l);
    int rows = dt_loader_batch_rows(l);
    if (l->how == DT_ROWS_STREAM && !l->file->mask) return (long long)rows * l->T;
    long long n = 0;
    dt_token *in = l->scratch, *tg = in + l->T;
    for (int k = 0; k < rows; k++)
        n += dt_rows_build(l->file, l->T, l->how, l->perm[l->batch_pos + (size_t)k], in, tg, (int *)(tg + l->T));
    return n;
}
