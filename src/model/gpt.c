/* The model's lifecycle: its shape and stage checked, the tensor table (tensor_plan.c),
 * units and activation arena (activations.c) built, freed; GPT-2's initialisation; the
 * lookups and counts that read a built model. The passes are in passes.c and the blocks
 * they run in their own files (gpt_internal.h lists them). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/rng.h"
#include "gpt_internal.h"

gpt_shape gpt_shape_of_config(const dt_config *c) {
    gpt_shape s = {c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.seq_len, c->model.vocab_size, .padded_vocab = 0};
    s.family = !strcmp(c->model.family, "llama") ? GPT_FAMILY_LLAMA : GPT_FAMILY_GPT2;
    if (s.family == GPT_FAMILY_LLAMA) {
        s.n_kv_head = c->model.n_kv_head;
        s.intermediate = c->model.intermediate_size;
        s.tie = c->model.tie_embeddings;
        s.qkv_bias = c->model.qkv_bias;
        s.rope_theta = (float)c->model.rope_theta;
        s.norm_eps = (float)c->model.norm_eps;
        s.rope_factor = (float)c->model.rope_factor;
        s.rope_low_freq = (float)c->model.rope_low_freq;
        s.rope_high_freq = (float)c->model.rope_high_freq;
        s.rope_original_max = c->model.rope_original_max;
    }
    return s;
}

dt_status gpt_shape_check(gpt_shape *s) {
    if (s->n_layer < 1 || s->n_head < 1 || s->n_embd < 1 || s->seq_len < 1 || s->vocab_size < 1)
        return dt_fail(DT_EINPUT, "model: n_layer, n_head, n_embd, seq_len and vocab_size must be positive");
    if (s->n_embd % s->n_head != 0)
        return dt_fail(DT_EINPUT, "model: n_embd (%d) must be divisible by n_head (%d)", s->n_embd, s->n_head);
    if (s->vocab_size > (1 << 24))
        return dt_fail(DT_EINPUT, "model: vocab_size %d exceeds 16777216", s->vocab_size);
    s->padded_vocab = (s->vocab_size + 63) / 64 * 64;
    if (s->family == GPT_FAMILY_GPT2) {
        s->n_kv_head = s->n_head, s->intermediate = 4 * s->n_embd, s->tie = 1, s->qkv_bias = 1;
        s->norm_eps = 1e-5f;
        return DT_OK;
    }
    if (s->family != GPT_FAMILY_LLAMA) return dt_fail(DT_EINPUT, "model: unknown family %d", s->family);
    if (s->n_kv_head == 0) s->n_kv_head = s->n_head;
    if (s->n_kv_head < 1 || s->n_head % s->n_kv_head != 0)
        return dt_fail(DT_EINPUT, "model: n_kv_head (%d) must divide n_head (%d)", s->n_kv_head, s->n_head);
    if ((s->n_embd / s->n_head) % 2 != 0)
        return dt_fail(DT_EINPUT, "model: rotary embeddings need an even head size (n_embd / n_head = %d)",
                       s->n_embd / s->n_head);
    if (s->intermediate == 0) s->intermediate = (8 * s->n_embd / 3 + 255) / 256 * 256;
    if (s->intermediate < 1) return dt_fail(DT_EINPUT, "model: intermediate_size must be positive");
    if (!(s->rope_theta > 0)) s->rope_theta = 10000.0f;
    if (!(s->norm_eps > 0)) s->norm_eps = 1e-5f;
    return DT_OK;
}

const gpt_layout gpt_one_rank = {.tp = 1};

gpt_stage_info gpt_stage_of(const gpt_shape *s, const gpt_layout *lay) {
    gpt_stage_info st = {.nchunks = 1, .slots = lay->slots > 0 ? lay->slots : 1};
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

static dt_status stage_check(const gpt_shape *s, const gpt_layout *lay, const gpt_stage_info *st) {
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

/* The stage the layout gives m (its blocks, chunks and ends). */
static dt_status set_stage(gpt_model *m, const gpt_layout *layout, gpt_stage_info *st) {
    *st = gpt_stage_of(&m->shape, layout);
    DT_TRY(stage_check(&m->shape, layout, st));
    m->first_layer = st->first[0];
    m->nblocks = st->n;
    m->unit_blocks = layout->unit_blocks > 1 ? layout->unit_blocks : 1;
    if (m->unit_blocks > 1 && (st->nchunks > 1 || layout->split_backward || st->n % m->unit_blocks != 0))
        return dt_fail(DT_EINPUT, "parallel.unit_blocks %d must divide the stage's %d blocks (one model chunk, no "
                       "split backward)", m->unit_blocks, st->n);
    m->block_units = layout->split_blocks ? 2 : 1;
    if (layout->split_blocks && (m->unit_blocks > 1 || st->nchunks > 1 || layout->split_backward || layout->recompute))
        return dt_fail(DT_EINPUT, "parallel.unit_split: a block splits into two units with unit_blocks 1, one model "
                       "chunk, no split backward and no recompute so far");
    m->nchunks = st->nchunks;
    for (int c = 0; c < st->nchunks; c++) {
        m->chunk_layer0[c] = st->first[c];
        m->chunk_block0[c + 1] = m->chunk_block0[c] + st->count[c];
    }
    m->has_embed = st->embed;
    m->has_head = st->head;
    m->first_trainable = -1; /* everything trains until gpt_freeze */
    return DT_OK;
}

/* The tensor table and the units over it. */
static dt_status build_units(gpt_model *m) {
    DT_TRY(gpt_build_table(m));
    m->nunits = m->nblocks / m->unit_blocks * m->block_units + 2;
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
    return DT_OK;
}

dt_status gpt_table_layout(gpt_model *m, const gpt_shape *shape, const gpt_layout *layout, const char *freeze) {
    memset(m, 0, sizeof *m);
    if (!layout) layout = &gpt_one_rank;
    m->shape = *shape;
    m->tp = layout->tp > 0 ? layout->tp : 1;
    m->tp_rank = layout->tp_rank;
    DT_TRY(gpt_shape_check(&m->shape));
    if (!gpt_tp_splits_heads(&m->shape, m->tp) || m->shape.padded_vocab % m->tp != 0)
        return dt_fail(DT_EINPUT, "parallel.tp %d does not split the model", m->tp);
    gpt_stage_info st;
    DT_TRY(set_stage(m, layout, &st));
    DT_TRY(build_units(m));
    if (freeze && *freeze) gpt_freeze(m, freeze, NULL);
    return DT_OK;
}

dt_status gpt_create(gpt_model *m, const gpt_shape *shape, const dt_ops *ops, int max_B, int max_T) {
    return gpt_create_ex(m, shape, ops, max_B, max_T, 1);
}

/* Rotary frequencies, Hugging Face's: inv_freq[d] = theta^(-2d/HS), with Llama 3's scaling
 * when rope_factor > 0 (long wavelengths divided by the factor, short ones kept, a smooth
 * blend between). */
void gpt_rope_frequencies(const gpt_shape *s, float *inv_freq) {
    int HS = s->n_embd / s->n_head;
    for (int d = 0; d < HS / 2; d++) {
        double f = (double)(float)(1.0 / pow((double)s->rope_theta, (double)(2 * d) / HS));
        if (s->rope_factor > 0) {
            double old = s->rope_original_max, lo = s->rope_low_freq, hi = s->rope_high_freq, k = s->rope_factor;
            double wavelen = 2 * M_PI / f;
            if (wavelen > old / lo) f /= k;
            else if (!(wavelen < old / hi)) {
                double smooth = (old / wavelen - lo) / (hi - lo);
                f = (1 - smooth) * f / k + smooth * f;
            }
        }
        inv_freq[d] = (float)f;
    }
}

/* The Llama family's tables: rotary frequencies, the host's position scratch, the ones
 * the bias GEMMs multiply. */
static dt_status llama_tables(gpt_model *m) {
    gpt_acts *a = m->acts;
    size_t BT = (size_t)m->max_B * m->max_T, half = (size_t)(m->shape.n_embd / m->shape.n_head) / 2;
    float *f = malloc(half * sizeof(float));
    a->pos_host = malloc(BT * sizeof(int));
    if (!f || !a->pos_host) {
        free(f);
        return dt_fail(DT_ERUNTIME, "out of memory (rotary tables)");
    }
    gpt_rope_frequencies(&m->shape, f);
    m->ops->upload(a->inv_freq, f, half * sizeof(float));
    free(f);
    if (!m->shape.qkv_bias && !m->canon) return DT_OK; /* (an empty part of the arena still has an address) */
    return gpt_fill_ones(m);
}

dt_status gpt_fill_ones(gpt_model *m) {
    gpt_acts *a = m->acts;
    size_t BT = (size_t)m->max_B * m->max_T;
    void *h = malloc(BT * m->esz);
    if (!h) return dt_fail(DT_ERUNTIME, "out of memory (bias ones)");
    for (size_t i = 0; i < BT; i++) {
        if (m->esz == 2) ((uint16_t *)h)[i] = 0x3f80; /* bf16 1.0 */
        else ((float *)h)[i] = 1.0f;
    }
    m->ops->upload(a->ones, h, BT * m->esz);
    free(h);
    return DT_OK;
}

dt_status gpt_create_ex(gpt_model *m, const gpt_shape *shape, const dt_ops *ops, int max_B, int max_T,
                        int alloc_state) {
    return gpt_create_layout(m, shape, ops, max_B, max_T, alloc_state, NULL);
}

dt_status gpt_create_layout(gpt_model *m, const gpt_shape *shape, const dt_ops *ops, int max_B, int max_T,
                            int alloc_state, const gpt_layout *layout) {
    memset(m, 0, sizeof *m);
    if (!layout) layout = &gpt_one_rank;
    int tp = layout->tp, tp_rank = layout->tp_rank;
    m->shape = *shape;
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->sp = layout->sp && tp > 1;
    m->canon = layout->canon > 1 ? layout->canon : 0;
    m->split = layout->split_backward != 0;
    m->recompute = layout->recompute != 0;
    m->documents = layout->documents != 0;
    if (m->recompute && m->split)
        return dt_fail(DT_EINPUT, "train.recompute full: not with a split backward (parallel.schedule zb-h1: its "
                       "weight pass would need every block's inner activations again)");
    DT_TRY(gpt_shape_check(&m->shape));
    /* sizes below are size_t products: refuse a shape where they could wrap */
    if ((double)max_B * max_T * m->shape.n_embd * m->shape.n_layer * 64.0 +
            (double)max_B * max_T * m->shape.padded_vocab * 16.0 > 4.6e18)
        return dt_fail(DT_EINPUT, "model: a micro-batch of %d x %d tokens at %d wide, %d layers needs more than 4 EB "
                       "of activations", max_B, max_T, m->shape.n_embd, m->shape.n_layer);
    if (m->shape.family == GPT_FAMILY_LLAMA) {
        if (!ops->rmsnorm_fwd || !ops->rmsnorm_bwd || !ops->swiglu_fwd || !ops->swiglu_bwd || !ops->rope_qkv_fwd ||
            !ops->rope_qkv_bwd)
            return dt_fail(DT_EINPUT, "model.family llama: the %s backend has no RMSNorm, SwiGLU or rotary kernels",
                           ops->name);
        if ((m->shape.n_kv_head % tp != 0 && tp % m->shape.n_kv_head != 0) || m->shape.intermediate % tp != 0)
            return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_kv_head %d or be a multiple of it, and "
                           "divide model.intermediate_size %d (key/value heads are split, or replicated over tp / "
                           "n_kv_head ranks; the MLP's columns are split)", tp, m->shape.n_kv_head,
                           m->shape.intermediate);
    }
    if (!gpt_tp_splits_heads(&m->shape, tp) || tp_rank < 0 || tp_rank >= tp)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_head %d (attention heads are split across "
                       "tensor-parallel ranks)", tp, m->shape.n_head);
    if (m->shape.padded_vocab % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide the padded vocabulary %d (a multiple of 64)", tp,
                       m->shape.padded_vocab);
    if (tp > 1 && (!ops->xent_rowmax || !ops->xent_rowsum || !ops->xent_finish))
        return dt_fail(DT_EINPUT, "parallel.tp %d: the %s backend has no vocabulary-parallel cross-entropy", tp,
                       ops->name);
    int kvw = m->shape.n_kv_head * (m->shape.n_embd / m->shape.n_head); /* Llama: the key/value width */
    if (m->canon && (m->canon % tp || m->shape.n_embd % m->canon || m->shape.padded_vocab % m->canon ||
                     m->canon > 64 ||
                     (m->shape.family == GPT_FAMILY_LLAMA &&
                      (kvw % m->canon || m->shape.intermediate % m->canon ||
                       !gpt_kv_tree_splits(&m->shape, tp)))))
        return dt_fail(DT_EINPUT, "model: canonical chunks %d (bitwise mode with tensor parallelism) must "
                       "divide the width %d and the padded vocabulary %d (Llama: the key/value width and the "
                       "MLP's too, and key/value heads replicated over tp %d need a power of two of query heads "
                       "per rank), tp dividing them", m->canon, m->shape.n_embd, m->shape.padded_vocab, tp);
    if (m->canon && m->shape.family == GPT_FAMILY_LLAMA && !ops->add_rows)
        return dt_fail(DT_EINPUT, "model: bitwise mode with tensor-parallel chunks: the %s backend has no add_rows "
                       "(the key/value group sums)", ops->name);
    if (layout->row_block > 0 && (!m->canon || max_T % layout->row_block))
        return dt_fail(DT_EINPUT, "model: parallel.cp_chunks (bitwise mode's sequence chunks) needs the canonical "
                       "tensor-parallel chunks (parallel.tp_chunks > 1) and chunks of whole rows");
    if (m->sp && ((long long)max_B * max_T) % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.sp: the micro-batch's %d x %d tokens do not split into parallel.tp %d "
                       "sequence pieces", max_B, max_T, tp);
    if (max_T > m->shape.seq_len)
        return dt_fail(DT_EINPUT, "sequence length %d exceeds the position table (model.seq_len %d)", max_T,
                       m->shape.seq_len);
    gpt_stage_info st;
    DT_TRY(set_stage(m, layout, &st));
    m->ops = ops;
    m->esz = dt_elem_bytes(ops);
    m->max_B = max_B;
    m->max_T = max_T;
    m->acts = calloc(1, sizeof(gpt_acts));
    if (m->acts) m->acts->slot = calloc((size_t)st.slots, sizeof(gpt_slot));
    if (!m->acts || !m->acts->slot) return dt_fail(DT_ERUNTIME, "out of memory (model tables)");
    m->acts->nslots = st.slots;
    for (int k = 0; m->documents && k < st.slots; k++)
        if (!(m->acts->slot[k].seg_host = malloc((size_t)max_B * max_T * sizeof(int))))
            return dt_fail(DT_ERUNTIME, "out of memory (document starts)");
    DT_TRY(build_units(m));
    if (alloc_state) {
        DT_TRY(ops->alloc((void **)&m->params, m->nparams * m->esz, "parameters"));
        DT_TRY(ops->alloc((void **)&m->grads, m->nparams * m->esz, "gradients"));
        for (int u = 0; u < m->nunits; u++) {
            m->unit_params[u] = S(m, m->params, m->units[u].offset);
            m->unit_grads[u] = S(m, m->grads, m->units[u].offset);
        }
    }

    gpt_acts *a = m->acts;
    m->act_bytes = gpt_act_layout(&m->shape, max_B, max_T, m->esz, layout, NULL, m->act_regions);
    DT_TRY(ops->alloc(&a->arena, m->act_bytes, "activations"));
    gpt_act_layout(&m->shape, max_B, max_T, m->esz, layout, a, NULL);
    if (m->shape.family == GPT_FAMILY_LLAMA) DT_TRY(llama_tables(m));
    else if (m->canon) DT_TRY(gpt_fill_ones(m));
    if (m->canon && !(a->xstat_host = malloc((size_t)2 * m->canon / tp * a->head_rows * sizeof(float))))
        return dt_fail(DT_ERUNTIME, "out of memory (canonical chunks' statistics)");
    return DT_OK;
}

void gpt_destroy(gpt_model *m) {
    if (m->ops) {
        if (m->acts) m->ops->free(m->acts->arena);
        m->ops->free(m->params);
        m->ops->free(m->grads);
    }
    for (int k = 0; m->acts && m->acts->slot && k < m->acts->nslots; k++) free(m->acts->slot[k].seg_host);
    if (m->acts) free(m->acts->slot), free(m->acts->pos_host), free(m->acts->xstat_host);
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
    if (strstr(name, "ln_") || strstr(name, "layernorm") || !strcmp(name, "model.norm.weight")) /* norms' weights */
        return (gpt_init_rule){1, 0.0f, 0};
    float std = strstr(name, "c_proj.weight") ? 0.02f / sqrtf(2.0f * (float)n_layer) : 0.02f;
    return (gpt_init_rule){2, std, dt_rng_key(seed, name)};
}

float gpt_init_at(const gpt_init_rule *r, uint64_t index) {
    if (r->kind == 0) return 0.0f;
    if (r->kind == 1) return 1.0f;
    return (float)(r->std * dt_rng_normal_at(r->key, index));
}

void gpt_init(gpt_model *m, uint64_t seed) {
    for (int u = 0; u < m->nunits; u++) gpt_init_unit(m, seed, u);
}

void gpt_init_unit(gpt_model *m, uint64_t seed, int u) {
    if (u == 0 && m->tied_gap) memset(m->unit_params[0] + m->tensors[0].numel, 0, m->tied_gap * sizeof(float));
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        if (t->unit != u) continue;
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

static int name_before(const gpt_model *m, int a, int b) { return strcmp(m->tensors[a].name, m->tensors[b].name) < 0; }

/* Moves order[i] down the max-heap order[0..n) until its children are not after it. */
static void sift_down(const gpt_model *m, int *order, int i, int n) {
    for (int c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && name_before(m, order[c], order[c + 1])) c++;
        if (!name_before(m, order[i], order[c])) return;
        int t = order[i];
        order[i] = order[c];
        order[c] = t;
    }
}

/* Heap sort by name: names are unique, so any sort gives the same order; this one needs
 * no comparator context (qsort's would be a process global) and no allocation. */
void gpt_sorted_order(const gpt_model *m, int *order) {
    int n = m->ntensors;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(m, order, i, n);
    for (int end = n - 1; end > 0; end--) {
        int t = order[0];
        order[0] = order[end];
        order[end] = t;
        sift_down(m, order, 0, end);
    }
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

double gpt_flops_per_token(const gpt_shape *s, int T) {
    /* 6 FLOPs per weight per token (matmuls, head included) + attention: forward 2·2·T/2·C
     * per layer for Q·Kᵀ and P·V with the causal half, x3 for backward. */
    double C = s->n_embd, L = s->n_layer, V = s->vocab_size;
    double weights = L * 12.0 * C * C + V * C;
    if (s->family == GPT_FAMILY_LLAMA) { /* q, o: C²; k, v: C·kv each; gate, up, down: 3·C·I; the head */
        double kv = (double)s->n_kv_head * (C / s->n_head), I = s->intermediate ? s->intermediate : 4 * C;
        weights = L * (2 * C * C + 2 * C * kv + 3 * C * I) + V * C;
    }
    return 6.0 * weights + 6.0 * L * C * T;
}

size_t gpt_num_params(const gpt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->ntensors; i++) /* whole tensors, whatever piece of them this rank holds */
        n += (size_t)(m->tensors[i].shard.real_rows * m->tensors[i].shard.cols);
    return n;
}

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

void gpt_shape_print(const gpt_shape *s, int T, FILE *out) {
    if (s->family == GPT_FAMILY_LLAMA)
        fprintf(out, "dtrain: Llama %d layers, %d heads (%d key/value), %d wide, MLP %d, seq %d, vocab %d (padded %d), "
                "head %s: %.2fM parameters\n", s->n_layer, s->n_head, s->n_kv_head, s->n_embd, s->intermediate, T,
                s->vocab_size, s->padded_vocab, s->tie ? "tied" : "untied", (double)gpt_shape_params(s) / 1e6);
    else
        fprintf(out, "dtrain: GPT-2 %d layers, %d heads, %d wide, seq %d, vocab %d (padded %d): %.2fM parameters\n",
                s->n_layer, s->n_head, s->n_embd, T, s->vocab_size, s->padded_vocab, (double)gpt_shape_params(s) / 1e6);
}
