#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <fnmatch.h>
#include <string.h>

#include "../core/bf16.h"
#include "../core/mem.h"
#include "../core/rng.h"

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
    uint16_t *tok;                    /* BT (first stage): the tokens, in the backend's memory */
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
    uint16_t *tgt; /* BT: the targets, in the backend's memory */
    float *xstat;  /* 3 x head_rows: vocabulary-parallel row statistics (max; sum, target logit) */
    int head_rows;
    void *arena;
};

/* Per-block tensors in Hugging Face order, with shapes in units of C. */
enum { T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_APW, T_APB, T_LN2W, T_LN2B, T_FCW, T_FCB, T_MPW, T_MPB, T_PER_LAYER };

dt_status gpt_shape_check(gpt_shape *s) {
    if (s->n_layer < 1 || s->n_head < 1 || s->n_embd < 1 || s->seq_len < 1 || s->vocab_size < 1)
        return dt_fail(DT_EINPUT, "model: n_layer, n_head, n_embd, seq_len and vocab_size must be positive");
    if (s->n_embd % s->n_head != 0)
        return dt_fail(DT_EINPUT, "model: n_embd (%d) must be divisible by n_head (%d)", s->n_embd, s->n_head);
    if (s->vocab_size > 65536)
        return dt_fail(DT_EINPUT, "model: vocab_size %d exceeds 65536 (tokens are uint16)", s->vocab_size);
    s->padded_vocab = (s->vocab_size + 63) / 64 * 64;
    return DT_OK;
}

/* The stage a layout describes: its chunks' blocks (one chunk unless interleaved), their
 * total and the largest, and whether it holds the embeddings (a chunk from block 0) and
 * the head (a chunk ending at the last block; the tied wte lives on both ends). */
typedef struct {
    int nchunks, first[GPT_MAX_CHUNKS], count[GPT_MAX_CHUNKS];
    int n, maxc, embed, head, slots;
} stage_info;
static const gpt_layout one_rank = {.tp = 1};

static stage_info stage_of(const gpt_shape *s, const gpt_layout *lay) {
    stage_info st = {.nchunks = 1, .slots = lay->slots > 0 ? lay->slots : 1};
    st.first[0] = lay->first_layer;
    st.count[0] = lay->n_layers > 0 ? lay->n_layers : s->n_layer - lay->first_layer;
    if (lay->chunks > 1) { /* more than GPT_MAX_CHUNKS is refused by stage_check */
        st.nchunks = lay->chunks < GPT_MAX_CHUNKS ? lay->chunks : GPT_MAX_CHUNKS;
        for (int c = 0; c < st.nchunks; c++) {
            st.first[c] = lay->chunk_first[c];
            st.count[c] = lay->chunk_layers[c];
        }
    }
    for (int c = 0; c < st.nchunks; c++) {
        st.n += st.count[c];
        if (st.count[c] > st.maxc) st.maxc = st.count[c];
    }
    st.embed = st.first[0] == 0;
    st.head = st.first[st.nchunks - 1] + st.count[st.nchunks - 1] == s->n_layer;
    return st;
}

static dt_status stage_check(const gpt_shape *s, const gpt_layout *lay, const stage_info *st) {
    if (lay->chunks > GPT_MAX_CHUNKS)
        return dt_fail(DT_EINPUT, "model stage: %d chunks exceed the %d supported", lay->chunks, GPT_MAX_CHUNKS);
    for (int c = 0, end = 0; c < st->nchunks; c++) {
        if (st->first[c] < end || st->count[c] < 1 || st->first[c] + st->count[c] > s->n_layer)
            return dt_fail(DT_EINPUT, "model stage: blocks [%d, %d) of chunk %d are not within the model's %d after "
                           "the previous chunk's", st->first[c], st->first[c] + st->count[c], c, s->n_layer);
        end = st->first[c] + st->count[c];
    }
    return DT_OK;
}

/* split: -1 replicated, else the dimension of the [rows, cols] (1-D: [1, n]) tensor that
 * tensor parallelism splits, in `parts` fused parts; unit: the unit holding it */
static void add_tensor(gpt_model *m, int *idx, size_t *off, const char *name, int rows, int cols, int saved_rows,
                       int decay, int layer, int split, int parts, int unit) {
    gpt_tensor *t = &m->tensors[(*idx)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols > 0 ? 2 : 1;
    t->shard = cols > 0 ? dt_shard_full(rows, cols, saved_rows) : dt_shard_full(1, rows, 1);
    if (split >= 0 && m->tp > 1) /* divisibility is checked with n_head % tp */
        (void)dt_shard_split(&t->shard, split, m->tp, m->tp_rank, parts, name);
    int64_t lr, lc;
    dt_shard_local_shape(&t->shard, &lr, &lc);
    if (cols > 0) { /* the local shape is what lives in memory */
        t->shape[0] = (int)lr;
        t->shape[1] = (int)lc;
        /* the real rows of this piece (split rows: those below real_rows of the whole) */
        int64_t first = split == 0 && m->tp > 1 ? (int64_t)m->tp_rank * lr : 0, real = saved_rows - first;
        t->saved_rows = split == 0 ? (int)(real < 0 ? 0 : real > lr ? lr : real) : saved_rows;
    } else {
        t->shape[0] = (int)lc;
        t->shape[1] = 1;
        t->saved_rows = (int)lc;
    }
    t->numel = (size_t)lr * (size_t)lc;
    t->offset = *off;
    t->decay = decay;
    t->layer = layer;
    t->unit = unit;
    *off += t->numel;
}

/* The model's block index of local block j. */
static int layer_of(const gpt_model *m, int j) {
    int c = 0;
    while (c + 1 < m->nchunks && j >= m->chunk_block0[c + 1]) c++;
    return m->chunk_layer0[c] + j - m->chunk_block0[c];
}

static const char *const suffix[T_PER_LAYER] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias"};

/* Calls fn(name, ctx) for every tensor name of the whole model, until it returns nonzero. */
static int each_name(const gpt_shape *s, int (*fn)(const char *, void *), void *ctx) {
    static const char *const ends[] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
    char name[48];
    for (int k = 0; k < 4; k++)
        if (fn(ends[k], ctx)) return 1;
    for (int l = 0; l < s->n_layer; l++)
        for (int k = 0; k < T_PER_LAYER; k++) {
            snprintf(name, sizeof name, "h.%d.%s", l, suffix[k]);
            if (fn(name, ctx)) return 1;
        }
    return 0;
}

/* The next pattern of a comma-separated list into buf ("" at the end); returns the rest. */
static const char *next_pattern(const char *list, char *buf, size_t cap) {
    while (*list == ',' || *list == ' ') list++;
    size_t n = strcspn(list, ",");
    while (n > 0 && list[n - 1] == ' ') n--;
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), list);
    list += n;
    while (*list && *list != ',') list++;
    return list;
}

static int matches(const char *name, void *pattern) { return fnmatch((const char *)pattern, name, 0) == 0; }

dt_status gpt_freeze_check(const gpt_shape *s, const char *patterns) {
    char pat[128];
    for (const char *p = next_pattern(patterns, pat, sizeof pat); pat[0]; p = next_pattern(p, pat, sizeof pat))
        if (!each_name(s, matches, pat))
            return dt_fail(DT_EINPUT, "train.freeze: '%s' matches no tensor of the model (names as Hugging Face's: "
                           "wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight, ..., ln_f.bias)", pat);
    return DT_OK;
}

void gpt_freeze(gpt_model *m, const char *patterns, size_t *n) {
    char pat[128];
    size_t total = 0;
    for (int i = 0; i < m->ntensors; i++) {
        gpt_tensor *t = &m->tensors[i];
        for (const char *p = next_pattern(patterns, pat, sizeof pat); pat[0] && !t->frozen;
             p = next_pattern(p, pat, sizeof pat))
            t->frozen = matches(t->name, pat);
        if (t->frozen) total += t->numel;
    }
    if (n) *n = total;
}

static void build_table(gpt_model *m) {
    const gpt_shape *s = &m->shape;
    int C = s->n_embd, idx = 0, lnf_unit = m->nblocks + 1;
    size_t off = 0;
    char name[48];
    /* vocabulary-parallel: split by rows (the last pieces may hold the padding rows) */
    if (m->has_embed || m->has_head)
        add_tensor(m, &idx, &off, "wte.weight", s->padded_vocab, C, s->vocab_size, 1, -1, 0, 1, 0);
    if (m->has_embed) add_tensor(m, &idx, &off, "wpe.weight", s->seq_len, C, s->seq_len, 1, -1, -1, 1, 0);
    else if (m->has_head) { /* unit 0 as long as the first stage's, so a sharding of the two lines up */
        m->tied_gap = (size_t)s->seq_len * C;
        off += m->tied_gap;
    }
    m->block0 = idx;
    for (int j = 0; j < m->nblocks; j++) {
        int l = layer_of(m, j); /* tensors keep their global names */
        static const int rows[T_PER_LAYER] = {1, 1, 1, 3, 1, 1, 1, 1, 1, 4, 4, 1};
        static const int cols[T_PER_LAYER] = {0, 0, 3, 0, 1, 0, 0, 0, 4, 0, 1, 0};
        /* Megatron: c_attn, c_fc column-parallel (q, k, v split each); c_proj row-parallel */
        static const int split[T_PER_LAYER] = {-1, -1, 1, 1, 0, -1, -1, -1, 1, 1, 0, -1};
        static const int parts[T_PER_LAYER] = {1, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
        for (int k = 0; k < T_PER_LAYER; k++) {
            snprintf(name, sizeof name, "h.%d.%s", l, suffix[k]);
            int r = rows[k] * C, c = cols[k] * C;
            add_tensor(m, &idx, &off, name, r, c, r, cols[k] > 0, l, split[k], parts[k], 1 + j);
        }
    }
    if (m->has_head) {
        add_tensor(m, &idx, &off, "ln_f.weight", C, 0, C, 0, -1, -1, 1, lnf_unit);
        add_tensor(m, &idx, &off, "ln_f.bias", C, 0, C, 0, -1, -1, 1, lnf_unit);
    }
    m->ntensors = idx;
    m->nparams = off;
}

/* base + n elements of storage precision (fp32 or bf16: ops.h) */
static float *S(const gpt_model *m, const float *base, size_t n) {
    return (float *)((const char *)base + n * m->esz);
}
/* Where tensor i's parameters / gradients live now (through its unit's pointer). */
static float *tp(const gpt_model *m, int i) {
    const gpt_tensor *t = &m->tensors[i];
    return S(m, m->unit_params[t->unit], t->offset - m->units[t->unit].offset);
}
static float *tg(const gpt_model *m, int i) {
    const gpt_tensor *t = &m->tensors[i];
    return S(m, m->unit_grads[t->unit], t->offset - m->units[t->unit].offset);
}
/* Local block j's tensor k. */
static float *P(const gpt_model *m, int j, int k) { return tp(m, m->block0 + j * T_PER_LAYER + k); }
static float *G(const gpt_model *m, int j, int k) { return tg(m, m->block0 + j * T_PER_LAYER + k); }

/* A frozen tensor's gradient (at g, or where tg says) zeroed, before its unit's after_backward. */
static void zero_frozen(gpt_model *m, int i, float *g) {
    if (m->tensors[i].frozen) m->ops->zero(g ? g : tg(m, i), m->tensors[i].numel * m->esz);
}
static void zero_frozen_block(gpt_model *m, int j) {
    for (int k = 0; k < T_PER_LAYER; k++) zero_frozen(m, m->block0 + j * T_PER_LAYER + k, NULL);
}

static dt_status hook(const gpt_model *m, dt_status (*fn)(void *, int), int unit) {
    return fn ? fn(m->hooks.ctx, unit) : DT_OK;
}
#define HOOK(name, unit) DT_TRY(hook(m, m->hooks.name, unit))

/* Lays the activation buffers out in a->arena (or, with a NULL arena, only counts).
 * esz: bytes per element of storage precision; statistics and losses stay fp32. */
static size_t act_layout(const gpt_shape *s, int max_B, int max_T, size_t esz, const gpt_layout *lay, gpt_acts *a,
                         size_t *regions) {
    stage_info st = stage_of(s, lay);
    size_t LL = (size_t)st.maxc, BT = (size_t)max_B * max_T, C = (size_t)s->n_embd, Vp = (size_t)s->padded_vocab;
    size_t tp = (size_t)lay->tp, sp = lay->sp && tp > 1, head = (size_t)st.head, first = (size_t)st.embed;
    size_t split = lay->split_backward != 0;
    size_t rc = lay->recompute != 0, LI = rc ? 0 : LL; /* blocks of inner activations per slot */
    size_t NH = (size_t)s->n_head / tp, Cl = C / tp; /* this rank's heads and width */
    size_t R = sp ? BT / tp : BT;                     /* rows of the residual stream held here */
    /* The head is computed in row chunks so the logits need not exist for all rows at once;
     * chunks are large (up to 512 MB of logits) because every chunk re-reads and re-writes
     * the whole dwte in its GEMM, and BLAS is faster with a deeper K. */
    size_t head_rows = (128u << 20) / Vp;
    if (head_rows < 64) head_rows = 64;
    if (head_rows > BT) head_rows = BT;
    gpt_acts dummy;
    gpt_slot dummy_slot;
    if (!a) {
        memset(&dummy, 0, sizeof dummy);
        a = &dummy;
    }
    a->head_rows = (int)head_rows;
    enum { F32 = 4, U16 = 2 };
    enum { SEQ = GPT_ACT_SEQUENCE, TPR = GPT_ACT_TENSOR, OTH = GPT_ACT_OTHER };
    const size_t E = esz;
    typedef struct { float **p; size_t n, bytes; int region; } part;
    size_t total = 0; /* bytes, each part 64-byte aligned */
    char *p = a->arena;
    if (regions) memset(regions, 0, GPT_ACT_NREGIONS * sizeof *regions);
#define LAY(list)                                                             \
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {               \
        if (p) *list[i].p = (float *)(p + total);                            \
        size_t bytes_ = (list[i].n * list[i].bytes + 63) / 64 * 64;          \
        total += bytes_;                                                      \
        if (regions) regions[list[i].region] += bytes_;                       \
    }
    for (int k = 0; k < st.slots; k++) {
        gpt_slot *b = p ? &a->slot[k] : &dummy_slot;
        part per_slot[] = {
            {&b->encoded, R * C, E, SEQ},            {&b->ln1, LI * R * C, E, SEQ},         {&b->ln1_mean, LI * R, F32, SEQ},
            {&b->ln1_rstd, LI * R, F32, SEQ},         {&b->qkv, LI * BT * 3 * Cl, E, TPR},   {&b->atty, LI * BT * Cl, E, TPR},
            {&b->lse, LI * BT * NH, F32, TPR},        {&b->res2, LI * R * C, E, SEQ},        {&b->ln2, LI * R * C, E, SEQ},
            {&b->ln2_mean, LI * R, F32, SEQ},         {&b->ln2_rstd, LI * R, F32, SEQ},      {&b->fch, LI * BT * 4 * Cl, E, TPR},
            {&b->fch_gelu, LI * BT * 4 * Cl, E, TPR}, {&b->res3, LL * R * C, E, SEQ},        {&b->lnf, head * R * C, E, SEQ},
            {&b->lnf_mean, head * R, F32, SEQ},      {&b->lnf_rstd, head * R, F32, SEQ},    {&b->dres, R * C, E, SEQ},
            {(float **)&b->tok, first * BT, U16, OTH},
            {&b->wd_mp, split * LL * BT * C, E, OTH},    {&b->wd_fc, split * LL * BT * 4 * Cl, E, TPR},
            {&b->wd_ap, split * LL * BT * C, E, OTH},    {&b->wd_qkv, split * LL * BT * 3 * Cl, E, TPR},
            {&b->wd_ln2, split * LL * R * C, E, SEQ},    {&b->wd_ln1, split * LL * R * C, E, SEQ},
        };
        LAY(per_slot)
    }
    gpt_slot *q = p ? &a->rc : &dummy_slot; /* recompute: one block's inner activations for all */
    part inner[] = {
        {&q->ln1, rc * R * C, E, SEQ},         {&q->ln1_mean, rc * R, F32, SEQ},      {&q->ln1_rstd, rc * R, F32, SEQ},
        {&q->qkv, rc * BT * 3 * Cl, E, TPR},   {&q->atty, rc * BT * Cl, E, TPR},      {&q->lse, rc * BT * NH, F32, TPR},
        {&q->res2, rc * R * C, E, SEQ},        {&q->ln2, rc * R * C, E, SEQ},         {&q->ln2_mean, rc * R, F32, SEQ},
        {&q->ln2_rstd, rc * R, F32, SEQ},      {&q->fch, rc * BT * 4 * Cl, E, TPR},   {&q->fch_gelu, rc * BT * 4 * Cl, E, TPR},
    };
    LAY(inner)
    part shared[] = {
        {&a->logits, head * head_rows * Vp, E, OTH}, {&a->losses, head * BT, F32, OTH},  {&a->proj, BT * C, E, OTH},
        {&a->dsmall, BT * C, E, OTH},                {&a->dbig, BT * 4 * Cl, E, TPR},     {(float **)&a->tgt, head * BT, U16, OTH},
        {&a->xstat, head * 3 * head_rows, F32, OTH}, {&a->full, sp * BT * C, E, OTH},      {&a->rows, sp * R * C, E, SEQ},
        {&a->lngrad, sp * 4 * C, E, OTH},
    };
    LAY(shared)
#undef LAY
    return total;
}


size_t gpt_activation_bytes(const gpt_shape *s, int B, int T, size_t elem_bytes) {
    return act_layout(s, B, T, elem_bytes, &one_rank, NULL, NULL);
}

size_t gpt_activation_bytes_layout(const gpt_shape *s, int B, int T, size_t elem_bytes, const gpt_layout *layout,
                                   size_t *regions) {
    return act_layout(s, B, T, elem_bytes, layout ? layout : &one_rank, NULL, regions);
}

void gpt_unit_counts_layout(const gpt_shape *s, const gpt_layout *layout, size_t *first, size_t *block, size_t *last,
                            int *nblocks) {
    stage_info st = stage_of(s, layout ? layout : &one_rank);
    size_t C = (size_t)s->n_embd, t = (size_t)(layout && layout->tp > 0 ? layout->tp : 1);
    size_t wte = (size_t)s->padded_vocab * C / t, wpe = (size_t)s->seq_len * C;
    *block = (12 * C * C + 7 * C) / t + 6 * C; /* c_attn, c_fc, c_proj weights split; LayerNorms, c_proj biases not */
    *first = st.embed || st.head ? wte + wpe : 0; /* a last stage's wte and its gap */
    *last = st.head ? 2 * C : 0;                 /* ln_f */
    *nblocks = st.n;
}

size_t gpt_param_count_layout(const gpt_shape *s, const gpt_layout *layout) {
    size_t first, block, last;
    int n;
    gpt_unit_counts_layout(s, layout, &first, &block, &last, &n);
    return first + (size_t)n * block + last;
}

size_t gpt_param_count_tp(const gpt_shape *s, int tp) {
    gpt_layout lay = {.tp = tp};
    return gpt_param_count_layout(s, &lay);
}

size_t gpt_param_count(const gpt_shape *s) {
    size_t C = (size_t)s->n_embd;
    return (size_t)s->padded_vocab * C + (size_t)s->seq_len * C + (size_t)s->n_layer * (12 * C * C + 13 * C) + 2 * C;
}

dt_status gpt_create(gpt_model *m, const gpt_shape *shape, const dt_ops *ops, int max_B, int max_T) {
    return gpt_create_ex(m, shape, ops, max_B, max_T, 1);
}

dt_status gpt_create_ex(gpt_model *m, const gpt_shape *shape, const dt_ops *ops, int max_B, int max_T,
                        int alloc_state) {
    return gpt_create_layout(m, shape, ops, max_B, max_T, alloc_state, NULL);
}

dt_status gpt_create_layout(gpt_model *m, const gpt_shape *shape, const dt_ops *ops, int max_B, int max_T,
                            int alloc_state, const gpt_layout *layout) {
    memset(m, 0, sizeof *m);
    if (!layout) layout = &one_rank;
    int tp = layout->tp, tp_rank = layout->tp_rank;
    m->shape = *shape;
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->sp = layout->sp && tp > 1;
    m->split = layout->split_backward != 0;
    m->recompute = layout->recompute != 0;
    if (m->recompute && m->split)
        return dt_fail(DT_EINPUT, "train.recompute full: not with a split backward (parallel.schedule zb-h1: its "
                       "weight pass would need every block's inner activations again)");
    DT_TRY(gpt_shape_check(&m->shape));
    /* sizes below are size_t products: refuse a shape where they could wrap */
    if ((double)max_B * max_T * m->shape.n_embd * m->shape.n_layer * 64.0 +
            (double)max_B * max_T * m->shape.padded_vocab * 16.0 > 4.6e18)
        return dt_fail(DT_EINPUT, "model: a micro-batch of %d x %d tokens at %d wide, %d layers needs more than 4 EB "
                       "of activations", max_B, max_T, m->shape.n_embd, m->shape.n_layer);
    if (tp < 1 || tp_rank < 0 || tp_rank >= tp || m->shape.n_head % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_head %d (attention heads are split across "
                       "tensor-parallel ranks)", tp, m->shape.n_head);
    if (m->shape.padded_vocab % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide the padded vocabulary %d (a multiple of 64)", tp,
                       m->shape.padded_vocab);
    if (tp > 1 && (!ops->xent_rowmax || !ops->xent_rowsum || !ops->xent_finish))
        return dt_fail(DT_EINPUT, "parallel.tp %d: the %s backend has no vocabulary-parallel cross-entropy", tp,
                       ops->name);
    if (m->sp && ((long long)max_B * max_T) % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.sp: the micro-batch's %d x %d tokens do not split into parallel.tp %d "
                       "sequence pieces", max_B, max_T, tp);
    if (max_T > m->shape.seq_len)
        return dt_fail(DT_EINPUT, "sequence length %d exceeds the position table (model.seq_len %d)", max_T,
                       m->shape.seq_len);
    stage_info st = stage_of(&m->shape, layout);
    DT_TRY(stage_check(&m->shape, layout, &st));
    m->first_layer = st.first[0];
    m->nblocks = st.n;
    m->nchunks = st.nchunks;
    for (int c = 0; c < st.nchunks; c++) {
        m->chunk_layer0[c] = st.first[c];
        m->chunk_block0[c + 1] = m->chunk_block0[c] + st.count[c];
    }
    m->has_embed = st.embed;
    m->has_head = st.head;
    m->ops = ops;
    m->esz = dt_elem_bytes(ops);
    m->max_B = max_B;
    m->max_T = max_T;
    m->tensors = calloc((size_t)(4 + T_PER_LAYER * m->nblocks), sizeof(gpt_tensor));
    m->acts = calloc(1, sizeof(gpt_acts));
    if (m->acts) m->acts->slot = calloc((size_t)st.slots, sizeof(gpt_slot));
    if (!m->tensors || !m->acts || !m->acts->slot) return dt_fail(DT_ERUNTIME, "out of memory (model tables)");
    m->acts->nslots = st.slots;
    build_table(m);
    m->nunits = m->nblocks + 2;
    m->units = calloc((size_t)m->nunits, sizeof(gpt_unit));
    m->unit_params = calloc((size_t)m->nunits, sizeof(float *));
    m->unit_grads = calloc((size_t)m->nunits, sizeof(float *));
    if (!m->units || !m->unit_params || !m->unit_grads) return dt_fail(DT_ERUNTIME, "out of memory (model tables)");
    size_t next = 0; /* an empty unit (no embeddings or no ln_f on this stage) sits where it would be */
    for (int u = 0, i = 0; u < m->nunits; u++) {
        m->units[u].offset = next;
        for (; i < m->ntensors && m->tensors[i].unit == u; i++) m->units[u].count += m->tensors[i].numel;
        if (u == 0) m->units[0].count += m->tied_gap;
        next = m->units[u].offset + m->units[u].count;
    }
    if (alloc_state) {
        DT_TRY(ops->alloc((void **)&m->params, m->nparams * m->esz, "parameters"));
        DT_TRY(ops->alloc((void **)&m->grads, m->nparams * m->esz, "gradients"));
        for (int u = 0; u < m->nunits; u++) {
            m->unit_params[u] = S(m, m->params, m->units[u].offset);
            m->unit_grads[u] = S(m, m->grads, m->units[u].offset);
        }
    }

    gpt_acts *a = m->acts;
    m->act_bytes = act_layout(&m->shape, max_B, max_T, m->esz, layout, NULL, m->act_regions);
    DT_TRY(ops->alloc(&a->arena, m->act_bytes, "activations"));
    act_layout(&m->shape, max_B, max_T, m->esz, layout, a, NULL);
    return DT_OK;
}

void gpt_destroy(gpt_model *m) {
    if (m->ops) {
        if (m->acts) m->ops->free(m->acts->arena);
        m->ops->free(m->params);
        m->ops->free(m->grads);
    }
    if (m->acts) free(m->acts->slot);
    free(m->acts);
    free(m->tensors);
    free(m->units);
    free(m->unit_params);
    free(m->unit_grads);
    memset(m, 0, sizeof *m);
}

gpt_init_rule gpt_init_rule_for(const char *name, int n_layer, uint64_t seed) {
    size_t len = strlen(name);
    if (len > 5 && !strcmp(name + len - 5, ".bias")) return (gpt_init_rule){0, 0.0f, 0};
    if (strstr(name, "ln_")) return (gpt_init_rule){1, 0.0f, 0};
    float std = strstr(name, "c_proj.weight") ? 0.02f / sqrtf(2.0f * (float)n_layer) : 0.02f;
    return (gpt_init_rule){2, std, dt_rng_key(seed, name)};
}

float gpt_init_at(const gpt_init_rule *r, uint64_t index) {
    if (r->kind == 0) return 0.0f;
    if (r->kind == 1) return 1.0f;
    return (float)(r->std * dt_rng_normal_at(r->key, index));
}

void gpt_init(gpt_model *m, uint64_t seed) {
    if (m->tied_gap) memset(m->unit_params[0] + m->tensors[0].numel, 0, m->tied_gap * sizeof(float));
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        float *w = m->unit_params[t->unit] + (t->offset - m->units[t->unit].offset); /* fp32 host views */
        gpt_init_rule rule = gpt_init_rule_for(t->name, m->shape.n_layer, seed);
        int64_t rows, cols;
        dt_shard_local_shape(&t->shard, &rows, &cols);
        for (int64_t r = 0; r < rows; r++) { /* by global index: a shard gets its own slice */
            float *row = w + r * cols;
            if (!dt_shard_row_is_real(&t->shard, r)) {
                memset(row, 0, (size_t)cols * sizeof(float)); /* padded vocabulary rows */
                continue;
            }
            for (int64_t c = 0; c < cols; c++) row[c] = gpt_init_at(&rule, (uint64_t)dt_shard_global_index(&t->shard, r, c));
        }
    }
}

const gpt_tensor *gpt_find(const gpt_model *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

static const gpt_model *g_sort_model;
static int cmp_names(const void *a, const void *b) {
    return strcmp(g_sort_model->tensors[*(const int *)a].name, g_sort_model->tensors[*(const int *)b].name);
}

void gpt_sorted_order(const gpt_model *m, int *order) {
    for (int i = 0; i < m->ntensors; i++) order[i] = i;
    g_sort_model = m;
    qsort(order, (size_t)m->ntensors, sizeof(int), cmp_names);
}

dt_status gpt_unit_views(const gpt_model *m, float *base, float ***views) {
    *views = calloc((size_t)m->nunits, sizeof(float *));
    if (!*views) return dt_fail(DT_ERUNTIME, "out of memory (views)");
    for (int u = 0; u < m->nunits; u++) (*views)[u] = base + m->units[u].offset;
    return DT_OK;
}

void gpt_zero_grad(gpt_model *m) {
    for (int u = 0; u < m->nunits; u++) m->ops->zero(m->unit_grads[u], m->units[u].count * m->esz);
}

size_t gpt_num_params(const gpt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->ntensors; i++) /* whole tensors, whatever piece of them this rank holds */
        n += (size_t)(m->tensors[i].shard.real_rows * m->tensors[i].shard.cols);
    return n;
}

size_t gpt_shape_params(const gpt_shape *s) {
    size_t C = (size_t)s->n_embd, L = (size_t)s->n_layer;
    /* wte, wpe, per block ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (12C² + 13C), ln_f */
    return (size_t)s->vocab_size * C + (size_t)s->seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

double gpt_flops_per_token(const gpt_shape *s, int T) {
    /* 6 FLOPs per weight per token (matmuls, head included) + attention: forward 2·2·T/2·C
     * per layer for Q·Kᵀ and P·V with the causal half, x3 for backward. */
    double C = s->n_embd, L = s->n_layer, V = s->vocab_size;
    double weights = L * 12.0 * C * C + V * C;
    return 6.0 * weights + 6.0 * L * C * T;
}

/* ---- forward ---- */

/* Rows of the residual stream this rank holds for n rows of micro-batch (all, or with
 * sequence parallelism its 1/tp piece). */
static int local_rows(const gpt_model *m, int n) { return m->sp ? n / m->tp : n; }
static size_t max_local_rows(const gpt_model *m) { return (size_t)local_rows(m, m->max_B * m->max_T); }

static gpt_slot *slot_at(const gpt_model *m, int k) { return &m->acts->slot[k]; }

/* The input residual stream of the slot's chunk's block i (i = the chunk's block count:
 * the chunk's output). */
static float *layer_in(const gpt_model *m, const gpt_slot *b, int i) {
    size_t RC = max_local_rows(m) * (size_t)m->shape.n_embd;
    return i == 0 ? b->encoded : S(m, b->res3, (size_t)(i - 1) * RC);
}
static int chunk_blocks(const gpt_model *m, int c) { return m->chunk_block0[c + 1] - m->chunk_block0[c]; }
static float *slot_out(const gpt_model *m, const gpt_slot *b) { return layer_in(m, b, chunk_blocks(m, b->chunk)); }
/* Whether chunk c holds the embeddings / the head. */
static int embeds(const gpt_model *m, int c) { return m->has_embed && c == 0; }
static int heads(const gpt_model *m, int c) { return m->has_head && c == m->nchunks - 1; }

/* Local block j's saved activations in one slot. */
typedef struct {
    float *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fcg, *res3;
} block_acts;

static block_acts block_at(const gpt_model *m, const gpt_slot *a, int j) {
    size_t BT = (size_t)m->max_B * m->max_T, BTCl = BT * (size_t)m->shape.n_embd / (size_t)m->tp;
    size_t R = max_local_rows(m), RC = R * (size_t)m->shape.n_embd;
    int i = j - m->chunk_block0[a->chunk]; /* the block's index in its chunk */
    size_t L = (size_t)i; /* storage-precision buffers step through S(); statistics are fp32 */
    /* inner activations: the slot's own per block, or with recompute the one shared block's */
    const gpt_slot *n = m->recompute ? &m->acts->rc : a;
    size_t I = m->recompute ? 0 : L;
    return (block_acts){layer_in(m, a, i),            S(m, n->ln1, I * RC),       n->ln1_mean + I * R,
                        n->ln1_rstd + I * R,          S(m, n->qkv, I * 3 * BTCl), S(m, n->atty, I * BTCl),
                        n->lse + I * BT * (size_t)(m->shape.n_head / m->tp),      S(m, n->res2, I * RC),
                        S(m, n->ln2, I * RC),         n->ln2_mean + I * R,        n->ln2_rstd + I * R,
                        S(m, n->fch, I * 4 * BTCl),   S(m, n->fch_gelu, I * 4 * BTCl), S(m, a->res3, L * RC)};
}

/* The paired functions of tensor (and sequence) parallelism; identities on one rank.
 *
 * tp_sum: Megatron's g (forward, after a row-parallel layer) and f (backward, before a
 * column-parallel one) without sp: an all-reduce of the partial sums x (n elements). */
static dt_status tp_sum(gpt_model *m, float *x, size_t n) {
    return m->tp_comm.allreduce ? m->tp_comm.allreduce(m->tp_comm.ctx, x, n, GPT_TP_SUM) : DT_OK;
}

/* After a row-parallel layer (and the vocabulary-parallel embedding and head): partial
 * sums x over all N rows completed. Without sp in place (returns x); with sp reduce-
 * scattered, this rank's rows into out (returns out). */
static dt_status tp_complete(gpt_model *m, float *x, float *out, int N, float **done) {
    size_t C = (size_t)m->shape.n_embd;
    if (!m->sp) {
        *done = x;
        return tp_sum(m, x, (size_t)N * C);
    }
    *done = out;
    return m->tp_comm.reduce_scatter(m->tp_comm.ctx, out, x, (size_t)local_rows(m, N) * C);
}

/* Before a column-parallel layer (and the head): all N rows of x, of which this rank
 * holds its piece. Without sp it holds them all (returns x); with sp they are gathered
 * into acts->full (returned). */
static dt_status seq_gather(gpt_model *m, float *x, int N, float **all) {
    if (!m->sp) {
        *all = x;
        return DT_OK;
    }
    *all = m->acts->full;
    return m->tp_comm.allgather(m->tp_comm.ctx, m->acts->full, x, (size_t)local_rows(m, N) * m->shape.n_embd);
}

/* With sp a LayerNorm's weight and bias gradients come from this rank's rows only: they
 * are computed into part k of acts->lngrad (weight then bias), summed over the
 * tensor-parallel group and added to the gradients dw[k] (weight, bias contiguous after
 * it), so the replicated LayerNorms stay equal. Without sp they go to dw, db directly. */
typedef struct {
    float *w, *b;
} ln_grads;
static ln_grads ln_grad_target(gpt_model *m, float *dw, float *db, int part) {
    if (!m->sp) return (ln_grads){dw, db};
    float *w = S(m, m->acts->lngrad, (size_t)part * 2 * m->shape.n_embd);
    return (ln_grads){w, S(m, w, (size_t)m->shape.n_embd)};
}
static dt_status ln_grad_finish(gpt_model *m, float *const *dw, int nparts) {
    if (!m->sp) return DT_OK;
    size_t C2 = 2 * (size_t)m->shape.n_embd;
    DT_TRY(tp_sum(m, m->acts->lngrad, (size_t)nparts * C2));
    for (int k = 0; k < nparts; k++) m->ops->add(dw[k], dw[k], S(m, m->acts->lngrad, (size_t)k * C2), C2);
    return DT_OK;
}

/* With tensor parallelism (tp ranks) this rank holds NH/tp heads (Cl = C/tp of the
 * attention width) and 4C/tp MLP columns; the row-parallel projections produce partial
 * sums, completed by tp_complete, their bias added by piece 0 alone. With sp the
 * LayerNorms and residual adds run on this rank's Nl rows. */
static dt_status block_forward(gpt_model *m, const gpt_slot *a, int j) {
    const dt_ops *o = m->ops;
    float *proj = m->acts->proj, *in, *p;
    int B = a->B, T = a->T, C = m->shape.n_embd, Cl = C / m->tp, NHl = m->shape.n_head / m->tp, N = B * T;
    int Nl = local_rows(m, N), bias_here = m->tp_rank == 0;
    block_acts b = block_at(m, a, j);
    o->layernorm_fwd(b.ln1, b.ln1_mean, b.ln1_rstd, b.x, P(m, j, T_LN1W), P(m, j, T_LN1B), Nl, C);
    DT_TRY(seq_gather(m, b.ln1, N, &in));
    o->linear_fwd(b.qkv, in, P(m, j, T_QKVW), P(m, j, T_QKVB), N, C, 3 * Cl);
    if (m->cp_comm.attention_fwd) DT_TRY(m->cp_comm.attention_fwd(m->cp_comm.ctx, b.atty, b.lse, b.qkv, B, T, Cl, NHl));
    else o->attention_fwd(b.atty, b.lse, b.qkv, B, T, Cl, NHl);
    o->linear_fwd(proj, b.atty, P(m, j, T_APW), bias_here ? P(m, j, T_APB) : NULL, N, Cl, C);
    DT_TRY(tp_complete(m, proj, m->acts->rows, N, &p));
    o->add(b.res2, b.x, p, (size_t)Nl * C);
    o->layernorm_fwd(b.ln2, b.ln2_mean, b.ln2_rstd, b.res2, P(m, j, T_LN2W), P(m, j, T_LN2B), Nl, C);
    DT_TRY(seq_gather(m, b.ln2, N, &in));
    dt_linear_gelu_fwd(o, b.fcg, b.fch, in, P(m, j, T_FCW), P(m, j, T_FCB), N, C, 4 * Cl);
    o->linear_fwd(proj, b.fcg, P(m, j, T_MPW), bias_here ? P(m, j, T_MPB) : NULL, N, 4 * Cl, C);
    DT_TRY(tp_complete(m, proj, m->acts->rows, N, &p));
    o->add(b.res3, b.res2, p, (size_t)Nl * C);
    return DT_OK;
}

static dt_status check_slot(const gpt_model *m, int slot) {
    if (slot < 0 || slot >= m->acts->nslots)
        return dt_fail(DT_EINPUT, "model: activation slot %d of %d", slot, m->acts->nslots);
    return DT_OK;
}

dt_status gpt_forward(gpt_model *m, int slot, const uint16_t *tokens, int B, int T, int pos0) {
    return gpt_forward_chunk(m, slot, 0, tokens, B, T, pos0);
}

dt_status gpt_forward_chunk(gpt_model *m, int slot, int chunk, const uint16_t *tokens, int B, int T, int pos0) {
    DT_TRY(check_slot(m, slot));
    if (chunk < 0 || chunk >= m->nchunks)
        return dt_fail(DT_EINPUT, "model: chunk %d of %d", chunk, m->nchunks);
    const dt_ops *o = m->ops;
    gpt_slot *a = slot_at(m, slot);
    int C = m->shape.n_embd, N = B * T, Nl = local_rows(m, N);
    const int *cpos = m->cp_comm.positions;
    if (B < 1 || T < 1 || B > m->max_B || T > m->max_T || pos0 < 0 ||
        (cpos ? pos0 != 0 || cpos[T - 1] >= m->shape.seq_len : pos0 + T > m->shape.seq_len))
        return dt_fail(DT_EINPUT, "model: a %d x %d micro-batch at position %d does not fit %d x %d (positions %d)", B,
                       T, pos0, m->max_B, m->max_T, m->shape.seq_len);
    if (m->sp && N % m->tp != 0)
        return dt_fail(DT_EINPUT, "parallel.sp: %d x %d tokens do not split into parallel.tp %d pieces", B, T, m->tp);
    a->B = B;
    a->T = T;
    a->pos0 = pos0;
    a->chunk = chunk;
    if (embeds(m, chunk)) {
        HOOK(before_forward, 0);
        o->upload(a->tok, tokens, (size_t)N * sizeof(uint16_t));
        /* vocabulary-parallel: each rank embeds the tokens in its rows, piece 0 adds the positions */
        int Vl = m->shape.padded_vocab / m->tp;
        float *emb = m->sp ? m->acts->proj : a->encoded, *done;
        const float *wpe = m->tp_rank == 0 ? S(m, tp(m, 1), (size_t)pos0 * C) : NULL;
        if (!cpos) {
            o->embed_fwd(emb, a->tok, tp(m, 0), wpe, B, T, C, m->tp_rank * Vl, Vl);
        } else { /* context parallelism: each run of consecutive positions of each sequence */
            for (int b = 0; b < B; b++)
                for (int t0 = 0, t1; t0 < T; t0 = t1) {
                    for (t1 = t0 + 1; t1 < T && cpos[t1] == cpos[t1 - 1] + 1; t1++) {}
                    size_t r = (size_t)b * T + t0;
                    o->embed_fwd(S(m, emb, r * C), a->tok + r, tp(m, 0), wpe ? S(m, wpe, (size_t)cpos[t0] * C) : NULL, 1,
                                 t1 - t0, C, m->tp_rank * Vl, Vl);
                }
        }
        DT_TRY(tp_complete(m, emb, a->encoded, N, &done));
    }
    for (int j = m->chunk_block0[chunk]; j < m->chunk_block0[chunk + 1]; j++) {
        HOOK(before_forward, 1 + j);
        DT_TRY(block_forward(m, a, j));
        HOOK(after_forward, 1 + j);
    }
    if (heads(m, chunk)) {
        int lnf_unit = m->nblocks + 1;
        HOOK(before_forward, lnf_unit);
        o->layernorm_fwd(a->lnf, a->lnf_mean, a->lnf_rstd, slot_out(m, a), tp(m, m->ntensors - 2),
                         tp(m, m->ntensors - 1), Nl, C);
        HOOK(after_forward, lnf_unit);
    }
    return DT_OK;
}

int gpt_slot_count(const gpt_model *m) { return m->acts->nslots; }
float *gpt_slot_input(gpt_model *m, int slot) { return slot_at(m, slot)->encoded; }
float *gpt_slot_output(gpt_model *m, int slot) { return slot_out(m, slot_at(m, slot)); }

void gpt_stage_layout(const gpt_model *m, gpt_layout *out) {
    memset(out, 0, sizeof *out);
    out->tp = 1;
    out->first_layer = m->first_layer;
    out->n_layers = m->nblocks;
    if (m->nchunks > 1) {
        out->chunks = m->nchunks;
        for (int c = 0; c < m->nchunks; c++) {
            out->chunk_first[c] = m->chunk_layer0[c];
            out->chunk_layers[c] = chunk_blocks(m, c);
        }
    }
}
float *gpt_slot_grad(gpt_model *m, int slot) { return slot_at(m, slot)->dres; }

/* Vocabulary-parallel cross-entropy over R rows of local logits (columns [v0, v0 + Vl)):
 * the row max and then the sum of exponentials and the target's logit are completed over
 * the tensor-parallel group, so no rank ever holds a whole row of logits. */
static dt_status xent_tp(gpt_model *m, int R, int r0, const uint16_t *targets, float grad_scale) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int Vl = m->shape.padded_vocab / m->tp, v0 = m->tp_rank * Vl;
    int real = m->shape.vocab_size - v0 < 0 ? 0 : m->shape.vocab_size - v0 > Vl ? Vl : m->shape.vocab_size - v0;
    float *mx = a->xstat, *st = a->xstat + a->head_rows;
    o->xent_rowmax(a->logits, mx, R, Vl, real);
    DT_TRY(m->tp_comm.allreduce(m->tp_comm.ctx, mx, (size_t)R, GPT_TP_MAX_F32));
    o->xent_rowsum(a->logits, mx, targets + r0, st, R, Vl, real, v0);
    DT_TRY(m->tp_comm.allreduce(m->tp_comm.ctx, st, 2 * (size_t)R, GPT_TP_SUM_F32));
    o->xent_finish(a->logits, a->losses + r0, mx, st, targets + r0, R, Vl, real, v0, grad_scale);
    return DT_OK;
}

/* LM head over row chunks of all N rows of slot b: logits = lnf·wteᵀ, softmax
 * cross-entropy, and when grad_scale != 0 its backward (dwte +=) while the chunk is hot;
 * *dlnf receives this rank's rows of the gradient of lnf. */
static dt_status head(gpt_model *m, gpt_slot *b, const uint16_t *targets, float grad_scale, double *loss,
                      float **dlnf) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int N = b->B * b->T, C = m->shape.n_embd, V = m->shape.vocab_size, Vl = m->shape.padded_vocab / m->tp;
    const float *wte = tp(m, 0); /* this rank's vocabulary rows */
    int vocab_parallel = m->tp_comm.allreduce != NULL;
    float *lnf, *dwte = m->head_grad ? m->head_grad : tg(m, 0);
    DT_TRY(seq_gather(m, b->lnf, N, &lnf));
    o->upload(a->tgt, targets, (size_t)N * sizeof(uint16_t));
    targets = a->tgt;
    for (int r0 = 0; r0 < N; r0 += a->head_rows) {
        int R = N - r0 < a->head_rows ? N - r0 : a->head_rows;
        const float *x = S(m, lnf, (size_t)r0 * C);
        o->gemm(0, 1, R, Vl, C, 1.0f, x, C, wte, C, 0.0f, a->logits, Vl);
        if (vocab_parallel) DT_TRY(xent_tp(m, R, r0, targets, grad_scale));
        else o->softmax_xent(a->logits, a->losses + r0, targets + r0, R, V, Vl, grad_scale);
        if (grad_scale != 0.0f) { /* dlnf: a partial sum over the vocabulary pieces (completed below) */
            o->gemm(0, 0, R, C, Vl, 1.0f, a->logits, Vl, wte, C, 0.0f, S(m, a->dsmall, (size_t)r0 * C), C);
            o->gemm(1, 0, Vl, C, R, 1.0f, a->logits, Vl, x, C, 1.0f, dwte, C);
        }
    }
    if (grad_scale != 0.0f) DT_TRY(tp_complete(m, a->dsmall, a->rows, N, dlnf));
    *loss = o->sum(a->losses, (size_t)N);
    return DT_OK;
}

dt_status gpt_loss(gpt_model *m, int slot, const uint16_t *targets, float grad_scale, double *loss_out) {
    DT_TRY(check_slot(m, slot));
    const dt_ops *o = m->ops;
    gpt_slot *b = slot_at(m, slot);
    if (!heads(m, b->chunk)) return dt_fail(DT_EINPUT, "model: the loss is computed on the last stage only");
    int C = m->shape.n_embd, Nl = local_rows(m, b->B * b->T), lnf_unit = m->nblocks + 1;
    if (grad_scale == 0.0f) return head(m, b, targets, 0.0f, loss_out, NULL);
    HOOK(before_backward, 0);
    if (m->head_grad) HOOK(before_backward, GPT_HEAD_PART);
    double loss;
    float *dlnf;
    DT_TRY(head(m, b, targets, grad_scale, &loss, &dlnf));
    zero_frozen(m, 0, m->head_grad); /* the tied wte's head gradient */
    if (m->head_grad) HOOK(after_backward, GPT_HEAD_PART);
    int lnw = m->ntensors - 2, lnb = m->ntensors - 1;
    o->zero(b->dres, (size_t)Nl * C * m->esz);
    HOOK(before_backward, lnf_unit);
    ln_grads lnf = ln_grad_target(m, tg(m, lnw), tg(m, lnb), 0);
    if (m->sp) o->zero(m->acts->lngrad, 2 * (size_t)C * m->esz);
    o->layernorm_bwd(b->dres, lnf.w, lnf.b, dlnf, slot_out(m, b), tp(m, lnw), b->lnf_mean, b->lnf_rstd,
                     Nl, C);
    float *const lnf_grads[1] = {tg(m, lnw)};
    DT_TRY(ln_grad_finish(m, lnf_grads, 1));
    zero_frozen(m, lnw, NULL);
    zero_frozen(m, lnb, NULL);
    HOOK(after_backward, lnf_unit);
    if (!m->has_embed) HOOK(after_backward, 0); /* a last stage's wte: the head alone adds to it */
    *loss_out = loss;
    return DT_OK;
}

/* A whole model in one stage (gpt_forward_backward and friends): refuses stage models. */
static dt_status check_whole(const gpt_model *m) {
    if (!m->has_embed || !m->has_head || m->nblocks != m->shape.n_layer)
        return dt_fail(DT_EINPUT, "model: blocks [%d, %d) are a pipeline stage; this pass needs the whole model",
                       m->first_layer, m->first_layer + m->nblocks);
    return DT_OK;
}

dt_status gpt_eval_loss(gpt_model *m, const uint16_t *tokens, const uint16_t *targets, int B, int T, double *loss) {
    DT_TRY(check_whole(m));
    DT_TRY(gpt_forward(m, 0, tokens, B, T, 0));
    DT_TRY(gpt_loss(m, 0, targets, 0.0f, loss));
    HOOK(after_forward, 0);
    return DT_OK;
}

dt_status gpt_next_logits(gpt_model *m, const uint16_t *tokens, int T, float *logits) {
    if (m->sp) return dt_fail(DT_EINPUT, "sampling with sequence parallelism is not implemented");
    DT_TRY(check_whole(m));
    DT_TRY(gpt_forward(m, 0, tokens, 1, T, 0));
    return gpt_last_logits(m, 0, logits);
}

dt_status gpt_last_logits(gpt_model *m, int slot, float *logits) {
    if (m->sp) return dt_fail(DT_EINPUT, "sampling with sequence parallelism is not implemented");
    DT_TRY(check_slot(m, slot));
    gpt_slot *a = slot_at(m, slot);
    if (!heads(m, a->chunk)) return dt_fail(DT_EINPUT, "model: the logits are computed on the last stage only");
    int T = a->T, C = m->shape.n_embd, Vp = m->shape.padded_vocab, Vl = Vp / m->tp;
    float *row = m->acts->logits; /* vocabulary-parallel: each rank its columns, the rest zero, summed over tp */
    if (m->tp > 1) m->ops->zero(row, (size_t)Vp * m->esz);
    m->ops->gemm(0, 1, 1, Vl, C, 1.0f, S(m, a->lnf, (size_t)(a->B * T - 1) * C), C, tp(m, 0), C, 0.0f,
                 S(m, row, (size_t)m->tp_rank * Vl), Vl);
    DT_TRY(tp_sum(m, row, (size_t)Vp));
    HOOK(after_forward, 0);
    size_t V = (size_t)m->shape.vocab_size;
    if (!m->ops->bf16) {
        m->ops->download(logits, m->acts->logits, V * sizeof(float));
    } else { /* bf16 logits, widened on the host (sampling, not training: a small allocation is fine) */
        uint16_t *h = malloc(V * sizeof(uint16_t));
        if (!h) return dt_fail(DT_ERUNTIME, "out of memory (logits)");
        m->ops->download(h, m->acts->logits, V * sizeof(uint16_t));
        for (size_t i = 0; i < V; i++) logits[i] = dt_bf16_to_f32(h[i]);
        free(h);
    }
    return DT_OK;
}

/* ---- backward ---- */

/* The c_proj biases' gradients are computed on every tensor-parallel rank from the same
 * (replicated, with sp gathered) output gradient, so the replicated bias stays the same
 * everywhere. With sp, dres holds this rank's rows and is gathered before each
 * row-parallel layer's backward (the conjugate of its forward reduce-scatter); the
 * LayerNorm outputs are gathered again for the column-parallel weight gradients rather
 * than kept whole (Megatron-SP's trade: memory for a second all-gather). */
/* Local block j's slices of a slot's split-backward buffers. */
typedef struct {
    float *mp, *fc, *ap, *qkv, *ln2, *ln1;
} block_douts;
static block_douts douts_at(const gpt_model *m, const gpt_slot *s, int j) {
    size_t BTC = (size_t)m->max_B * m->max_T * (size_t)m->shape.n_embd, BTCl = BTC / (size_t)m->tp;
    size_t RC = max_local_rows(m) * (size_t)m->shape.n_embd, L = (size_t)(j - m->chunk_block0[s->chunk]);
    return (block_douts){S(m, s->wd_mp, L * BTC), S(m, s->wd_fc, L * 4 * BTCl), S(m, s->wd_ap, L * BTC),
                         S(m, s->wd_qkv, L * 3 * BTCl), S(m, s->wd_ln2, L * RC), S(m, s->wd_ln1, L * RC)};
}

/* The input gradient of block j; its weight gradients too unless split, else the output
 * gradients of its linears and LayerNorms kept for block_weight (so every weight gradient
 * of a block is written by one call: a sharding wrapper reduces a unit once per micro-batch,
 * and the bitwise mode folds it per micro-batch). */
static dt_status block_backward(gpt_model *m, gpt_slot *s, int j, int split) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int B = s->B, T = s->T, C = m->shape.n_embd, Cl = C / m->tp, NHl = m->shape.n_head / m->tp, N = B * T;
    int Nl = local_rows(m, N);
    size_t NC = (size_t)N * C * m->esz;
    block_acts b = block_at(m, s, j);
    block_douts k = split ? douts_at(m, s, j) : (block_douts){NULL, a->dbig, NULL, a->dbig, NULL, NULL};
    size_t RCb = (size_t)Nl * C * m->esz;
#define WG(t) (split ? NULL : G(m, j, t)) /* a weight's gradient now, or later */
    float *dout, *in = NULL, *dln;
    /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) */
    DT_TRY(seq_gather(m, s->dres, N, &dout));
    if (split) o->copy(k.mp, dout, NC);
    if (!split) o->linear_bwd(NULL, G(m, j, T_MPW), G(m, j, T_MPB), dout, b.fcg, P(m, j, T_MPW), N, 4 * Cl, C, 0);
    dt_linear_dgelu_bwd(o, k.fc, dout, P(m, j, T_MPW), b.fch, N, 4 * Cl, C);
    if (!split) DT_TRY(seq_gather(m, b.ln2, N, &in));
    o->linear_bwd(a->dsmall, WG(T_FCW), WG(T_FCB), k.fc, in, P(m, j, T_FCW), N, C, 4 * Cl, 0);
    DT_TRY(tp_complete(m, a->dsmall, a->rows, N, &dln));
    ln_grads ln2 = ln_grad_target(m, G(m, j, T_LN2W), G(m, j, T_LN2B), 0);
    ln_grads ln1 = ln_grad_target(m, G(m, j, T_LN1W), G(m, j, T_LN1B), 1);
    if (split) {
        ln2 = ln1 = (ln_grads){NULL, NULL};
        o->copy(k.ln2, dln, RCb);
    }
    if (m->sp && !split) o->zero(a->lngrad, 4 * (size_t)C * m->esz);
    o->layernorm_bwd(s->dres, ln2.w, ln2.b, dln, b.res2, P(m, j, T_LN2W), b.ln2_mean, b.ln2_rstd, Nl, C);
    /* attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))) */
    DT_TRY(seq_gather(m, s->dres, N, &dout));
    if (split) o->copy(k.ap, dout, NC);
    o->linear_bwd(a->dsmall, WG(T_APW), WG(T_APB), dout, b.atty, P(m, j, T_APW), N, Cl, C, 0);
    if (m->cp_comm.attention_bwd)
        DT_TRY(m->cp_comm.attention_bwd(m->cp_comm.ctx, k.qkv, a->dsmall, b.qkv, b.atty, b.lse, B, T, Cl, NHl));
    else o->attention_bwd(k.qkv, a->dsmall, b.qkv, b.atty, b.lse, B, T, Cl, NHl);
    if (!split) DT_TRY(seq_gather(m, b.ln1, N, &in));
    o->linear_bwd(a->dsmall, WG(T_QKVW), WG(T_QKVB), k.qkv, in, P(m, j, T_QKVW), N, C, 3 * Cl, 0);
#undef WG
    DT_TRY(tp_complete(m, a->dsmall, a->rows, N, &dln));
    if (split) o->copy(k.ln1, dln, RCb);
    o->layernorm_bwd(s->dres, ln1.w, ln1.b, dln, b.x, P(m, j, T_LN1W), b.ln1_mean, b.ln1_rstd, Nl, C);
    if (split) return DT_OK;
    float *const ln_dw[2] = {G(m, j, T_LN2W), G(m, j, T_LN1W)};
    return ln_grad_finish(m, ln_dw, 2);
}

/* Block j's LayerNorm weight gradients from their kept output gradients (split W). */
static dt_status block_ln_weight(gpt_model *m, gpt_slot *s, int j) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, Nl = local_rows(m, s->B * s->T);
    block_acts b = block_at(m, s, j);
    block_douts k = douts_at(m, s, j);
    ln_grads ln2 = ln_grad_target(m, G(m, j, T_LN2W), G(m, j, T_LN2B), 0);
    ln_grads ln1 = ln_grad_target(m, G(m, j, T_LN1W), G(m, j, T_LN1B), 1);
    if (m->sp) o->zero(m->acts->lngrad, 4 * (size_t)C * m->esz);
    o->layernorm_bwd(NULL, ln2.w, ln2.b, k.ln2, b.res2, P(m, j, T_LN2W), b.ln2_mean, b.ln2_rstd, Nl, C);
    o->layernorm_bwd(NULL, ln1.w, ln1.b, k.ln1, b.x, P(m, j, T_LN1W), b.ln1_mean, b.ln1_rstd, Nl, C);
    float *const ln_dw[2] = {G(m, j, T_LN2W), G(m, j, T_LN1W)};
    return ln_grad_finish(m, ln_dw, 2);
}

/* Split backward, W: block j's linear weight gradients from the kept output gradients. */
static dt_status block_weight(gpt_model *m, gpt_slot *s, int j) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, Cl = C / m->tp, N = s->B * s->T;
    block_acts b = block_at(m, s, j);
    block_douts k = douts_at(m, s, j);
    float *in;
    o->linear_bwd(NULL, G(m, j, T_MPW), G(m, j, T_MPB), k.mp, b.fcg, NULL, N, 4 * Cl, C, 0);
    DT_TRY(seq_gather(m, b.ln2, N, &in));
    o->linear_bwd(NULL, G(m, j, T_FCW), G(m, j, T_FCB), k.fc, in, NULL, N, C, 4 * Cl, 0);
    o->linear_bwd(NULL, G(m, j, T_APW), G(m, j, T_APB), k.ap, b.atty, NULL, N, Cl, C, 0);
    DT_TRY(seq_gather(m, b.ln1, N, &in));
    o->linear_bwd(NULL, G(m, j, T_QKVW), G(m, j, T_QKVB), k.qkv, in, NULL, N, C, 3 * Cl, 0);
    return block_ln_weight(m, s, j);
}

/* The embeddings' gradients (first stage) from the residual stream's gradient. */
static dt_status embed_backward(gpt_model *m, gpt_slot *s) {
    int C = m->shape.n_embd, N = s->B * s->T;
    if (!m->has_head) HOOK(before_backward, 0); /* else the head asked for it */
    int Vl = m->shape.padded_vocab / m->tp;     /* dwpe on every rank: dres is replicated (or gathered) */
    float *dall;
    DT_TRY(seq_gather(m, s->dres, N, &dall));
    const int *cpos = m->cp_comm.positions;
    if (!cpos) {
        m->ops->embed_bwd(tg(m, 0), S(m, tg(m, 1), (size_t)s->pos0 * C), dall, s->tok, s->B, s->T, C, m->tp_rank * Vl,
                          Vl);
        zero_frozen(m, 0, NULL);
        zero_frozen(m, 1, NULL);
        HOOK(after_backward, 0);
        return DT_OK;
    }
    for (int b = 0; b < s->B; b++) /* context parallelism: as in the forward, run by run */
        for (int t0 = 0, t1; t0 < s->T; t0 = t1) {
            for (t1 = t0 + 1; t1 < s->T && cpos[t1] == cpos[t1 - 1] + 1; t1++) {}
            size_t r = (size_t)b * s->T + t0;
            m->ops->embed_bwd(tg(m, 0), S(m, tg(m, 1), (size_t)cpos[t0] * C), S(m, dall, r * C), s->tok + r, 1, t1 - t0, C,
                              m->tp_rank * Vl, Vl);
        }
    zero_frozen(m, 0, NULL);
    zero_frozen(m, 1, NULL);
    HOOK(after_backward, 0);
    return DT_OK;
}

static dt_status check_split(const gpt_model *m, int slot, int want) {
    DT_TRY(check_slot(m, slot));
    if (m->split != want)
        return dt_fail(DT_EINPUT, "model: a split backward needs a layout with split_backward (and gpt_backward "
                       "one without)");
    return DT_OK;
}

dt_status gpt_backward(gpt_model *m, int slot) {
    DT_TRY(check_slot(m, slot));
    if (m->split) { /* both halves, one after the other */
        DT_TRY(gpt_backward_input(m, slot));
        return gpt_backward_weight(m, slot);
    }
    gpt_slot *s = slot_at(m, slot);
    for (int j = m->chunk_block0[s->chunk + 1] - 1; j >= m->chunk_block0[s->chunk]; j--) {
        HOOK(before_backward, 1 + j);
        /* recompute: the block's inner activations again, from its kept input (the same
         * kernels on the same inputs: the same bits; with tp or cp the same collectives) */
        if (m->recompute) DT_TRY(block_forward(m, s, j));
        DT_TRY(block_backward(m, s, j, 0));
        zero_frozen_block(m, j);
        HOOK(after_backward, 1 + j);
    }
    return embeds(m, s->chunk) ? embed_backward(m, s) : DT_OK;
}

dt_status gpt_backward_input(gpt_model *m, int slot) {
    DT_TRY(check_split(m, slot, 1));
    gpt_slot *s = slot_at(m, slot);
    for (int j = m->chunk_block0[s->chunk + 1] - 1; j >= m->chunk_block0[s->chunk]; j--) {
        HOOK(before_backward, 1 + j);
        DT_TRY(block_backward(m, s, j, 1));
    }
    return DT_OK;
}

dt_status gpt_backward_weight(gpt_model *m, int slot) {
    DT_TRY(check_split(m, slot, 1));
    gpt_slot *s = slot_at(m, slot);
    for (int j = m->chunk_block0[s->chunk + 1] - 1; j >= m->chunk_block0[s->chunk]; j--) {
        HOOK(before_backward, 1 + j); /* again: its gradients are written now */
        DT_TRY(block_weight(m, s, j));
        zero_frozen_block(m, j);
        HOOK(after_backward, 1 + j);
    }
    return embeds(m, s->chunk) ? embed_backward(m, s) : DT_OK;
}

dt_status gpt_forward_backward(gpt_model *m, const uint16_t *tokens, const uint16_t *targets, int B, int T,
                               float grad_scale, double *loss) {
    DT_TRY(check_whole(m));
    DT_TRY(gpt_forward(m, 0, tokens, B, T, 0));
    DT_TRY(gpt_loss(m, 0, targets, grad_scale, loss));
    return gpt_backward(m, 0);
}
