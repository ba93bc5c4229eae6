/* The model's private surface, shared by its building blocks (one file each, so another
 * family can reuse a block's code path): the tensor plan (tensor_plan.c), the activation
 * arena and its views (activations.c), the paired functions of tensor and sequence
 * parallelism (tp_regions.c), the embeddings (embedding.c), attention (attention.c), the
 * MLP (mlp.c), a block around them (block.c), the head and its loss (head.c), frozen
 * tensors (freeze.c), and the passes that drive them (passes.c). gpt.c builds and frees
 * the model. Nothing outside src/model/ includes this. */
#ifndef DT_GPT_INTERNAL_H
#define DT_GPT_INTERNAL_H
#include "gpt.h"

/* One chunk pass (a micro-batch through one chunk of this stage): what its backward needs, sized for
 * max_B x max_T. With sequence parallelism the residual stream and the LayerNorms
 * (encoded, ln*, res*, lnf, dres, their statistics) hold this rank's R = BT/tp rows only;
 * the rest hold all BT rows. Per-layer arrays cover one chunk's blocks (a plain stage is
 * one chunk), sized for the largest chunk. */
typedef struct {
    float *encoded; /* RC: the chunk's input (the embeddings on the first stage's chunk 0) */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse; /* per local layer */
    float *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *res3;
    float *lnf, *lnf_mean, *lnf_rstd; /* last stage */
    float *dres;                      /* RC: gradient of the residual stream */
    float *wd_mp, *wd_fc, *wd_ap, *wd_qkv; /* split backward, per local layer: the output gradients of the
                                              MLP c_proj, c_fc, attention c_proj, c_attn (BTC, BT·4C, BTC, BT·3C) */
    float *wd_ln2, *wd_ln1;           /* and of ln_2, ln_1 (RC each) */
    dt_token *tok;                    /* BT (first stage): the tokens, in the backend's memory */
    int *pos;                         /* BT (llama): each token's rotary position, the backend's memory */
    int *seg, *seg_host;              /* BT with documents: their starts (gpt_set_documents), the backend's
                                         memory and a host copy */
    int docs;                         /* the micro-batch it holds has documents */
    int B, T, pos0;                   /* the micro-batch it holds */
    int chunk;                        /* the model chunk whose activations it holds */
} gpt_slot;

/* Activations, allocated once: the slots, and scratch shared by all of them. */
struct gpt_acts {
    gpt_slot *slot;
    int nslots;
    gpt_slot rc; /* recompute: one block's inner activations (ln1 .. fch_gelu), shared by every block and slot */
    float *logits; /* head_rows x Vp, the head is computed in row chunks */
    float *losses; /* BT */
    float *proj;   /* BTC: attention / MLP projection output before the residual add */
    float *dsmall, *dbig; /* BTC, BT·4C */
    float *full;   /* sp: BTC, a LayerNorm output (or dres) gathered over the sequence pieces */
    float *rows;   /* sp: RC, this rank's rows of a reduce-scattered sum */
    float *lngrad; /* sp: 4C, one block's LayerNorm gradients from this rank's rows, summed over tp */
    float *lnrows, *lnstat; /* sp in bitwise mode: 2 x BTC, 2 x BT fp32: a norm's output gradient and input,
                               mean and 1/std gathered over the sequence pieces (norm.c) */
    dt_token *tgt; /* BT: the targets, in the backend's memory */
    float *xstat;  /* 3 x head_rows: vocabulary-parallel row statistics (max; sum, target logit); canon:
                      then the local chunks' sums and target logits, 2 x head_rows each */
    float *inv_freq; /* llama: the rotary frequencies (head size / 2, fp32) */
    float *ones;     /* llama with q/k/v biases, canon: BT ones (storage precision), the bias GEMMs' other factor */
    float *leaves;   /* canon: the local chunks' partial sums but the first, (canon / tp - 1) x BTC (tp_chunks.c) */
    int *pos_host;   /* llama: BT, a slot's positions built on the host */
    float *xstat_host; /* canon: the chunks' row statistics (fp32: the storage's add would round them) */
    int head_rows;
    void *arena;
};

/* BT ones in the backend's memory and precision (the bias GEMMs' other factor; gpt.c) */
dt_status gpt_fill_ones(gpt_model *m);

/* ---- canonical chunks of the tensor-parallel sums (tp_chunks.c; m->canon > 1) ---- */

/* Column-parallel [N, IC] x [IC, OCl] (+ bias): one GEMM per canonical column block
 * (OCl / sections / (canon / tp) wide; sections: c_attn's q | k | v). */
void gpt_col_fwd(gpt_model *m, float *out, const float *in, const float *w, const float *bias, int N, int IC, int OCl,
                 int sections);
/* Its weight and bias gradients (+=, per block; NULL: skipped) and input gradient (dx =,
 * NULL: skipped): the local chunks' partial sums, summed by the canonical tree (the
 * tensor-parallel sum completes it). */
dt_status gpt_col_bwd(gpt_model *m, float *dx, float *dw, float *db, const float *dy, const float *in, const float *w,
                      int N, int IC, int OCl, int sections);
/* Row-parallel [N, ICl] x [ICl, OC]: the local K chunks' products summed by the tree (no
 * bias: gpt_add_bias after the tensor-parallel sum). */
void gpt_row_fwd(gpt_model *m, float *out, const float *in, const float *w, int N, int ICl, int OC);
dt_status gpt_row_bwd(gpt_model *m, float *dx, float *dw, float *db, const float *dy, const float *in, const float *w,
                      int N, int ICl, int OC);
/* The same in nn.Linear's layout (weight [OUT, IN]: Llama's projections). Column-parallel
 * (q, k, v, gate, up; OUTl this rank's rows of the weight): the output and the weight and
 * bias gradients per canonical block; the input gradient into the local chunks' leaves
 * (gpt_canon_leaves of dx; acc: added to what an earlier projection of the same input left
 * there; NULL: none), the caller summing them by gpt_canon_tree once all are in.
 * kv: k or v, whose heads tp may replicate (each replica then runs the head's every block
 * and the leaves of the blocks its query chunks pair with, from the replicas' summed dy).
 * Row-parallel (o_proj, down; INl this rank's columns): the K chunks' products summed by
 * the tree; its gradients per block. */
void gpt_canon_leaves(gpt_model *m, float *out, size_t n, float **leaf);
void gpt_colt_fwd(gpt_model *m, float *out, const float *in, const float *w, const float *bias, int N, int IN, int OUTl,
                  int kv);
dt_status gpt_colt_bwd(gpt_model *m, float *const *leaf, int acc, float *dw, float *db, const float *dy,
                       const float *in, const float *w, int N, int IN, int OUTl, int kv);
void gpt_rowt_fwd(gpt_model *m, float *out, const float *in, const float *w, int N, int INl, int OUT);
dt_status gpt_rowt_bwd(gpt_model *m, float *dx, float *dw, const float *dy, const float *in, const float *w, int N,
                       int INl, int OUT);
/* out[N, n] += bias (the row-parallel bias, added once to the completed sum) */
void gpt_add_bias(gpt_model *m, float *out, const float *bias, int N, int n);
/* The canonical tree over L leaves of n floats: leaf[0] (the result) and leaf[1..L-1] */
void gpt_canon_tree(gpt_model *m, float *const *leaf, int L, size_t n);

/* Rotary frequencies of the shape (head size / 2 floats; gpt.c) */
void gpt_rope_frequencies(const gpt_shape *s, float *inv_freq);

/* ---- widths by family (activations.c) ---- */

/* Per rank of tp: the MLP's saved pre-activation (GPT-2: c_fc's 4C; Llama: gate | up,
 * 2I), its activation (4C; I), and the scratch for one block's output gradients (dbig). */
size_t gpt_fc_width(const gpt_shape *s, int tp);
size_t gpt_fcg_width(const gpt_shape *s, int tp);
size_t gpt_dbig_width(const gpt_shape *s, int tp);

/* ---- the tensor plan (tensor_plan.c) ---- */

/* The roles of a block's tensors: local block j's tensor of role k is the model's tensor
 * block0 + j·layer_tensors + role[k] (role[k] -1: the family has none). GPT-2: ln_1, the
 * fused c_attn, c_proj, ln_2, c_fc, c_proj with biases; Llama: input_layernorm, q, k, v
 * (biases optional), o_proj (T_APW), post_attention_layernorm (T_LN2W), gate (T_FCW), up,
 * down (T_MPW). Outside the blocks: tensor 0 is the token embedding (on both ends of a
 * tie), t_wpe, t_norm_w/b and t_head (gpt.h) the rest. */
enum { T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_APW, T_APB, T_LN2W, T_LN2B, T_FCW, T_FCB, T_MPW, T_MPB, T_QW, T_QB, T_KW,
       T_KB, T_VW, T_VB, T_UPW, T_NROLES };

/* Fills m->tensors (allocated here), ntensors, nparams, block0 and tied_gap from the plan,
 * for the stage, blocks and tensor-parallel piece already set in m. */
dt_status gpt_build_table(gpt_model *m);
/* Calls fn(name, ctx) for every tensor name of the whole model, until it returns nonzero
 * (then returns 1). */
int gpt_each_name(const gpt_shape *s, int (*fn)(const char *, void *), void *ctx);
/* The same with each tensor's place: its block, -1 for unit 0's (the embeddings), n_layer
 * for the last unit's. */
int gpt_each_tensor(const gpt_shape *s, int (*fn)(const char *, int, void *), void *ctx);

/* ---- the stage (gpt.c) ---- */

/* The stage a layout describes: its chunks' blocks (one chunk unless interleaved), their
 * total and the largest, and whether it holds the embeddings (a chunk from block 0) and
 * the head (a chunk ending at the last block; the tied wte lives on both ends). */
typedef struct {
    int nchunks, first[GPT_MAX_CHUNKS], count[GPT_MAX_CHUNKS];
    int n, maxc, embed, head, slots;
} gpt_stage_info;
extern const gpt_layout gpt_one_rank; /* tp 1, the whole model */
gpt_stage_info gpt_stage_of(const gpt_shape *s, const gpt_layout *lay);

/* ---- storage views ---- */

/* base + n elements of storage precision (fp32 or bf16: ops.h) */
static inline float *S(const gpt_model *m, const float *base, size_t n) {
    return (float *)((const char *)base + n * m->esz);
}
/* Where tensor i's parameters / gradients live now (through its unit's pointer). */
static inline float *tp(const gpt_model *m, int i) {
    const gpt_tensor *t = &m->tensors[i];
    return S(m, m->unit_params[t->unit], t->offset - m->units[t->unit].offset);
}
static inline float *tg(const gpt_model *m, int i) {
    const gpt_tensor *t = &m->tensors[i];
    return S(m, m->unit_grads[t->unit], t->offset - m->units[t->unit].offset);
}
/* Local block j's tensor k. */
static inline int block_tensor(const gpt_model *m, int j, int k) { return m->block0 + j * m->layer_tensors + m->role[k]; }
/* (a role the family lacks gives NULL) */
static inline float *P(const gpt_model *m, int j, int k) { return m->role[k] < 0 ? NULL : tp(m, block_tensor(m, j, k)); }
/* Tensor i's gradient, NULL when it is frozen: nothing computes it. */
static inline float *tgt(const gpt_model *m, int i) { return m->tensors[i].frozen ? NULL : tg(m, i); }
static inline float *G(const gpt_model *m, int j, int k) { return m->role[k] < 0 ? NULL : tgt(m, block_tensor(m, j, k)); }
static inline int TI(const gpt_model *m, int j, int k) { return m->role[k] < 0 ? -1 : block_tensor(m, j, k); }
/* A weight's gradient now, or NULL in a split backward's B pass (written later, by W). */
static inline float *WG(const gpt_model *m, int j, int k, int split) { return split ? NULL : G(m, j, k); }
static inline int llama(const gpt_model *m) { return m->shape.family == GPT_FAMILY_LLAMA; }

/* ---- hooks ---- */

static inline dt_status gpt_hook(const gpt_model *m, dt_status (*fn)(void *, int), int unit) {
    return fn ? fn(m->hooks.ctx, unit) : DT_OK;
}
#define HOOK(name, unit) DT_TRY(gpt_hook(m, m->hooks.name, unit))

/* ---- frozen tensors (freeze.c) ---- */

/* Tensor i's gradient (at g, or where tg says) zeroed if it is frozen (i < 0: nothing): a
 * norm whose weight trains but not its bias (or the reverse), or wte frozen under a
 * trainable wpe, computes both gradients in one kernel, and the frozen one is undone. */
void gpt_zero_frozen(gpt_model *m, int i, float *g);
/* Local block j lies below every trainable tensor of the whole model (the embeddings
 * frozen too): its backward is skipped, input gradient included. */
int gpt_block_skipped(const gpt_model *m, int j);
/* Adds local block j's frozen weight matrices to the skipped weight-gradient GEMMs. */
void gpt_count_skipped(gpt_model *m, int j);

/* ---- activations (activations.c) ---- */

/* Lays the activation buffers out in a->arena (or, with a NULL a, only counts); returns
 * the bytes. esz: bytes per element of storage precision; statistics and losses stay
 * fp32. regions (optional): the bytes by GPT_ACT_* region. */
size_t gpt_act_layout(const gpt_shape *s, int max_B, int max_T, size_t esz, const gpt_layout *lay, gpt_acts *a,
                      size_t *regions);

/* Rows of the residual stream this rank holds for n rows of micro-batch (all, or with
 * sequence parallelism its 1/tp piece). */
static inline int local_rows(const gpt_model *m, int n) { return m->sp ? n / m->tp : n; }
static inline size_t max_local_rows(const gpt_model *m) { return (size_t)local_rows(m, m->max_B * m->max_T); }
static inline gpt_slot *slot_at(const gpt_model *m, int k) { return &m->acts->slot[k]; }
/* The input residual stream of the slot's chunk's block i (i = the chunk's block count:
 * the chunk's output). */
static inline float *layer_in(const gpt_model *m, const gpt_slot *b, int i) {
    size_t RC = max_local_rows(m) * (size_t)m->shape.n_embd;
    return i == 0 ? b->encoded : S(m, b->res3, (size_t)(i - 1) * RC);
}
static inline int chunk_blocks(const gpt_model *m, int c) { return m->chunk_block0[c + 1] - m->chunk_block0[c]; }
static inline float *slot_out(const gpt_model *m, const gpt_slot *b) {
    return layer_in(m, b, chunk_blocks(m, b->chunk));
}
/* Whether chunk c holds the embeddings / the head. */
static inline int embeds(const gpt_model *m, int c) { return m->has_embed && c == 0; }
static inline int heads(const gpt_model *m, int c) { return m->has_head && c == m->nchunks - 1; }

/* Local block j's saved activations in one slot. */
typedef struct {
    float *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fcg, *res3;
} block_acts;
block_acts gpt_block_acts(const gpt_model *m, const gpt_slot *a, int j);
/* Local block j's slices of a slot's split-backward buffers: the output gradients of its
 * linears and LayerNorms. */
typedef struct {
    float *mp, *fc, *ap, *qkv, *ln2, *ln1;
} block_douts;
block_douts gpt_block_douts(const gpt_model *m, const gpt_slot *s, int j);

/* ---- tensor and sequence parallelism's paired functions (tp_regions.c) ---- */

/* Megatron's g (forward, after a row-parallel layer) and f (backward, before a
 * column-parallel one) without sp: an all-reduce of the partial sums x (n elements). */
dt_status gpt_tp_sum(gpt_model *m, float *x, size_t n);
/* Replicated key/value heads: x (n elements, this rank's share of its key/value head's
 * gradient) summed over the head's replicas in place; identity without replicas. */
dt_status gpt_kv_sum(gpt_model *m, float *x, size_t n);
/* After a row-parallel layer (and the vocabulary-parallel embedding and head): partial
 * sums x over all N rows completed. Without sp in place (*done = x); with sp reduce-
 * scattered, this rank's rows into out (*done = out). */
dt_status gpt_tp_complete(gpt_model *m, float *x, float *out, int N, float **done);
/* Before a column-parallel layer (and the head): all N rows of x, of which this rank
 * holds its piece. Without sp it holds them all (*all = x); with sp they are gathered
 * into acts->full (*all = acts->full). */
dt_status gpt_seq_gather(gpt_model *m, float *x, int N, float **all);
/* With sp a LayerNorm's weight and bias gradients come from this rank's rows only: they
 * are computed into part k of acts->lngrad (weight then bias), summed over the
 * tensor-parallel group and added to the gradients dw[k] (weight, bias; NULL: a frozen
 * norm's, none) by gpt_ln_grad_finish, so the replicated LayerNorms stay equal. Without
 * sp they go to dw, db directly (and finish does nothing). */
typedef struct {
    float *w, *b;
} ln_grads;
ln_grads gpt_ln_grad_target(gpt_model *m, float *dw, float *db, int part);
dt_status gpt_ln_grad_finish(gpt_model *m, const ln_grads *dw, int nparts);
/* A norm's weight and bias gradients (tensors iw, ib; ib < 0: none), which its kernel
 * computes together: both where either trains, neither (NULL) where both are frozen
 * (freeze.c; the frozen one of a pair is zeroed after: gpt_zero_frozen). */
ln_grads gpt_norm_grads(gpt_model *m, int iw, int ib);

/* ---- the building blocks ---- */

/* norm.c: the family's norm (LayerNorm, or RMSNorm: b, db and mean unused) over N rows */
void gpt_norm_fwd(gpt_model *m, float *out, float *mean, float *rstd, const float *in, const float *w, const float *b,
                  int N);
/* Rows of a head chunk for padded vocabulary Vp over BT rows (activations.c): chunks are
 * large (up to 512 MB of logits) because every chunk re-reads and re-writes the whole
 * dwte in its GEMM; with row_block (cp_chunks.c) a multiple of it. */
size_t gpt_head_rows(size_t Vp, size_t BT, int row_block);
dt_status gpt_norm_bwd(gpt_model *m, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                  const float *mean, const float *rstd, int N);

/* linear.c: y[N, OUT] = x[N, IN]·wᵀ + bias for an nn.Linear weight w[OUT, IN] (bias may be
 * NULL: acts->ones must exist otherwise); backward dx (= or += with acc), dw +=, dbias +=
 * (each may be NULL) */
void gpt_linear_t_fwd(gpt_model *m, float *y, const float *x, const float *w, const float *bias, int N, int IN,
                      int OUT);
void gpt_linear_t_bwd(gpt_model *m, float *dx, float *dw, float *dbias, const float *dy, const float *x,
                      const float *w, int N, int IN, int OUT, int acc);

/* embedding.c: the first stage's token and position embeddings of slot a's micro-batch
 * into a->encoded, and their gradients from a->dres (with the unit-0 hooks). */
dt_status gpt_embed_forward(gpt_model *m, gpt_slot *a, const dt_token *tokens, int B, int T, int pos0);
dt_status gpt_embed_backward(gpt_model *m, gpt_slot *s);

/* attention.c: block j's attention on its LayerNorm output b->ln1 (this rank's rows),
 * *out = the completed projection (this rank's rows) to add to the residual stream.
 * Backward: from the gradient of the residual stream s->dres to *dln, the gradient of
 * b->ln1 (this rank's rows); weight gradients now or, split, the output gradients kept
 * in k for gpt_attention_weight. */
dt_status gpt_attention_forward(gpt_model *m, const gpt_slot *a, const block_acts *b, int j, float **out);
dt_status gpt_attention_backward(gpt_model *m, gpt_slot *s, const block_acts *b, const block_douts *k, int j,
                                 int split, float **dln);
dt_status gpt_attention_weight(gpt_model *m, const gpt_slot *s, const block_acts *b, const block_douts *k, int j);
/* mlp.c: the same for block j's MLP on b->ln2. */
dt_status gpt_mlp_forward(gpt_model *m, const gpt_slot *a, const block_acts *b, int j, float **out);
dt_status gpt_mlp_backward(gpt_model *m, gpt_slot *s, const block_acts *b, const block_douts *k, int j, int split,
                           float **dln);
dt_status gpt_mlp_weight(gpt_model *m, const gpt_slot *s, const block_acts *b, const block_douts *k, int j);

/* block.c: local block j (pre-LayerNorm, attention then MLP, each added to the residual
 * stream) of slot a: forward; backward (the input gradient into s->dres, and the weight
 * gradients unless split); the split backward's weight pass. */
dt_status gpt_block_forward(gpt_model *m, const gpt_slot *a, int j);
dt_status gpt_block_backward(gpt_model *m, gpt_slot *s, int j, int split);
dt_status gpt_block_weight(gpt_model *m, gpt_slot *s, int j);

/* passes.c */
dt_status gpt_check_slot(const gpt_model *m, int slot);

#endif
