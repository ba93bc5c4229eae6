/* Draws training sequences of T+1 tokens from a token file in a seeded order.
 * The file is cut into non-overlapping windows (window i starts at token i·T).
 * Each epoch is one seeded permutation of the windows (identity when shuffle is off),
 * consumed a global batch at a time; a partial last batch is dropped. The position
 * (epoch, pos) is the whole state, so resuming is exact. A global batch is a list of
 * sequences any rank can index, so how ranks split it never changes what it holds. */
#ifndef DT_LOADER_H
#define DT_LOADER_H
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "tokenfile.h"
#include "../core/token.h"

typedef struct {
    const dt_tokenfile *file;
    int T, global_batch, shuffle;
    uint64_t seed;
    size_t nseq;     /* windows in the file */
    uint32_t *perm;  /* this epoch's order */
    long long epoch; /* state: epoch of the next batch ... */
    size_t pos;      /* ... and its first index into perm */
    size_t batch_pos; /* first perm index of the current batch */
} dt_loader;

dt_status dt_loader_init(dt_loader *l, const dt_tokenfile *f, int T, int global_batch, int shuffle, uint64_t seed);
void dt_loader_free(dt_loader *l);
/* Restores a saved position (epoch, pos); fails if pos is not a valid batch start. */
dt_status dt_loader_seek(dt_loader *l, long long epoch, size_t pos);
/* Advances to the next global batch. */
void dt_loader_next_batch(dt_loader *l);
/* Whether the current batch is the first of an epoch after the first (the data wrapped). */
int dt_loader_starts_epoch(const dt_loader *l);
/* Copies sequences [first, first+count) of the current batch: inputs and shifted targets, each count x T. */
void dt_loader_fill(const dt_loader *l, int first, int count, dt_token *inputs, dt_token *targets);
/* Window i of the file in file order (validation reads these sequentially); a target
 * the file's loss mask leaves out (a prompt's) is DT_IGNORE. */
void dt_loader_window(const dt_tokenfile *f, int T, size_t i, dt_token *inputs, dt_token *targets);
/* Targets of window i in the loss (T without a mask). */
long long dt_loader_window_loss_tokens(const dt_tokenfile *f, int T, size_t i);
/* Targets in the loss over the current global batch: the step's token-exact divisor. */
long long dt_loader_loss_tokens(const dt_loader *l);

#endif
