/* The model's tensor plan (src/model/tensor_plan.c) as a rank sees it: for tensor-parallel
 * pieces and pipeline stages, every tensor's name (Hugging Face order), shape, shard spec
 * (Megatron's cut: c_attn and c_fc by columns, c_attn's q, k, v each; c_proj by rows, its
 * bias replicated; wte by vocabulary rows, the padding rows not real; LayerNorms and wpe
 * replicated), weight decay, block and unit; offsets packed in that order with a last
 * stage's gap where wpe would be; and the counts the estimator reads
 * (gpt_param_count_layout, gpt_unit_counts_layout, gpt_num_params, gpt_shape_params)
 * equal to what the built model holds; gpt_sorted_order lists every tensor once, by name. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "model/gpt.h"

/* C = 8, 2 heads, vocabulary 70 (padded 128), 8 positions, 3 blocks */
static gpt_shape SHAPE = {3, 2, 8, 8, 70, .padded_vocab = 0}; /* padded_vocab filled by main */
enum { C = 8, V = 70, VP = 128, NPOS = 8 };

typedef struct {
    const char *suffix; /* after "h.<l>." */
    int rows, cols;     /* global; cols 0: a vector of rows elements */
    int dim, parts;     /* the split: -1 replicated, 0 rows, 1 columns */
} want_block;
static const want_block BLOCK[] = {
    {"ln_1.weight", C, 0, -1, 1},       {"ln_1.bias", C, 0, -1, 1},         {"attn.c_attn.weight", C, 3 * C, 1, 3},
    {"attn.c_attn.bias", 3 * C, 0, 1, 3}, {"attn.c_proj.weight", C, C, 0, 1}, {"attn.c_proj.bias", C, 0, -1, 1},
    {"ln_2.weight", C, 0, -1, 1},       {"ln_2.bias", C, 0, -1, 1},         {"mlp.c_fc.weight", C, 4 * C, 1, 1},
    {"mlp.c_fc.bias", 4 * C, 0, 1, 1},  {"mlp.c_proj.weight", 4 * C, C, 0, 1}, {"mlp.c_proj.bias", C, 0, -1, 1},
};
enum { NB = sizeof BLOCK / sizeof BLOCK[0] };

/* Checks tensor t against a global [rows, cols] (cols 0: vector) split along dim in parts
 * over tp, this rank holding piece r; real: the global rows that are the model's. */
static void check_tensor(const char *what, const gpt_tensor *t, const char *name, int rows, int cols, int real,
                         int dim, int parts, int tp, int r, int layer, int unit) {
    int vector = cols == 0;
    int64_t gr = vector ? 1 : rows, gc = vector ? rows : cols;
    int split = tp > 1 && dim >= 0;
    CHECK(!strcmp(t->name, name), "%s: tensor %s, want %s", what, t->name, name);
    CHECK(t->ndim == (vector ? 1 : 2) && t->decay == !vector && t->layer == layer && t->unit == unit,
          "%s %s: ndim %d decay %d layer %d unit %d", what, name, t->ndim, t->decay, t->layer, t->unit);
    CHECK(t->shard.rows == gr && t->shard.cols == gc && t->shard.real_rows == (vector ? 1 : real) &&
              t->shard.dim == (split ? dim : -1) && t->shard.pieces == (split ? tp : 1) &&
              t->shard.index == (split ? r : 0) && t->shard.parts == (split ? parts : 1),
          "%s %s: shard [%lld, %lld] real %lld dim %d pieces %d index %d parts %d", what, name,
          (long long)t->shard.rows, (long long)t->shard.cols, (long long)t->shard.real_rows, t->shard.dim,
          t->shard.pieces, t->shard.index, t->shard.parts);
    int64_t lr = split && dim == 0 ? gr / tp : gr, lc = split && dim == 1 ? gc / tp : gc;
    CHECK(t->numel == (size_t)(lr * lc), "%s %s: numel %zu, want %lld", what, name, t->numel, (long long)(lr * lc));
    if (vector) {
        CHECK(t->shape[0] == lc && t->shape[1] == 1 && t->saved_rows == lc, "%s %s: shape [%d, %d] saved %d", what,
              name, t->shape[0], t->shape[1], t->saved_rows);
    } else {
        int64_t first = split && dim == 0 ? r * lr : 0, saved = real - first < 0 ? 0 : real - first;
        if (saved > lr) saved = lr;
        CHECK(t->shape[0] == lr && t->shape[1] == lc && t->saved_rows == saved, "%s %s: shape [%d, %d] saved %d",
              what, name, t->shape[0], t->shape[1], t->saved_rows);
    }
}

/* A rank of tp pieces holding blocks [first, first + n) (n 0: to the end). */
/* split: each block two units (gpt_layout.split_blocks), its attention half (ln_1 ..
 * attn.c_proj.bias) and its MLP half (ln_2 ..) */
static void check_layout(int tp, int r, int first, int n, int split) {
    char what[80];
    snprintf(what, sizeof what, "tp %d rank %d, blocks from %d (%d)%s", tp, r, first, n, split ? ", split" : "");
    gpt_layout lay = {.tp = tp, .tp_rank = r, .first_layer = first, .n_layers = n, .split_blocks = split};
    int per = 1 + split, lnf = 0; /* units per block; ln_f's unit */
    gpt_model m;
    CHECK(gpt_create_layout(&m, &SHAPE, dt_ops_cpu(), 1, 4, 1, &lay) == DT_OK, "%s: create", what);
    if (!m.tensors) return;
    int nb = n > 0 ? n : SHAPE.n_layer - first, embed = first == 0, head = first + nb == SHAPE.n_layer;
    int want_n = (embed || head) + embed + NB * nb + 2 * head;
    lnf = nb * per + 1;
    CHECK(m.ntensors == want_n && m.nblocks == nb && m.nunits == nb * per + 2, "%s: %d tensors, %d blocks, %d units",
          what, m.ntensors, m.nblocks, m.nunits);
    if (m.ntensors != want_n) {
        gpt_destroy(&m);
        return;
    }
    int i = 0;
    size_t off = 0;
    if (embed || head) check_tensor(what, &m.tensors[i++], "wte.weight", VP, C, V, 0, 1, tp, r, -1, 0);
    if (embed) check_tensor(what, &m.tensors[i++], "wpe.weight", NPOS, C, NPOS, -1, 1, tp, r, -1, 0);
    CHECK(m.tied_gap == (size_t)(!embed && head ? NPOS * C : 0), "%s: tied gap %zu", what, m.tied_gap);
    for (int k = 0; k < i; k++) {
        CHECK(m.tensors[k].offset == off, "%s: %s at %zu, want %zu", what, m.tensors[k].name, m.tensors[k].offset, off);
        off += m.tensors[k].numel;
    }
    off += m.tied_gap;
    CHECK(m.units[0].offset == 0 && m.units[0].count == off, "%s: unit 0 [%zu, +%zu), want [0, +%zu)", what,
          m.units[0].offset, m.units[0].count, off);
    CHECK(m.block0 == i, "%s: block0 %d, want %d", what, m.block0, i);
    size_t half[2] = {0, 0}; /* a block's units (the last block's) */
    for (int j = 0; j < nb; j++) {
        size_t unit_start[2] = {off, off};
        for (int k = 0; k < NB; k++, i++) {
            char name[64];
            int h = split && k >= 6; /* from ln_2 on: the MLP half */
            if (h && k == 6) unit_start[1] = off;
            snprintf(name, sizeof name, "h.%d.%s", first + j, BLOCK[k].suffix);
            check_tensor(what, &m.tensors[i], name, BLOCK[k].rows, BLOCK[k].cols, BLOCK[k].rows, BLOCK[k].dim,
                         BLOCK[k].parts, tp, r, first + j, 1 + j * per + h);
            CHECK(m.tensors[i].offset == off, "%s: %s at %zu, want %zu", what, name, m.tensors[i].offset, off);
            off += m.tensors[i].numel;
        }
        half[0] = (split ? unit_start[1] : off) - unit_start[0];
        half[1] = split ? off - unit_start[1] : 0;
        for (int h = 0; h < per; h++) {
            int u = 1 + j * per + h;
            CHECK(m.units[u].offset == unit_start[h] && m.units[u].count == half[h], "%s: block %d's unit %d [%zu, +%zu)",
                  what, j, u, m.units[u].offset, m.units[u].count);
        }
    }
    if (head) {
        check_tensor(what, &m.tensors[i], "ln_f.weight", C, 0, C, -1, 1, tp, r, -1, lnf);
        check_tensor(what, &m.tensors[i + 1], "ln_f.bias", C, 0, C, -1, 1, tp, r, -1, lnf);
        for (int k = i; k < i + 2; k++) {
            CHECK(m.tensors[k].offset == off, "%s: %s at %zu", what, m.tensors[k].name, m.tensors[k].offset);
            off += m.tensors[k].numel;
        }
    }
    CHECK(m.nparams == off, "%s: %zu parameters, want %zu", what, m.nparams, off);
    /* what the estimator counts without building the model */
    size_t u0, blk[2], last;
    int nblocks;
    gpt_unit_counts_layout(&SHAPE, &lay, &u0, blk, &last, &nblocks);
    CHECK(gpt_param_count_layout(&SHAPE, &lay) == m.nparams, "%s: gpt_param_count_layout %zu, model %zu", what,
          gpt_param_count_layout(&SHAPE, &lay), m.nparams);
    CHECK(u0 == m.units[0].count && nblocks == nb && (nb == 0 || (blk[0] == half[0] && blk[1] == half[1])) &&
              last == m.units[lnf].count,
          "%s: unit counts %zu %zu+%zu %zu (%d blocks)", what, u0, blk[0], blk[1], last, nblocks);
    if (tp == 1 && embed && head) {
        CHECK(gpt_param_count(&SHAPE) == m.nparams, "gpt_param_count %zu, model %zu", gpt_param_count(&SHAPE),
              m.nparams);
        size_t want = (size_t)V * C + NPOS * C + (size_t)SHAPE.n_layer * (12 * C * C + 13 * C) + 2 * C;
        CHECK(gpt_num_params(&m) == want && gpt_shape_params(&SHAPE) == want, "params %zu / %zu, want %zu",
              gpt_num_params(&m), gpt_shape_params(&SHAPE), want);
    }
    /* the digest and safetensors order: every tensor once, by name */
    int order[64], seen[64] = {0};
    gpt_sorted_order(&m, order);
    for (int k = 0; k < m.ntensors; k++) {
        CHECK(order[k] >= 0 && order[k] < m.ntensors && !seen[order[k]]++, "%s: order[%d] = %d", what, k, order[k]);
        CHECK(k == 0 || strcmp(m.tensors[order[k - 1]].name, m.tensors[order[k]].name) < 0, "%s: %s before %s", what,
              k ? m.tensors[order[k - 1]].name : "", m.tensors[order[k]].name);
    }
    gpt_destroy(&m);
}

/* Llama's key/value heads under a tp above n_kv_head (C 16, 4 heads of 4, kv heads of
 * 4 wide): rank t holds head t / r of the r = tp / n_kv replicas, k and v rows and biases
 * alike; one head (multi-query) is whole on every rank; the counts the estimator reads
 * are what the model holds. */
static void check_llama_kv(int n_kv, int tp) {
    gpt_shape s = {2, 4, 16, 8, 70, .family = GPT_FAMILY_LLAMA, .n_kv_head = n_kv, .intermediate = 32,
                   .qkv_bias = 1};
    CHECK(gpt_shape_check(&s) == DT_OK && gpt_tp_splits_heads(&s, tp), "llama shape, tp %d over %d kv heads", tp, n_kv);
    int r = tp > n_kv ? tp / n_kv : 1, pieces = tp > n_kv ? n_kv : tp, rows = 4 * (n_kv / pieces);
    for (int t = 0; t < tp; t++) {
        gpt_layout lay = {.tp = tp, .tp_rank = t};
        gpt_model m;
        if (gpt_create_layout(&m, &s, dt_ops_cpu(), 1, 4, 1, &lay) != DT_OK) {
            CHECK(0, "llama tp %d rank %d over %d kv heads: %s", tp, t, n_kv, dt_error_message());
            continue;
        }
        static const char *const kv[] = {"k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias"};
        for (int k = 0; k < 4; k++) {
            char name[64];
            snprintf(name, sizeof name, "model.layers.1.self_attn.%s", kv[k]);
            const gpt_tensor *x = gpt_find(&m, name);
            int vec = k >= 2, split = pieces > 1;
            CHECK(x && x->shard.dim == (split ? (vec ? 1 : 0) : -1) && x->shard.pieces == pieces &&
                      x->shard.index == (split ? t / r : 0) && x->shard.replicas == (split ? r : 1) &&
                      x->shard.replica == (split ? t % r : 0) && x->numel == (size_t)(vec ? rows : rows * 16) &&
                      x->shape[0] == rows && x->saved_rows == rows,
                  "tp %d rank %d, %d kv heads: %s dim %d pieces %d index %d replicas %d replica %d numel %zu saved %d",
                  tp, t, n_kv, name, x ? x->shard.dim : 9, x ? x->shard.pieces : 0, x ? x->shard.index : -1,
                  x ? x->shard.replicas : 0, x ? x->shard.replica : -1, x ? x->numel : 0, x ? x->saved_rows : -1);
        }
        CHECK(gpt_param_count_layout(&s, &lay) == m.nparams, "llama tp %d over %d kv heads: counted %zu, holds %zu",
              tp, n_kv, gpt_param_count_layout(&s, &lay), m.nparams);
        gpt_destroy(&m);
    }
}

int main(void) {
    CHECK(gpt_shape_check(&SHAPE) == DT_OK && SHAPE.padded_vocab == VP, "shape: padded vocabulary %d",
          SHAPE.padded_vocab);
    for (int tp = 1; tp <= 2; tp++)
        for (int r = 0; r < tp; r++) {
            check_layout(tp, r, 0, 0, 0); /* the whole model */
            check_layout(tp, r, 0, 1, 0); /* a first stage */
            check_layout(tp, r, 1, 1, 0); /* a middle stage */
            check_layout(tp, r, 2, 1, 0); /* a last stage: the tied wte and wpe's gap */
            check_layout(tp, r, 0, 0, 1); /* each block as two units (parallel.unit_split) */
        }
    check_llama_kv(2, 4);
    check_llama_kv(1, 2);
    check_llama_kv(1, 4);
    check_llama_kv(4, 2); /* split, not replicated */
    /* every name of the whole model is a freeze pattern's candidate; an unknown one is refused */
    CHECK(gpt_freeze_check(&SHAPE, "h.2.mlp.c_proj.bias,ln_f.*,wpe.weight") == DT_OK, "known names refused");
    dt_error_clear();
    CHECK(gpt_freeze_check(&SHAPE, "h.3.*") == DT_EINPUT, "a block beyond the model accepted");
    return check_finish();
}
