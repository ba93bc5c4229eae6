/* GPT-2: token + learned position embeddings, pre-LayerNorm blocks with causal
 * multi-head attention and a GELU(tanh) MLP of width 4C, final LayerNorm, LM head
 * tied to the token embedding; vocabulary padded to a multiple of 64.
 *
 * All parameters live in one contiguous buffer (and gradients in a second one of the
 * same layout), described by a table of named tensors with Hugging Face GPT-2 names.
 * Each block's tensors are contiguous, so a wrapper can treat a block as one range
 * (buckets, shards, prefetch). Forward and backward are explicit per layer; the model
 * knows shapes, never which parallel strategy drives it. This header is the model's whole
 * public surface; the code is one file per building block (gpt_internal.h lists them),
 * the tensor-parallel split plan one table (tensor_plan.c). */
#ifndef DT_GPT_H
#define DT_GPT_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../backend/ops.h"
#include "../core/config.h"
#include "../core/status.h"
#include "shard.h"

/* The model families (docs/models.md): GPT-2 (learned positions, LayerNorm with biases,
 * GELU MLP of 4C, biases everywhere, the head tied to wte) and Llama (rotary positions,
 * RMSNorm, SwiGLU MLP of its own width, grouped-query attention, no biases but optional
 * q/k/v ones (Qwen2), the head tied or its own). The building blocks (norm, attention,
 * MLP) branch on the family, not on a copy of the model. */
enum { GPT_FAMILY_GPT2, GPT_FAMILY_LLAMA };
typedef struct {
    int n_layer, n_head, n_embd, seq_len, vocab_size;
    int padded_vocab; /* vocab_size rounded up to a multiple of 64 */
    /* after the GPT-2 six (zero there: gpt_shape_check fills them) */
    int family;       /* GPT_FAMILY_* */
    int n_kv_head;    /* key/value heads (GPT-2: n_head) */
    int intermediate; /* the MLP's width (GPT-2: 4C) */
    int tie;          /* the head is wte (GPT-2: always) */
    int qkv_bias;     /* llama: q, k, v have biases */
    float rope_theta, norm_eps;
    float rope_factor, rope_low_freq, rope_high_freq; /* Llama 3 scaling; factor 0: none */
    int rope_original_max;
} gpt_shape;

typedef struct {
    char name[64];
    int ndim;
    int shape[2];      /* as stored in memory (wte: padded_vocab x C) */
    int saved_rows;    /* rows that belong to the model (wte: vocab_size; else shape[0]) */
    dt_shard shard;    /* this rank's piece of the unsharded tensor (1-D tensors as [1, n]) */
    size_t offset;     /* in floats, into params/grads */
    size_t numel;
    int decay;         /* weight decay applies (2-D weights) */
    int frozen;        /* gpt_freeze: no gradient (none computed), no update, no optimizer moments */
    int layer;         /* block index, -1 for embeddings and ln_f */
    int unit;          /* the unit holding it (see gpt_unit) */
} gpt_tensor;

/* Units are the groups of contiguous tensors that a sharding wrapper gathers, reduces
 * and frees together: unit 0 = wte + wpe, unit 1+j/k = local block j (the stage's blocks in
 * order, chunk after chunk, k = gpt_layout.unit_blocks consecutive ones per unit, 1 by
 * default), the last unit (nunits - 1) = ln_f. On a pipeline stage unit 0 holds what the stage
 * has of the embeddings (wte + wpe first, wte alone last, nothing in between) and ln_f's
 * unit is empty except on the last stage; empty units have count 0.
 * The model reads a unit's parameters and writes its gradients through
 * unit_params[u] / unit_grads[u] (by default into the flat buffers), so ZeRO-3/FSDP
 * can point them at gathered copies. */
typedef struct {
    size_t offset, count; /* in floats, in the flat layout */
} gpt_unit;

/* Called around each unit's use (L = nblocks; with unit_blocks k the blocks' hooks are
 * their unit's, before the first of its blocks and after the last in each pass, and ln_f's
 * unit is L/k+1). Order in gpt_forward_backward:
 * before_forward(0), then per block before_forward(1+l) / after_forward(1+l),
 * before/after_forward(L+1) for ln_f; backward: before_backward(0) (the head needs wte),
 * before_backward(L+1), after_backward(L+1), blocks L..1 (before/after),
 * after_backward(0) last. A stage calls those of the units it has; a last stage without
 * the embeddings calls after_backward(0) at the end of its loss (only the head adds to wte
 * there), before its blocks' backward.
 * after_backward(u) means unit u's gradients are final for this micro-batch, so a
 * data-parallel wrapper can start reducing them while the rest of backward runs. A split
 * backward calls before_backward(u) in B and again in W, around the unit's gradient
 * writes, then after_backward(u). With head_grad set, gpt_loss also brackets the head's
 * wte gradient with before/after_backward(GPT_HEAD_PART).
 * Evaluation calls the forward hooks and ends with after_forward(0). */
/* The head's share of the tied wte gradient as its own "unit" for the hooks, on a model
 * holding both ends when a wrapper sets gpt_model.head_grad (bitwise mode keeps the two
 * shares apart, as a pipeline's first and last stage do). */
#define GPT_HEAD_PART (-1)
typedef struct {
    dt_status (*before_forward)(void *ctx, int unit);
    dt_status (*after_forward)(void *ctx, int unit);
    dt_status (*before_backward)(void *ctx, int unit);
    dt_status (*after_backward)(void *ctx, int unit);
    void *ctx;
} gpt_hooks;

typedef struct gpt_acts gpt_acts;

/* Where activation bytes live: the residual stream and LayerNorms (what sequence
 * parallelism splits), the tensor-parallel regions (attention and MLP inner activations,
 * split by tp), and the rest (head chunk, scratch, losses, tokens). */
enum { GPT_ACT_SEQUENCE, GPT_ACT_TENSOR, GPT_ACT_OTHER, GPT_ACT_NREGIONS };

/* Tensor parallelism inside the model (Megatron's paired functions): dt_tp_attach
 * (tensor_parallel.h) gives collectives over the tensor-parallel group, ctx being the
 * group's context the model holds; the model calls them where Megatron's g (after a
 * row-parallel layer, forward) and f (before a column-parallel layer, backward) sit.
 * With one rank (allreduce NULL) both are identities. */
typedef struct {
    /* in place, n elements: GPT_TP_SUM of activations in storage precision (fp32 or
     * bf16), GPT_TP_SUM_F32 / GPT_TP_MAX_F32 of fp32 statistics */
    dt_status (*allreduce)(void *ctx, float *x, size_t n, int op);
    /* Sequence parallelism (Megatron-SP): full (tp·n elements) = every rank's local n
     * elements in rank order; and its conjugate, local (n) = this rank's block of the sum
     * over ranks of full (tp·n). Storage precision. NULL without sp. */
    dt_status (*allgather)(void *ctx, float *full, const float *local, size_t n);
    dt_status (*reduce_scatter)(void *ctx, float *local, const float *full, size_t n);
    /* Replicated key/value heads (gpt_kv_replicas > 1): in place, the sum of n elements
     * (storage precision) over the ranks holding this rank's key/value head, whose
     * gradients each rank's own query heads give in part. NULL without replicas. */
    dt_status (*kv_sum)(void *ctx, float *x, size_t n);
    void *ctx;
} gpt_tp_comm;
enum { GPT_TP_SUM, GPT_TP_SUM_F32, GPT_TP_MAX_F32 };

/* Context parallelism inside the model: the micro-batch's T columns are this rank's
 * positions of a longer sequence (positions[t], ascending; e.g. two chunks), and
 * attention over the whole sequence is dt_cp_attach's (context_parallel.h; ring
 * attention: the same contract as ops.h's attention_fwd/bwd for the local rows, with the
 * other ranks' keys and values; ctx is its ring). attention_fwd NULL: one rank, local
 * attention, positions pos0 + t. */
typedef struct {
    /* qseg: documents (host memory, B x T; NULL: none), each query's document start as a
     * position of the whole sequence (ops.h's attention_part_fwd) */
    dt_status (*attention_fwd)(void *ctx, float *out, float *lse, const float *qkv, const int *qseg, int B, int T, int C,
                               int NH);
    dt_status (*attention_bwd)(void *ctx, float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, const int *qseg, int B, int T, int C, int NH);
    const int *positions; /* T entries */
    void *ctx;
    /* Bitwise mode's canonical sequence chunks (cp_chunks.c; gather NULL: none; on a group
     * of one too, so one process computes what cp ranks do): every GEMM over rows is issued
     * per row_block rows, and a weight gradient is computed whole by one rank from every
     * rank's rows, gathered in sequence order: N rows of `bytes` each into buffer `slot`
     * (0, 1: activations; 2-4: row statistics, tokens), *out the B·T·cp rows (a group of
     * one: src itself). rank, size: this rank's place in the group; ones: B·T·cp ones (the
     * whole sequence's bias gradients); scratch: 3·B·T·cp floats. */
    dt_status (*gather)(void *ctx, const void *src, int N, size_t bytes, int slot, const void **out);
    int rank, size, row_block;
    const float *ones;
    float *scratch;
} gpt_cp_comm;

/* How this rank's model is cut (the parallel layout, as the model sees it: shapes only;
 * zero fields mean "not cut").
 *   tp, tp_rank  tensor parallelism: heads, MLP columns and vocabulary rows split;
 *   sp           sequence parallelism (tp > 1): the rows of the micro-batch (B·T, in
 *                order: for B = 1 the sequence) are split into tp contiguous pieces in the
 *                LayerNorm and residual regions, so those activations shrink by tp; the
 *                tensor-parallel all-reduces become all-gather (before a column-parallel
 *                layer) and reduce-scatter (after a row-parallel one). */
#define GPT_MAX_CHUNKS 16
typedef struct {
    int tp, tp_rank, sp;
    int canon;                 /* > 1: the canonical chunks of every tensor-parallel sum (bitwise mode; tp_chunks.c):
                                  this many column blocks, K chunks and vocabulary chunks, whatever tp (which
                                  divides it) is, so one process computes the same partial sums; 0: none */
    int first_layer, n_layers; /* a pipeline stage: blocks [first_layer, first_layer + n_layers) (0: to the
                                  end); the first stage holds the embeddings, the last ln_f and the tied wte */
    int chunks;                /* > 1: an interleaved pipeline rank's model chunks (first_layer/n_layers unused):
                                  blocks [chunk_first[c], + chunk_layers[c]), increasing and disjoint; the
                                  embeddings go with a chunk starting at block 0, the head with one ending last */
    int chunk_first[GPT_MAX_CHUNKS], chunk_layers[GPT_MAX_CHUNKS];
    int slots;                 /* chunk passes (micro-batch, chunk) whose activations are kept at once (0: 1) */
    int split_backward;        /* keep the linears' output gradients per slot, so a backward can run as
                                  gpt_backward_input now and gpt_backward_weight later (zero bubble) */
    int recompute;             /* activation checkpointing: a slot keeps only each block's input (the
                                  residual stream); the block's inner activations live in one shared
                                  block's worth and are recomputed by its backward (not with split_backward) */
    int documents;             /* rows hold documents (data.layout pack, pad): each slot keeps its
                                  micro-batch's document starts (gpt_set_documents) */
    int unit_blocks;           /* consecutive blocks per unit (parallel.unit_blocks; 0: 1): a sharding
                                  wrapper gathers and reduces them together; must divide the stage's blocks,
                                  one chunk, no split backward */
    int row_block;             /* bitwise mode with parallel.cp_chunks: the canonical rows of every GEMM over
                                  rows (the head's row chunks are these) */
    int split_blocks;          /* each block two units, its attention half (norm_1 .. the attention's output
                                  projection) and its MLP half (norm_2 .. the MLP's), gathered and reduced
                                  apart (parallel.unit_split); one chunk, unit_blocks 1, no split backward,
                                  no recompute */
} gpt_layout;

typedef struct {
    gpt_shape shape;
    const dt_ops *ops;
    int ntensors;
    gpt_tensor *tensors;
    size_t nparams;
    float *params, *grads; /* flat buffers (NULL when a wrapper owns the storage) */
    int nunits;
    gpt_unit *units;
    float **unit_params, **unit_grads;
    int max_B, max_T; /* activation buffers are sized for these */
    gpt_acts *acts;
    size_t act_bytes;
    size_t act_regions[GPT_ACT_NREGIONS]; /* act_bytes by region */
    size_t esz;       /* bytes per element of parameters, gradients, activations (ops.h storage) */
    gpt_hooks hooks;
    float *head_grad; /* NULL: the head adds its wte gradient to unit 0's; else here (this rank's wte piece,
                         storage precision), between before_backward(GPT_HEAD_PART) and its after_backward,
                         which a wrapper may use to point it elsewhere */
    int first_layer, nblocks; /* this stage's blocks: nblocks in all, the first being block first_layer */
    int unit_blocks;          /* blocks per unit (gpt_layout.unit_blocks; at least 1) */
    int block_units;          /* units per block: 2 with gpt_layout.split_blocks, else 1 */
    int nchunks;              /* model chunks (gpt_layout.chunks; 1 for a plain stage) */
    int chunk_block0[GPT_MAX_CHUNKS + 1]; /* chunk c: local blocks [chunk_block0[c], chunk_block0[c + 1]) */
    int chunk_layer0[GPT_MAX_CHUNKS];     /* chunk c's first block in the model */
    int has_embed, has_head;  /* first stage (wte, wpe), last stage (ln_f, the head's tied wte) */
    int block0;               /* index of local block 0's first tensor */
    int layer_tensors;        /* tensors per block */
    signed char role[24];     /* a block tensor's place in its block by role (gpt_internal.h's T_*; -1: none) */
    int t_wpe, t_norm_w, t_norm_b, t_head; /* the other tensors by role (-1: not here): positions, final norm,
                                              the head's weight (tensor 0 when tied) */
    int split;                /* gpt_layout.split_backward */
    int recompute;            /* gpt_layout.recompute */
    int documents;            /* gpt_layout.documents */
    size_t tied_gap;          /* a last stage's unit 0: wte, then this many unused floats (where the first
                                 stage has wpe), so unit 0 has the same size on both ends of the tie */
    int tp, tp_rank;    /* tensor-parallel size and this rank's index: heads and MLP columns split */
    int sp;             /* sequence parallelism: LayerNorm/residual rows split over tp (gpt_layout) */
    int canon;          /* gpt_layout.canon: canonical chunks of the tensor-parallel sums (0: none) */
    gpt_tp_comm tp_comm;
    gpt_cp_comm cp_comm;
    int first_trainable;  /* gpt_freeze: the lowest trainable place of the whole model (-1: the embeddings, a
                             block, n_layer: above the blocks); the backward stops below it */
    long long dw_skipped; /* weight-gradient GEMMs not run so far because their weight is frozen (a weight
                             matrix's per micro-batch pass, the head's too) */
} gpt_model;

/* Frozen parameter groups (train.freeze): `patterns` is a comma-separated list of shell
 * globs over the Hugging Face names ("wte.weight,wpe.weight,h.0.*"). gpt_freeze_check
 * fails (DT_EINPUT) on a pattern no tensor of the whole model matches; gpt_freeze marks
 * this rank's matching tensors frozen: the backward computes no gradient for them (their
 * gradient buffers are left as they are: the strategies zero them each step) and stops
 * below the lowest trainable tensor of the whole model (a pipeline's earlier stages
 * included); the strategies neither reduce their gradients nor keep moments for them.
 * *n (optional): elements frozen here. */
dt_status gpt_freeze_check(const gpt_shape *s, const char *patterns);
void gpt_freeze(gpt_model *m, const char *patterns, size_t *n);
/* The unit of local block j (its attention half's where blocks are split); the unit of its
 * MLP half (the same unless split); ln_f's unit (the last). */
static inline int gpt_block_unit(const gpt_model *m, int j) { return 1 + j / m->unit_blocks * m->block_units; }
static inline int gpt_mlp_unit(const gpt_model *m, int j) { return gpt_block_unit(m, j) + m->block_units - 1; }
static inline int gpt_lnf_unit(const gpt_model *m) { return m->nunits - 1; }
/* Every tensor of unit u is frozen (an empty unit is not). */
int gpt_unit_frozen(const gpt_model *m, int u);
/* Elements of this rank's frozen tensors. */
size_t gpt_frozen_count(const gpt_model *m);
/* The highest run of [a, b) (flat offsets) outside frozen tensors: [*lo, *hi); 0 when
 * there is none. Walking down from b (b = *lo each time) gives every trainable run; with
 * nothing frozen, [a, b) itself. */
int gpt_trainable_run(const gpt_model *m, size_t a, size_t b, size_t *lo, size_t *hi);

/* The shape the config's model keys give (unchecked). */
gpt_shape gpt_shape_of_config(const dt_config *c);
/* Checks the shape (n_embd % n_head, sizes > 0, the family's rules) and fills padded_vocab
 * and the family's defaults (GPT-2's fixed choices; llama's n_kv_head, intermediate). */
dt_status gpt_shape_check(gpt_shape *s);
/* Whether tp tensor-parallel ranks split the attention heads evenly, and for Llama its
 * MLP columns too, and its key/value heads evenly or, tp being a multiple of them, into
 * replicas (the one place of the rule; the padded vocabulary's is checked with the
 * shape's padded_vocab). */
static inline int gpt_tp_splits_heads(const gpt_shape *s, int tp) {
    return tp >= 1 && s->n_head % tp == 0 &&
           (s->family != GPT_FAMILY_LLAMA || (s->n_kv_head >= 1 && s->intermediate % tp == 0 &&
                                              (s->n_kv_head % tp == 0 || tp % s->n_kv_head == 0)));
}
/* Llama with tp above n_kv_head (Megatron's replicated key/value heads): the tp ranks
 * holding each key/value head (tp / n_kv_head; tensor-parallel rank t holds head
 * t / replicas, the one its query heads use), else 1; and the key/value heads a rank
 * holds (n_kv_head / tp, or the one). */
static inline int gpt_kv_replicas(const gpt_shape *s, int tp) {
    return s->family == GPT_FAMILY_LLAMA && s->n_kv_head >= 1 && tp > s->n_kv_head ? tp / s->n_kv_head : 1;
}
static inline int gpt_kv_heads_local(const gpt_shape *s, int tp) {
    return s->n_kv_head / (tp / gpt_kv_replicas(s, tp));
}
/* Whether bitwise mode's key/value group sums (attention.c's rope_canon_bwd: one binary
 * tree over a group's query heads) split at the tp ranks: the heads split over tp, or
 * replicated with a power of two of query heads per rank (the tree's aligned subtrees). */
static inline int gpt_kv_tree_splits(const gpt_shape *s, int tp) {
    if (tp <= 0) return 0;
    int hl = s->n_head / tp;
    return s->family != GPT_FAMILY_LLAMA || s->n_kv_head % tp == 0 || (hl > 0 && (hl & (hl - 1)) == 0);
}
/* Builds the tensor table and allocates activations for B x T, and the flat params and
 * grads buffers when alloc_state (a sharding wrapper may provide its own). */
dt_status gpt_create(gpt_model *m, const gpt_shape *s, const dt_ops *ops, int max_B, int max_T);
dt_status gpt_create_ex(gpt_model *m, const gpt_shape *s, const dt_ops *ops, int max_B, int max_T, int alloc_state);
/* The same, cut by layout (NULL: one rank). Tensor parallelism, this rank holding piece
 * tp_rank of tp (Megatron layout):
 * c_attn (q, k, v each) and c_fc split by output columns, attention heads split, the two
 * c_proj split by input rows (their bias added by piece 0 only); wte split by vocabulary
 * rows (vocabulary-parallel embedding and cross-entropy: no rank holds a whole row of
 * logits); LayerNorms and wpe replicated. Llama: q, k, v, gate and up by output rows,
 * o and down by input columns; with tp above n_kv_head each key/value head's k and v rows
 * are held by tp / n_kv_head ranks (gpt_kv_replicas). Fails (DT_EINPUT) unless tp
 * divides n_head and the padded vocabulary (Llama: intermediate, and n_kv_head or a
 * multiple of it), and with sp, max_B·max_T; every pass then needs B·T divisible by tp
 * too. */
dt_status gpt_create_layout(gpt_model *m, const gpt_shape *s, const dt_ops *ops, int max_B, int max_T,
                            int alloc_state, const gpt_layout *layout);
void gpt_destroy(gpt_model *m);
/* The tensor table and units of one rank of a layout (piece tp_rank) on paper, with the
 * freeze patterns applied (NULL or "": none), nothing else allocated (no backend): what
 * the estimator reads of frozen tensors; gpt_destroy frees it. */
dt_status gpt_table_layout(gpt_model *m, const gpt_shape *s, const gpt_layout *layout, const char *freeze);
/* GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2·n_layer),
 * LayerNorm weight 1, biases 0, padded vocab rows 0. Element i (row-major index in the
 * unsharded tensor) of a tensor is gpt_init_at(rule, i) with the tensor's rule, a pure
 * function of (seed, name, i): a shard initialises its elements alone, and every layout
 * starts from bitwise the same weights. */
typedef struct {
    int kind;       /* 0: zeros, 1: ones, 2: normal */
    float std;      /* kind 2 */
    uint64_t key;   /* kind 2: dt_rng_key(seed, name) */
} gpt_init_rule;
gpt_init_rule gpt_init_rule_for(const char *name, int n_layer, uint64_t seed);
float gpt_init_at(const gpt_init_rule *r, uint64_t index);
/* Writes through unit_params, which must be fp32 host memory here (the engine points
 * them at a host copy when the model's storage is on a device or in bf16). */
void gpt_init(gpt_model *m, uint64_t seed);
/* The same for unit u's tensors only (gpt_init is every unit's, in order): a sharded
 * engine initialises a model larger than its memory one unit at a time. */
void gpt_init_unit(gpt_model *m, uint64_t seed, int u);
const gpt_tensor *gpt_find(const gpt_model *m, const char *name);
/* Tensor indices in lexicographic name order (the digest and safetensors order). */
void gpt_sorted_order(const gpt_model *m, int *order);

/* Unit views of a flat fp32 buffer in the model's layout (e.g. optimizer moments):
 * (*views)[u] = base + units[u].offset; the caller frees *views. */
dt_status gpt_unit_views(const gpt_model *m, float *base, float ***views);
/* Zeroes every unit's gradients (through unit_grads). */
void gpt_zero_grad(gpt_model *m);
/* Forward, loss and backward for one micro-batch on a whole model (one stage):
 * grads += d(loss_sum · grad_scale); *loss = the sum of per-token losses (double).
 * tokens/targets are B x T. A hook's failure (a collective of the strategy around the
 * model) stops the pass and is returned; the gradients are then incomplete. */
dt_status gpt_forward_backward(gpt_model *m, const dt_token *tokens, const dt_token *targets, int B, int T,
                               float grad_scale, double *loss);
/* The stage API (pipeline schedules run these; gpt_forward_backward is the three on
 * slot 0). Activations of a micro-batch live in one of the layout's slots from its
 * forward to its backward. Boundary buffers are in the backend's memory, this rank's
 * rows (B·T, or B·T/tp with sp) x n_embd:
 *   gpt_slot_input   a non-first stage's input: filled (received) before gpt_forward;
 *   gpt_slot_output  a non-last stage's output after gpt_forward (to send);
 *   gpt_slot_grad    the gradient of the residual stream: a non-last stage receives its
 *                    output's gradient there before gpt_backward, which leaves the
 *                    gradient of its input there (to send back).
 * gpt_forward: the stage's forward (its chunk 0 when it has several) of micro-batch
 * B x T (tokens read on the first stage only) at positions pos0..pos0+T-1 of the position table. gpt_loss (last stage): the
 * head; with grad_scale != 0 its backward through ln_f too. gpt_backward: the blocks'
 * backward, and on the first stage the embeddings'. */
dt_status gpt_forward(gpt_model *m, int slot, const dt_token *tokens, int B, int T, int pos0);
/* Documents in the rows of the micro-batch a slot's next gpt_forward takes (a model built
 * with gpt_layout.documents): seg[b·T + t] is where the document of the row's token t
 * starts, as a position of the row (for context parallelism: of the whole sequence, at
 * this rank's positions), non-decreasing along a row. Token t then has position
 * t - seg (learned positions restart at each document) and attends to its own document
 * only. NULL: plain rows. pos0 must be 0 with documents. */
void gpt_set_documents(gpt_model *m, int slot, const int *seg, int B, int T);
/* The same for one model chunk of an interleaved rank (gpt_forward is chunk 0): the slot
 * then belongs to that chunk until its backward; gpt_loss needs the head's chunk, and
 * gpt_slot_output, gpt_backward* act on the slot's chunk. Slots are sized for the
 * largest chunk. */
dt_status gpt_forward_chunk(gpt_model *m, int slot, int chunk, const dt_token *tokens, int B, int T, int pos0);
/* The layout of this model's blocks (first_layer/n_layers, or its chunks), tp = 1: what
 * another rank needs to build this stage's tensor table. */
void gpt_stage_layout(const gpt_model *m, gpt_layout *out);
dt_status gpt_loss(gpt_model *m, int slot, const dt_token *targets, float grad_scale, double *loss);
dt_status gpt_backward(gpt_model *m, int slot);
/* The backward split in two (a layout with split_backward): the input gradient (B: what
 * the previous stage waits for; no weight gradient) with before_backward hooks, then later
 * every weight gradient of the blocks and embeddings (W: linears and LayerNorms, from the
 * output gradients B kept in the slot) with before_backward (again) and after_backward
 * hooks around each unit, so a unit's gradients
 * for a micro-batch are written by one call. gpt_backward is the two in one. */
dt_status gpt_backward_input(gpt_model *m, int slot);
dt_status gpt_backward_weight(gpt_model *m, int slot);
/* Activation slots the layout gave the model. */
int gpt_slot_count(const gpt_model *m);
float *gpt_slot_input(gpt_model *m, int slot);
float *gpt_slot_output(gpt_model *m, int slot);
float *gpt_slot_grad(gpt_model *m, int slot);
/* Forward and loss only: *loss = the sum of per-token losses. */
dt_status gpt_eval_loss(gpt_model *m, const dt_token *tokens, const dt_token *targets, int B, int T, double *loss);
/* Logits (vocab_size floats) for the next token after tokens[0..T), T <= max_T. */
dt_status gpt_next_logits(gpt_model *m, const dt_token *tokens, int T, float *logits);
/* The head's logits (vocab_size floats) for the last position of the slot's micro-batch
 * after gpt_forward_chunk of the head's chunk (a pipeline's last stage samples with it). */
dt_status gpt_last_logits(gpt_model *m, int slot, float *logits);
/* Parameters the model allocates (vocabulary padding included), without building it. */
size_t gpt_param_count(const gpt_shape *s);
/* The same for one rank of tp tensor-parallel ranks (gpt_create_layout's pieces). */
size_t gpt_param_count_tp(const gpt_shape *s, int tp);
/* The same for one rank of a layout (its stage's tensors, pieces, a last stage's gap). */
size_t gpt_param_count_layout(const gpt_shape *s, const gpt_layout *layout);
/* A layout's units (gpt_create_layout's: unit 0 the embeddings or a last stage's wte and
 * its gap, then one per block (unit_blocks: per k blocks; split_blocks: two per block),
 * then ln_f), without building it: unit 0's and ln_f's counts (0 where the stage lacks
 * them), a block unit's count in block[0] (split: the attention half's, and the MLP
 * half's in block[1]; else block[1] = 0), and the number of block units (split: pairs). */
void gpt_unit_counts_layout(const gpt_shape *s, const gpt_layout *layout, size_t *first, size_t block[2], size_t *last,
                            int *nblocks);
/* Bytes of the activation arena for B x T (what gpt_create allocates). */
size_t gpt_activation_bytes(const gpt_shape *s, int B, int T, size_t elem_bytes);
/* The same for one rank of a layout (NULL: one rank); regions (NULL or GPT_ACT_NREGIONS
 * entries) receives the split of those bytes by region. */
size_t gpt_activation_bytes_layout(const gpt_shape *s, int B, int T, size_t elem_bytes, const gpt_layout *layout,
                                   size_t *regions);
/* Parameter count of the model proper (padding excluded). */
size_t gpt_num_params(const gpt_model *m);
/* The same from the shape alone (before any model is built). */
size_t gpt_shape_params(const gpt_shape *s);
/* One line for the log: the family, its dimensions at sequence length T, the parameters. */
void gpt_shape_print(const gpt_shape *s, int T, FILE *out);
/* FLOPs of one training token (forward + backward), for tokens/s -> FLOP/s. */
double gpt_flops_per_token(const gpt_shape *s, int T);

#endif
