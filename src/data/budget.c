#include "budget.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_budget_create(dt_budget **out, int dp, int micro, int T, int global_batch) {
    dt_budget *b = calloc(1, sizeof *b);
    *out = b;
    if (!b) return dt_fail(DT_ERUNTIME, "out of memory (token budget)");
    b->dp = dp, b->micro = micro, b->T = T, b->global_batch = global_batch;
    size_t n = (size_t)global_batch;
    b->mb = malloc(n * sizeof(int));
    b->row = malloc(n * sizeof(int));
    b->off = malloc(n * sizeof(int));
    b->need = malloc((size_t)dp * sizeof(int));
    if (!b->mb || !b->row || !b->off || !b->need) return dt_fail(DT_ERUNTIME, "out of memory (token budget)");
    return DT_OK;
}

void dt_budget_free(dt_budget *b) {
    if (!b) return;
    free(b->mb), free(b->row), free(b->off), free(b->need);
    free(b);
}

/* The inputs of batch position i: its document's first T tokens at most. */
static int length_of(const dt_loader *l, int i) {
    return (int)dt_rows_length(l->file, l->T, l->perm[l->batch_pos + (size_t)i]);
}

void dt_budget_plan(dt_budget *b, const dt_loader *l, dt_uneven pol) {
    int rows = dt_loader_batch_rows(l), most = 0, fewest = 0;
    for (int r = 0; r < b->dp; r++) {
        int k = 0, row = 0, off = 0, any = 0;
        for (int i = r; i < rows; i += b->dp, any = 1) {
            int n = length_of(l, i);
            if (off > 0 && off + n > b->T) row++, off = 0; /* the next row */
            if (row == b->micro) k++, row = 0;             /* the next micro-batch */
            b->mb[i] = k, b->row[i] = row, b->off[i] = off;
            off += n;
        }
        b->need[r] = any ? k + 1 : 0;
        most = r == 0 || b->need[r] > most ? b->need[r] : most;
        fewest = r == 0 || b->need[r] < fewest ? b->need[r] : fewest;
    }
    b->uneven = most != fewest;
    b->m = pol == DT_UNEVEN_DROP ? fewest : most;
}

void dt_budget_fill(const dt_budget *b, const dt_loader *l, int first, int count, dt_token *inputs, dt_token *targets,
                    int *seg) {
    int T = b->T, r = (first / b->micro) % b->dp, k = (first / b->micro) / b->dp, rows = dt_loader_batch_rows(l);
    (void)count; /* micro */
    for (int x = 0; x < b->micro * T; x++) /* rows that hold nothing yet: padding */
        inputs[x] = 0, targets[x] = DT_IGNORE, seg[x] = x % T;
    dt_token *in = l->scratch, *tg = in + T;
    int *sg = (int *)(tg + T);
    for (int i = r; i < rows; i += b->dp) {
        if (b->mb[i] != k || k >= b->m) continue; /* drop: past the step's micro-steps */
        int n = length_of(l, i);
        dt_rows_build(l->file, T, DT_ROWS_PAD, l->perm[l->batch_pos + (size_t)i], in, tg, sg);
        size_t at = (size_t)b->row[i] * T + (size_t)b->off[i];
        for (int t = 0; t < n; t++) inputs[at + t] = in[t], targets[at + t] = tg[t], seg[at + t] = b->off[i];
    }
}

long long dt_budget_loss_tokens(const dt_budget *b, const dt_loader *l) {
    int rows = dt_loader_batch_rows(l), T = b->T;
    dt_token *in = l->scratch, *tg = in + T;
    long long n = 0;
    for (int i = 0; i < rows; i++)
        if (b->mb[i] < b->m) n += dt_rows_build(l->file, T, DT_ROWS_PAD, l->perm[l->batch_pos + (size_t)i], in, tg,
                                                (int *)(tg + T));
    return n;
}
