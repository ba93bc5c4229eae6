#include "estimate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../model/gpt.h"
#include "../data_parallel/strategy.h"
#include "../model_parallel/context_parallel.h"
#include "../model_parallel/pipeline.h"
#include "layout.h"

/* A mode's textbook fp32 state (strategy.h's formula) for psi parameters over n ranks. */
typedef struct {
    double params, grads, optim; /* bytes per rank */
} state_bytes;

static state_bytes fp32_state(const dt_dp_formula *f, double psi, int n) {
    state_bytes b = {4 * psi, 4 * psi, 8 * psi};
    if (f->sharded[2]) b.optim = 8 * psi / n;
    if (f->sharded[1]) b.grads = 4 * psi / n;
    if (f->sharded[0]) b.params = 4 * psi / n;
    return b;
}

static double mixed_state(const dt_dp_formula *f, double psi, int n) { return f->mixed_whole * psi + f->mixed_shard * psi / n; }

/* The layout of pipeline stage `stage` (the whole model when pp = 1): its blocks, its
 * tensor-parallel pieces, the activation slots its schedule keeps. */
static gpt_layout layout_of(const dt_layout *L, int stage) {
    gpt_layout lay = {.tp = L->tp, .sp = L->sp, .recompute = dt_layout_recompute(L)};
    if (L->pp > 1 && dt_pp_layout(L->shape.n_layer, L->pp, L->v, stage, L->cfg.parallel.pp_split, &lay) == DT_OK) {
        lay.slots = dt_pp_slots(L->schedule, L->pp, L->v, stage, L->m);
        lay.split_backward = dt_schedule_splits_backward(L->schedule);
    }
    return lay;
}

/* A stage's blocks: "[a, b)" per chunk; total blocks returned. */
static int blocks_text(const dt_layout *L, const gpt_layout *lay, char *buf, size_t cap, int json) {
    int v = lay->chunks > 1 ? lay->chunks : 1, total = 0;
    size_t used = 0;
    buf[0] = 0;
    for (int k = 0; k < v; k++) {
        int first = v > 1 ? lay->chunk_first[k] : lay->first_layer;
        int n = v > 1 ? lay->chunk_layers[k] : lay->n_layers ? lay->n_layers : L->shape.n_layer - first;
        total += n;
        int w = json ? snprintf(buf + used, cap - used, "%s[%d, %d]", k ? ", " : "", first, n)
                     : snprintf(buf + used, cap - used, "%s[%d, %d)", k ? " " : "", first, first + n);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
    }
    return total;
}

/* Parameters one rank of the stage holds: its pieces (the formulas above then apply to
 * them, over the data-parallel ranks). */
static double stage_psi(const dt_layout *L, int stage) {
    gpt_layout lay = layout_of(L, stage);
    return (double)gpt_param_count_layout(&L->shape, &lay);
}

/* Activation bytes of one rank of the stage, and by region. */
static double act_bytes_regions(const dt_layout *L, int stage, size_t *regions) {
    gpt_layout lay = layout_of(L, stage); /* L->Tl: this rank's positions */
    return (double)gpt_activation_bytes_layout(&L->shape, L->micro, L->Tl, dt_layout_bf16(L) ? 2 : 4, &lay, regions);
}

/* One rank of the stage: its mode's state and workspace (strategy.h: the table answers,
 * a wrapper's workspace added to the mode's), its activations, context parallelism's
 * ring blocks. */
static double stage_bytes(const dt_layout *L, int stage) {
    const dt_dp_strategy *mode;
    dt_dp_strategy run;
    if (dt_dp_strategy_of_layout(L, &mode, &run) != DT_OK) { /* parallel.zero outside 0..3: the check says it */
        dt_error_clear();
        return 0;
    }
    gpt_layout lay = layout_of(L, stage);
    /* ZeRO shards over the data- and context-parallel ranks together */
    dt_dp_stage st = {L, &lay, stage_psi(L, stage), L->dp * L->cp, DT_SHARD_ALIGN, mode};
    double state = 0, work = (double)dt_cp_ring_bytes(L->micro, L->T, L->cp, L->shape.n_embd, L->tp);
    run.estimate(&st, &state, &work);
    return state + act_bytes_regions(L, stage, NULL) + work;
}

double dt_estimate_layout_bytes(const dt_layout *L) {
    if (!L->shape_ok) return 0;
    double worst = 0;
    for (int r = 0; r < L->pp; r++) { /* the fullest stage */
        double b = stage_bytes(L, r);
        if (b > worst) worst = b;
    }
    return worst;
}

double dt_estimate_rank_bytes(const dt_config *c, int dp) {
    dt_layout L;
    dt_layout_derive(&L, c, dp * (c->parallel.tp > 0 ? c->parallel.tp : 1) * (c->parallel.pp > 0 ? c->parallel.pp : 1) *
                                (c->parallel.cp > 0 ? c->parallel.cp : 1));
    return dt_estimate_layout_bytes(&L);
}

dt_status dt_estimate_check_node(const dt_layout *L, int ranks, double avail) {
    double need = dt_estimate_layout_bytes(L) * ranks;
    if (avail <= 0 || need <= avail) return DT_OK;
    return dt_fail(DT_EINPUT, "memory: the model needs an estimated %.1f GB on this node (%d rank%s x %.1f GB; "
                   "`dtrain estimate`), but only %.1f GB is available; use a smaller model or batch, more ranks with "
                   "ZeRO, or --set train.check_memory=false to try anyway",
                   need / 1e9, ranks, ranks > 1 ? "s" : "", need / 1e9 / ranks, avail / 1e9);
}

/* First number after key in a /proc-style file, times scale; -1 if absent. */
static double read_number(const char *path, const char *key, double scale) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, k)) {
            double x;
            if (sscanf(line + k, " %lf", &x) == 1) v = x * scale;
            break;
        }
    fclose(f);
    return v;
}

double dt_memory_available(void) {
    double avail = read_number("/proc/meminfo", "MemAvailable:", 1024.0);
    double max = read_number("/sys/fs/cgroup/memory.max", "", 1.0); /* "max" (no limit) does not parse */
    double cur = read_number("/sys/fs/cgroup/memory.current", "", 1.0);
    if (max > 0 && cur >= 0 && (avail < 0 || max - cur < avail)) avail = max - cur;
    return avail > 0 ? avail : 0;
}

dt_status dt_estimate_print(const dt_layout *L, int json, FILE *out) {
    DT_TRY(dt_layout_check(L, DT_CHECK_ESTIMATE));
    const dt_config *c = &L->cfg;
    const gpt_shape s = L->shape;
    int n = L->dp, tp = L->tp, pp = L->pp, T = L->Tl; /* T: this rank's positions */
    double psi = stage_psi(L, 0);
    int shards = n * L->cp; /* ZeRO shards over the data- and context-parallel ranks */
    size_t reg[GPT_ACT_NREGIONS];
    double act = act_bytes_regions(L, 0, reg);
    /* the table's rows: the modes with a textbook formula, one per ZeRO stage in order */
    const dt_dp_strategy *rows[8];
    int nrows = 0;
    for (int i = 0; dt_dp_modes[i] && nrows < 7; i++)
        if (dt_dp_modes[i]->formula.fp32_text) rows[nrows++] = dt_dp_modes[i];
    rows[nrows] = NULL;
    if (json) {
        fprintf(out, "{\"psi\": %.0f, \"n\": %d, \"tp\": %d, \"sp\": %s, \"activations\": %.0f, \"activation_regions\": "
                "{\"sequence\": %zu, \"tensor\": %zu, \"other\": %zu}, \"fp32\": [", psi, n, tp,
                c->parallel.sp ? "true" : "false", act, reg[GPT_ACT_SEQUENCE], reg[GPT_ACT_TENSOR], reg[GPT_ACT_OTHER]);
        for (int z = 0; rows[z]; z++) {
            state_bytes b = fp32_state(&rows[z]->formula, psi, shards);
            fprintf(out, "%s{\"zero\": %d, \"params\": %.0f, \"grads\": %.0f, \"optim\": %.0f, \"total\": %.0f}",
                    z ? ", " : "", z, b.params, b.grads, b.optim, b.params + b.grads + b.optim);
        }
        fprintf(out, "], \"mixed\": [");
        for (int z = 0; rows[z]; z++) fprintf(out, "%s%.0f", z ? ", " : "", mixed_state(&rows[z]->formula, psi, shards));
        fprintf(out, "], \"stages\": [");
        for (int r = 0; r < pp; r++) {
            gpt_layout lay = layout_of(L, r);
            char chunks[512];
            int blocks = blocks_text(L, &lay, chunks, sizeof chunks, 1);
            fprintf(out, "%s{\"stage\": %d, \"first_layer\": %d, \"blocks\": %d, \"chunks\": [%s], \"slots\": %d, "
                    "\"psi\": %.0f, \"activations\": %.0f, \"rank_bytes\": %.0f}", r ? ", " : "", r,
                    lay.chunks > 1 ? lay.chunk_first[0] : lay.first_layer, blocks, chunks, lay.slots ? lay.slots : 1,
                    stage_psi(L, r), act_bytes_regions(L, r, NULL), stage_bytes(L, r));
        }
        fprintf(out, "]}\n");
        return DT_OK;
    }
    fprintf(out, "model: %d layers, %d wide, vocab %d (padded %d): psi = %.0f parameters%s; N = %d data-parallel ranks%s\n",
            s.n_layer, s.n_embd, s.vocab_size, s.padded_vocab, psi, tp > 1 ? " per tensor-parallel rank" : "", shards,
            L->cp > 1 ? " (dp x cp: ZeRO shards over the context-parallel ranks too)" : "");
    if (tp > 1)
        fprintf(out, "tensor parallel %d: each rank holds 1/%d of wte, c_attn, c_fc and the c_proj weights (%.0f of "
                "%.0f parameters)\n", tp, tp, psi, (double)gpt_param_count(&s));
    fprintf(out, "%-8s %-14s %12s   %-14s %12s %12s %12s %12s\n", "stage", "bf16+fp32", "per rank", "fp32 (cpu)",
            "params", "grads", "optimizer", "per rank");
    for (int z = 0; rows[z]; z++) {
        const dt_dp_formula *f = &rows[z]->formula;
        state_bytes b = fp32_state(f, psi, shards);
        fprintf(out, "zero %-3d %-14s %9.1f MB   %-14s %9.1f MB %9.1f MB %9.1f MB %9.1f MB\n", z, f->mixed_text,
                mixed_state(f, psi, shards) / 1e6, f->fp32_text, b.params / 1e6, b.grads / 1e6, b.optim / 1e6,
                (b.params + b.grads + b.optim) / 1e6);
    }
    for (int i = 0; dt_dp_modes[i]; i++) { /* a central rank's modes */
        const dt_dp_formula *f = &dt_dp_modes[i]->formula;
        if (f->root > 0)
            fprintf(out, "%s: rank 0 holds %.0fpsi = %.1f MB, the other ranks %.0fpsi = %.1f MB\n", dt_dp_modes[i]->name,
                    f->root, f->root * psi / 1e6, f->others, f->others * psi / 1e6);
    }
    if (pp > 1) {
        fprintf(out, "pipeline %d stages (%s, %d micro-batches; psi and activations above: stage 0):\n", pp,
                c->parallel.schedule, L->m);
        for (int r = 0; r < pp; r++) {
            gpt_layout lay = layout_of(L, r);
            char blocks[512];
            blocks_text(L, &lay, blocks, sizeof blocks, 0);
            fprintf(out, "  stage %d: blocks %s, psi = %.0f, %d activation slot%s = %.1f MB, per rank %.1f MB "
                    "(ZeRO %d)\n", r, blocks, stage_psi(L, r),
                    lay.slots, lay.slots == 1 ? "" : "s", act_bytes_regions(L, r, NULL) / 1e6,
                    stage_bytes(L, r) / 1e6, L->zero);
        }
    }
    fprintf(out, "activations (micro-batch %d x %d tokens, %s%s%s): %.1f MB per rank, in every mode\n",
            c->train.micro_batch, T, c->precision, c->parallel.sp ? ", sequence parallel" : "",
            !dt_layout_recompute(L) ? "" : ", recompute full: block inputs kept", act / 1e6);
    fprintf(out, "  LayerNorm and residual rows %.1f MB, attention and MLP inner %.1f MB, head and scratch %.1f MB\n",
            reg[GPT_ACT_SEQUENCE] / 1e6, reg[GPT_ACT_TENSOR] / 1e6, reg[GPT_ACT_OTHER] / 1e6);
    if (tp > 1) { /* what the other choice of parallel.sp would give */
        dt_layout other = *L;
        other.sp = other.cfg.parallel.sp = !L->sp;
        fprintf(out, "  with parallel.sp=%s: %.1f MB (sequence parallelism splits the LayerNorm and residual rows)\n",
                other.sp ? "true" : "false", act_bytes_regions(&other, 0, NULL) / 1e6);
    }
    return DT_OK;
}
