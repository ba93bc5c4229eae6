/* The model's tensors and how tensor parallelism cuts them (Megatron's layout;
 * docs/parallelism.md, "Tensor parallelism"), as one named table: every tensor's Hugging
 * Face name, its shape as a function of the model's shape, where it lives (the embeddings'
 * unit, each block's, ln_f's) and its split. gpt_create builds this rank's tensor table
 * (names, shard specs, offsets, units) from it by one loop; the name list (freeze
 * patterns) and the parameter counts (the estimator's) read it too. */
#include <stdio.h>
#include <stdlib.h>

#include "gpt_internal.h"

/* Extents, as functions of the shape (X_NONE: a tensor's cols when it is a vector). */
enum { X_NONE, X_C, X_3C, X_4C, X_VOCAB, X_PADDED_VOCAB, X_SEQ, X_KV, X_INTER };
static int64_t extent(const gpt_shape *s, int x) {
    switch (x) {
    case X_C: return s->n_embd;
    case X_3C: return 3 * (int64_t)s->n_embd;
    case X_4C: return 4 * (int64_t)s->n_embd;
    case X_KV: return (int64_t)s->n_kv_head * (s->n_embd / s->n_head);
    case X_INTER: return s->intermediate;
    case X_VOCAB: return s->vocab_size;
    case X_PADDED_VOCAB: return s->padded_vocab;
    case X_SEQ: return s->seq_len;
    default: return 0;
    }
}

/* The tensor-parallel cut, as dt_shard's dim: replicated, by rows (row-parallel, and the
 * vocabulary-parallel embedding), by columns (column-parallel; a vector along its
 * elements). */
enum { SPLIT_NONE = -1, SPLIT_ROWS = 0, SPLIT_COLS = 1 };
/* Where a tensor lives: unit 0 on the first stage (FIRST) or on both ends of the tied
 * embedding (TIED), each block's unit (BLOCK), the last unit on the last stage (LAST). */
enum { ON_FIRST, ON_TIED, ON_BLOCK, ON_LAST };

typedef struct {
    const char *name; /* Hugging Face name (a block's follows "h.<layer>." or "model.layers.<layer>.") */
    int rows, cols;   /* extents; cols X_NONE: a vector of `rows` elements (a [1, n] shard) */
    int real_rows;    /* extent of the rows that belong to the model (X_NONE: all of them) */
    int split;        /* SPLIT_* */
    int parts;        /* fused parts split separately along the split dimension (c_attn: q | k | v) */
    int where;        /* ON_* */
    int role;         /* a block's: T_* (how the building blocks find it); else R_* below */
    int option;       /* held only when the shape has it: OPT_* */
} plan_entry;
/* Roles outside the blocks; options */
enum { R_WTE = T_NROLES, R_WPE, R_NORM_W, R_NORM_B, R_HEAD };
enum { OPT_ALWAYS, OPT_QKV_BIAS, OPT_TIED, OPT_UNTIED };

/* GPT-2 (Hugging Face GPT2Model names, Conv1D weights [in, out]) */
enum { E_WTE, E_WPE, E_BLOCK, E_LNF_W = E_BLOCK + 12, E_LNF_B, E_COUNT };
static const plan_entry gpt2_plan[E_COUNT] = {
    /* vocabulary-parallel: split by rows (the last pieces may hold the padding rows) */
    [E_WTE] = {"wte.weight", X_PADDED_VOCAB, X_C, X_VOCAB, SPLIT_ROWS, 1, ON_TIED, R_WTE, 0},
    [E_WPE] = {"wpe.weight", X_SEQ, X_C, X_NONE, SPLIT_NONE, 1, ON_FIRST, R_WPE, 0},
    /* Megatron: c_attn, c_fc column-parallel (q, k, v split each); c_proj row-parallel,
     * its bias replicated (added by piece 0); LayerNorms replicated */
    {"ln_1.weight", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_LN1W, 0},
    {"ln_1.bias", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_LN1B, 0},
    {"attn.c_attn.weight", X_C, X_3C, X_NONE, SPLIT_COLS, 3, ON_BLOCK, T_QKVW, 0},
    {"attn.c_attn.bias", X_3C, X_NONE, X_NONE, SPLIT_COLS, 3, ON_BLOCK, T_QKVB, 0},
    {"attn.c_proj.weight", X_C, X_C, X_NONE, SPLIT_ROWS, 1, ON_BLOCK, T_APW, 0},
    {"attn.c_proj.bias", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_APB, 0},
    {"ln_2.weight", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_LN2W, 0},
    {"ln_2.bias", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_LN2B, 0},
    {"mlp.c_fc.weight", X_C, X_4C, X_NONE, SPLIT_COLS, 1, ON_BLOCK, T_FCW, 0},
    {"mlp.c_fc.bias", X_4C, X_NONE, X_NONE, SPLIT_COLS, 1, ON_BLOCK, T_FCB, 0},
    {"mlp.c_proj.weight", X_4C, X_C, X_NONE, SPLIT_ROWS, 1, ON_BLOCK, T_MPW, 0},
    {"mlp.c_proj.bias", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_MPB, 0},
    [E_LNF_W] = {"ln_f.weight", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_LAST, R_NORM_W, 0},
    [E_LNF_B] = {"ln_f.bias", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_LAST, R_NORM_B, 0},
};

/* Llama (Hugging Face LlamaForCausalLM names and nn.Linear weights [out, in], so
 * Megatron's column-parallel layers split rows and the row-parallel ones columns; q, k
 * and v separate, k and v of n_kv_head heads; the head tied to the embedding or
 * lm_head.weight of its own) */
static const plan_entry llama_plan[] = {
    {"model.embed_tokens.weight", X_PADDED_VOCAB, X_C, X_VOCAB, SPLIT_ROWS, 1, ON_TIED, R_WTE, OPT_TIED},
    {"model.embed_tokens.weight", X_PADDED_VOCAB, X_C, X_VOCAB, SPLIT_ROWS, 1, ON_FIRST, R_WTE, OPT_UNTIED},
    {"input_layernorm.weight", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_LN1W, 0},
    {"self_attn.q_proj.weight", X_C, X_C, X_NONE, SPLIT_ROWS, 1, ON_BLOCK, T_QW, 0},
    {"self_attn.q_proj.bias", X_C, X_NONE, X_NONE, SPLIT_COLS, 1, ON_BLOCK, T_QB, OPT_QKV_BIAS},
    {"self_attn.k_proj.weight", X_KV, X_C, X_NONE, SPLIT_ROWS, 1, ON_BLOCK, T_KW, 0},
    {"self_attn.k_proj.bias", X_KV, X_NONE, X_NONE, SPLIT_COLS, 1, ON_BLOCK, T_KB, OPT_QKV_BIAS},
    {"self_attn.v_proj.weight", X_KV, X_C, X_NONE, SPLIT_ROWS, 1, ON_BLOCK, T_VW, 0},
    {"self_attn.v_proj.bias", X_KV, X_NONE, X_NONE, SPLIT_COLS, 1, ON_BLOCK, T_VB, OPT_QKV_BIAS},
    {"self_attn.o_proj.weight", X_C, X_C, X_NONE, SPLIT_COLS, 1, ON_BLOCK, T_APW, 0},
    {"post_attention_layernorm.weight", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_BLOCK, T_LN2W, 0},
    {"mlp.gate_proj.weight", X_INTER, X_C, X_NONE, SPLIT_ROWS, 1, ON_BLOCK, T_FCW, 0},
    {"mlp.up_proj.weight", X_INTER, X_C, X_NONE, SPLIT_ROWS, 1, ON_BLOCK, T_UPW, 0},
    {"mlp.down_proj.weight", X_C, X_INTER, X_NONE, SPLIT_COLS, 1, ON_BLOCK, T_MPW, 0},
    {"model.norm.weight", X_C, X_NONE, X_NONE, SPLIT_NONE, 1, ON_LAST, R_NORM_W, 0},
    {"lm_head.weight", X_PADDED_VOCAB, X_C, X_VOCAB, SPLIT_ROWS, 1, ON_LAST, R_HEAD, OPT_UNTIED},
};
#define N_LLAMA (int)(sizeof llama_plan / sizeof llama_plan[0])

/* The family's plan and its length */
static const plan_entry *plan_of(const gpt_shape *s, int *n) {
    if (s->family == GPT_FAMILY_LLAMA) {
        *n = N_LLAMA;
        return llama_plan;
    }
    *n = E_COUNT;
    return gpt2_plan;
}
/* Whether the head is the token embedding (GPT-2's always is; an unchecked shape may not say) */
static int tied(const gpt_shape *s) { return s->tie || s->family == GPT_FAMILY_GPT2; }
/* Whether the shape has entry e's option */
static int has_option(const gpt_shape *s, const plan_entry *e) {
    switch (e->option) {
    case OPT_QKV_BIAS: return s->qkv_bias;
    case OPT_TIED: return tied(s);
    case OPT_UNTIED: return !tied(s);
    default: return 1;
    }
}

/* The unsharded spec of entry e (a vector as [1, n]). */
static dt_shard full_spec(const gpt_shape *s, const plan_entry *e) {
    int64_t rows = extent(s, e->rows), cols = extent(s, e->cols);
    if (e->cols == X_NONE) return dt_shard_full(1, rows, 1);
    return dt_shard_full(rows, cols, e->real_rows == X_NONE ? rows : extent(s, e->real_rows));
}

/* The ranks of tp holding each piece of entry e: Llama's k and v rows, tp being above
 * n_kv_head, replicate each key/value head over tp / n_kv_head ranks; else 1. */
static int replicas_of(const gpt_shape *s, const plan_entry *e, int tp) {
    return e->rows == X_KV && e->split >= 0 ? gpt_kv_replicas(s, tp) : 1;
}

/* Appends entry e, named name, as this rank holds it: the tensor-parallel piece of its
 * spec at offset *off of the flat layout. */
static void add_tensor(gpt_model *m, int *idx, size_t *off, const char *name, const plan_entry *e, int layer,
                       int unit) {
    gpt_tensor *t = &m->tensors[(*idx)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    int vector = e->cols == X_NONE, split = e->split;
    t->ndim = vector ? 1 : 2;
    t->shard = full_spec(&m->shape, e);
    if (split >= 0 && m->tp > 1) /* divisibility is checked with n_head % tp (gpt_tp_splits_heads) */
        (void)dt_shard_split_replicated(&t->shard, split, m->tp, m->tp_rank, replicas_of(&m->shape, e, m->tp),
                                        e->parts, name);
    int64_t lr, lc;
    dt_shard_local_shape(&t->shard, &lr, &lc);
    if (!vector) { /* the local shape is what lives in memory */
        int64_t saved_rows = t->shard.real_rows;
        t->shape[0] = (int)lr;
        t->shape[1] = (int)lc;
        /* the real rows of this piece (split rows: those below real_rows of the whole) */
        int64_t first = t->shard.dim == 0 ? (int64_t)t->shard.index * lr : 0, real = saved_rows - first;
        t->saved_rows = split == 0 ? (int)(real < 0 ? 0 : real > lr ? lr : real) : (int)saved_rows;
    } else {
        t->shape[0] = (int)lc;
        t->shape[1] = 1;
        t->saved_rows = (int)lc;
    }
    t->numel = (size_t)lr * (size_t)lc;
    t->offset = *off;
    t->decay = !vector; /* weight decay on 2-D weights */
    t->layer = layer;
    t->unit = unit;
    *off += t->numel;
}

/* Whether this stage holds entry e (blocks: every block it has). */
static int held(const gpt_model *m, const plan_entry *e) {
    if (!has_option(&m->shape, e)) return 0;
    switch (e->where) {
    case ON_FIRST: return m->has_embed;
    case ON_TIED: return m->has_embed || m->has_head;
    case ON_LAST: return m->has_head;
    default: return 1;
    }
}
/* The entries of one unit kind: unit 0's (FIRST, TIED), a block's, the last unit's. */
static int kind_of(int where) { return where == ON_TIED ? ON_FIRST : where; }

/* The model's block index of local block j. */
static int layer_of(const gpt_model *m, int j) {
    int c = 0;
    while (c + 1 < m->nchunks && j >= m->chunk_block0[c + 1]) c++;
    return m->chunk_layer0[c] + j - m->chunk_block0[c];
}

/* Entry e's name in block `layer` (its global name) or, outside the blocks, its own. */
static void entry_name(char *buf, size_t cap, const gpt_shape *s, const plan_entry *e, int layer) {
    const char *block = s->family == GPT_FAMILY_LLAMA ? "model.layers" : "h";
    if (e->where == ON_BLOCK) snprintf(buf, cap, "%s.%d.%s", block, layer, e->name);
    else snprintf(buf, cap, "%s", e->name);
}

/* Records where tensor idx plays its role (a block's: its place in the block) */
static void note_role(gpt_model *m, const plan_entry *e, int idx, int in_block) {
    switch (e->role) {
    case R_WTE: /* tensor 0; the head's weight too when tied */
        if (tied(&m->shape)) m->t_head = idx;
        break;
    case R_WPE: m->t_wpe = idx; break;
    case R_NORM_W: m->t_norm_w = idx; break;
    case R_NORM_B: m->t_norm_b = idx; break;
    case R_HEAD: m->t_head = idx; break;
    default: m->role[e->role] = (signed char)in_block;
    }
}

/* The tensors of one unit, as the plan lists them. A last stage's unit 0 keeps room for
 * what only the first stage holds (wpe: m->tied_gap), so unit 0 has the same size on both
 * ends of the tie and a sharding of the two lines up. */
static void add_unit(gpt_model *m, int kind, int layer, int unit, int *idx, size_t *off) {
    char name[64];
    int n, first = *idx;
    const plan_entry *plan = plan_of(&m->shape, &n);
    for (int i = 0; i < n; i++) {
        const plan_entry *e = &plan[i];
        if (kind_of(e->where) != kind) continue;
        if (kind == ON_BLOCK && e->role == T_LN2W) unit += m->block_units - 1; /* the MLP half, norm_2 first */
        if (held(m, e)) {
            entry_name(name, sizeof name, &m->shape, e, layer);
            note_role(m, e, *idx, *idx - first);
            add_tensor(m, idx, off, name, e, layer, unit);
        } else if (kind == ON_FIRST && m->has_head && tied(&m->shape) && has_option(&m->shape, e)) {
            dt_shard sp = full_spec(&m->shape, e); /* replicated: its whole size */
            m->tied_gap += (size_t)dt_shard_local_numel(&sp);
            *off += (size_t)dt_shard_local_numel(&sp);
        }
    }
}

dt_status gpt_build_table(gpt_model *m) {
    int n;
    (void)plan_of(&m->shape, &n);
    m->tensors = calloc((size_t)n * (size_t)(m->nblocks + 1), sizeof(gpt_tensor));
    if (!m->tensors) return dt_fail(DT_ERUNTIME, "out of memory (model tables)");
    int idx = 0;
    size_t off = 0;
    m->t_wpe = m->t_norm_w = m->t_norm_b = m->t_head = -1;
    for (int k = 0; k < T_NROLES; k++) m->role[k] = -1;
    add_unit(m, ON_FIRST, -1, 0, &idx, &off);
    m->block0 = idx;
    for (int j = 0; j < m->nblocks; j++) add_unit(m, ON_BLOCK, layer_of(m, j), gpt_block_unit(m, j), &idx, &off);
    m->layer_tensors = m->nblocks ? (idx - m->block0) / m->nblocks : 0;
    add_unit(m, ON_LAST, -1, m->nblocks / m->unit_blocks * m->block_units + 1, &idx, &off);
    m->ntensors = idx;
    m->nparams = off;
    return DT_OK;
}

int gpt_each_tensor(const gpt_shape *s, int (*fn)(const char *, int, void *), void *ctx) {
    char name[64];
    int n;
    const plan_entry *plan = plan_of(s, &n);
    for (int i = 0; i < n; i++) {
        if (!has_option(s, &plan[i])) continue;
        int block = plan[i].where == ON_BLOCK;
        for (int l = 0; l < (block ? s->n_layer : 1); l++) {
            entry_name(name, sizeof name, s, &plan[i], l);
            if (fn(name, block ? l : kind_of(plan[i].where) == ON_FIRST ? -1 : s->n_layer, ctx)) return 1;
        }
    }
    return 0;
}

typedef struct {
    int (*fn)(const char *, void *);
    void *ctx;
} name_fn;
static int name_only(const char *name, int layer, void *ctx) {
    (void)layer;
    const name_fn *f = ctx;
    return f->fn(name, f->ctx);
}

int gpt_each_name(const gpt_shape *s, int (*fn)(const char *, void *), void *ctx) {
    name_fn f = {fn, ctx};
    return gpt_each_tensor(s, name_only, &f);
}

/* Elements of one unit kind's tensors on one rank of t: the split tensors' global sizes
 * summed and divided by their pieces (t, or t / replicas; pieces are equal), the
 * replicated ones whole; real: the model's rows only (no vocabulary padding). */
static size_t half_count(const gpt_shape *s, int kind, size_t t, int real, int half) {
    size_t split = 0, kv = 0, whole = 0, r = (size_t)gpt_kv_replicas(s, (int)t);
    int np, at = 0; /* at: 1 from a block's second norm on (its MLP half) */
    const plan_entry *plan = plan_of(s, &np);
    for (int i = 0; i < np; i++) {
        if (kind == ON_BLOCK && plan[i].where == ON_BLOCK && plan[i].role == T_LN2W) at = 1;
        if (half >= 0 && at != half) continue;
        if (kind_of(plan[i].where) != kind || !has_option(s, &plan[i])) continue;
        dt_shard sp = full_spec(s, &plan[i]);
        size_t n = (size_t)(real ? sp.real_rows : sp.rows) * (size_t)sp.cols;
        if (plan[i].split == SPLIT_NONE) whole += n;
        else if (replicas_of(s, &plan[i], (int)t) > 1) kv += n;
        else split += n;
    }
    return split / t + kv / (t / r) + whole;
}
static size_t kind_count(const gpt_shape *s, int kind, size_t t, int real) { return half_count(s, kind, t, real, -1); }

void gpt_unit_counts_layout(const gpt_shape *s, const gpt_layout *layout, size_t *first, size_t block[2], size_t *last,
                            int *nblocks) {
    gpt_stage_info st = gpt_stage_of(s, layout ? layout : &gpt_one_rank);
    size_t t = (size_t)(layout && layout->tp > 0 ? layout->tp : 1);
    int k = layout && layout->unit_blocks > 1 ? layout->unit_blocks : 1;
    if (layout && layout->split_blocks) { /* the attention half, the MLP half */
        block[0] = half_count(s, ON_BLOCK, t, 0, 0);
        block[1] = half_count(s, ON_BLOCK, t, 0, 1);
    } else {
        block[0] = (size_t)k * kind_count(s, ON_BLOCK, t, 0); /* a block unit: k blocks */
        block[1] = 0;
    }
    /* a last stage's tied wte and its gap (an untied head is in the last unit) */
    *first = st.embed || (st.head && tied(s)) ? kind_count(s, ON_FIRST, t, 0) : 0;
    *last = st.head ? kind_count(s, ON_LAST, t, 0) : 0;               /* ln_f */
    *nblocks = st.n / k;
}

size_t gpt_param_count_layout(const gpt_shape *s, const gpt_layout *layout) {
    size_t first, block[2], last;
    int n;
    gpt_unit_counts_layout(s, layout, &first, block, &last, &n);
    return first + (size_t)n * (block[0] + block[1]) + last;
}

size_t gpt_param_count_tp(const gpt_shape *s, int tp) {
    gpt_layout lay = {.tp = tp};
    return gpt_param_count_layout(s, &lay);
}

size_t gpt_param_count(const gpt_shape *s) {
    return kind_count(s, ON_FIRST, 1, 0) + (size_t)s->n_layer * kind_count(s, ON_BLOCK, 1, 0) +
           kind_count(s, ON_LAST, 1, 0);
}

size_t gpt_shape_params(const gpt_shape *s) {
    /* wte (its real rows), wpe, per block ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj
     * (12C² + 13C), ln_f */
    return kind_count(s, ON_FIRST, 1, 1) + (size_t)s->n_layer * kind_count(s, ON_BLOCK, 1, 1) +
           kind_count(s, ON_LAST, 1, 1);
}
