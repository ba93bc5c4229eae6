/* Draws the rows a step trains on from a token file in a seeded order. A row is T inputs,
 * T targets and, with documents, where each token's document starts in the row. How rows
 * are built (data.layout, docs/config.md#rows):
 *   stream  the file cut into non-overlapping windows of T+1 tokens (window i starts at
 *           token i·T); documents are not looked at (a version 1 file, or llm.c's way);
 *   pack    the same windows, documents kept apart (Megatron's reset_position_ids and
 *           reset_attention_mask): positions restart at each document, a token attends to
 *           its document only, and the first token of a document is not a target of the
 *           previous one (a document cut by the window's start begins the row);
 *   pad     one document per row: its first T+1 tokens, the rest of the row padding
 *           (input id 0, never a target; its own segment);
 *   budget  pad's documents packed whole into the micro-batches' rows (budget.h): the
 *           same steps without the padding's compute. Its rows one at a time (validation)
 *           are pad's.
 * A target the file's loss mask leaves out is DT_IGNORE. Each epoch is one seeded
 * permutation of the rows (identity when shuffle is off), consumed a global batch at a
 * time; a partial last batch is dropped. The position (epoch, pos) is the whole state,
 * so resuming is exact. A global batch is a list of rows any rank can index, so how ranks
 * split it never changes what it holds. */
#ifndef DT_LOADER_H
#define DT_LOADER_H
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "tokenfile.h"
#include "../core/token.h"

typedef enum { DT_ROWS_STREAM, DT_ROWS_PACK, DT_ROWS_PAD, DT_ROWS_BUDGET } dt_rows;

/* data.layout's name to its kind; -1 when unknown. */
int dt_rows_parse(const char *name);
/* Rows of T in the file (windows, or documents with pad and budget). */
size_t dt_rows_count(const dt_tokenfile *f, int T, dt_rows how);
/* A document row's real tokens: the first T of document i at most (pad, budget). */
size_t dt_rows_length(const dt_tokenfile *f, int T, size_t i);
/* Row i in file order: T inputs, T targets (DT_IGNORE: not in the loss), and seg (T: the
 * row position where each token's document starts; all 0 for stream). Returns the
 * targets in the loss. i < dt_rows_count. */
long long dt_rows_build(const dt_tokenfile *f, int T, dt_rows how, size_t i, dt_token *inputs, dt_token *targets,
                        int *seg);

/* data.uneven: an epoch's last global batch with fewer rows than the others is dropped
 * (the next epoch starts), trained with its rows (ranks and micro-steps past them get rows
 * that add nothing: every rank runs the same collectives, PyTorch's Join), or refused at
 * start (the data must be whole batches). */
typedef enum { DT_UNEVEN_DROP, DT_UNEVEN_JOIN, DT_UNEVEN_ERROR } dt_uneven;

typedef struct dt_budget dt_budget;

typedef struct {
    const dt_tokenfile *file;
    dt_rows how;
    dt_uneven uneven; /* join: an epoch's last batch may hold fewer rows */
    dt_budget *budget; /* data.layout budget: the current batch's placement (budget.h), else NULL */
    int T, global_batch, shuffle;
    uint64_t seed;
    size_t nseq;     /* rows in the file */
    dt_token *scratch; /* one row's inputs and targets, and its seg: counting a batch's targets */
    uint32_t *perm;  /* this epoch's order */
    long long epoch; /* state: epoch of the next batch ... */
    size_t pos;      /* ... and its first index into perm */
    size_t batch_pos; /* first perm index of the current batch */
} dt_loader;

/* dp, micro: the data-parallel ranks and rows per micro-batch (the token budget's split). */
/* data.uneven's name to its policy (drop for an unknown one: the config's enum admits none). */
dt_uneven dt_uneven_parse(const char *name);
dt_status dt_loader_init(dt_loader *l, const dt_tokenfile *f, dt_rows how, int T, int global_batch, int shuffle,
                         uint64_t seed, dt_uneven uneven, int dp, int micro);
/* The current batch's micro-steps per rank under the token budget (0: the layout's), and
 * whether its ranks needed different numbers. */
int dt_loader_micro_steps(const dt_loader *l);
int dt_loader_step_uneven(const dt_loader *l);
/* Global batches in an epoch (join: the last may hold fewer rows). */
size_t dt_loader_batches_per_epoch(const dt_loader *l);
/* Rows of the current batch (global_batch but for join's last batch of an epoch). */
int dt_loader_batch_rows(const dt_loader *l);
void dt_loader_free(dt_loader *l);
/* Restores a saved position (epoch, pos); fails if pos is not a valid batch start. */
dt_status dt_loader_seek(dt_loader *l, long long epoch, size_t pos);
/* Advances to the next global batch. */
void dt_loader_next_batch(dt_loader *l);
/* Whether the current batch is the first of an epoch after the first (the data wrapped). */
int dt_loader_starts_epoch(const dt_loader *l);
/* Copies rows [first, first+count) of the current batch: inputs, targets and seg, each
 * count x T; a row past the batch's rows (join) is input 0, no target in the loss. */
void dt_loader_fill(const dt_loader *l, int first, int count, dt_token *inputs, dt_token *targets, int *seg);
/* Targets in the loss over the current global batch: the step's token-exact divisor. */
long long dt_loader_loss_tokens(const dt_loader *l);
/* The current batch's input tokens that are data, not padding (tokens/s and MFU count
 * these): every row's T for stream and pack, each document's tokens for pad and budget. */
long long dt_loader_real_tokens(const dt_loader *l);

#endif
