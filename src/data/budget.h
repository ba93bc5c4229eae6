/* The token budget (data.layout budget): a step's documents, the global batch as with
 * `pad` (one document each, cut at T+1 tokens), packed whole into micro-batches of
 * micro rows x T tokens instead of one padded row each. Document i of the batch goes to
 * data-parallel rank i mod dp; each rank fills its rows with its documents in order (a
 * document goes to the current row if it fits, else to the next row, else to the next
 * micro-batch), documents apart as with `pack`. So a rank needs as many micro-batches as
 * its documents fill, and ranks can need different numbers: data.uneven decides (join:
 * every rank runs the most any rank needs, the extra ones adding nothing; drop: the
 * fewest any rank needs, the documents past them left out of the step; error: the step
 * stops every rank). A pipeline runs its schedule's micro-batches, those past the step's
 * empty. Whatever the split, each document is computed as alone and the loss is
 * token-exact, so any layout trains the model the single process does. */
#ifndef DT_BUDGET_H
#define DT_BUDGET_H
#include "loader.h"

struct dt_budget {
    int dp, micro, T, global_batch;
    int *mb, *row, *off; /* per position of the batch: its micro-batch, row and first column */
    int *need;           /* micro-batches each rank's documents fill */
    int m, uneven;       /* the step's micro-steps (the policy applied); ranks needed different numbers */
};

dt_status dt_budget_create(dt_budget **out, int dp, int micro, int T, int global_batch);
void dt_budget_free(dt_budget *b);
/* Places the current batch of l (its rows are documents) under policy pol. */
void dt_budget_plan(dt_budget *b, const dt_loader *l, dt_uneven pol);
/* Micro-batch k of rank r, where fill's row index first = (k·dp + r)·micro, count = micro. */
void dt_budget_fill(const dt_budget *b, const dt_loader *l, int first, int count, dt_token *inputs, dt_token *targets,
                    int *seg);
/* Targets in the loss over the documents the step trains. */
long long dt_budget_loss_tokens(const dt_budget *b, const dt_loader *l);

#endif
