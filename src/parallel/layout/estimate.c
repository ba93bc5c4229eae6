#include "estimate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../model/gpt.h"
#include "../data_parallel/canonical.h"
#include "../model_parallel/context_parallel.h"
#include "../data_parallel/data_parallel.h"
#include "../model_parallel/pipeline.h"
#include "layout.h"

dt_state_bytes dt_estimate_fp32(double psi, int n, int zero) {
    dt_state_bytes b = {4 * psi, 4 * psi, 8 * psi};
    if (zero >= 1) b.optim = 8 * psi / n; /* zero 1's gradients stay 4psi: reduce-scattered in place */
    if (zero >= 2) b.grads = 4 * psi / n;
    if (zero >= 3) b.params = 4 * psi / n;
    return b;
}

static double mixed(double psi, int n, int zero) {
    static const double full[4] = {16, 4, 2, 0}, shard[4] = {0, 12, 14, 16};
    return full[zero] * psi + shard[zero] * psi / n;
}

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

/* A stage's units (embedding, each block, ln_f; gpt_unit_counts_layout) and the padded
 * layout ZeRO and bitwise mode give them: each unit padded to a multiple of shards x the
 * alignment (the canonical chunk in bitwise mode), a slice of it per rank. */
typedef struct {
    double cnt[3], P[3], S[3];
    double flat, padded, shard; /* the stage's elements: as they are, padded, one rank's slices */
    int nb;                     /* blocks (every stage holds one: dt_pp_split) */
} unit_sizes;

static unit_sizes units_of(const dt_layout *L, const gpt_layout *lay, int shards) {
    unit_sizes u;
    size_t cnt[3];
    gpt_unit_counts_layout(&L->shape, lay, &cnt[0], &cnt[1], &cnt[2], &u.nb);
    double A = (double)shards * (dt_layout_bitwise(L) ? DT_CANON_CHUNK : DT_SHARD_ALIGN);
    for (int k = 0; k < 3; k++) {
        u.cnt[k] = (double)cnt[k];
        u.P[k] = ceil(u.cnt[k] / A) * A;
        u.S[k] = u.P[k] / shards;
    }
    u.flat = u.cnt[0] + u.nb * u.cnt[1] + u.cnt[2];
    u.padded = u.P[0] + u.nb * u.P[1] + u.P[2];
    u.shard = u.S[0] + u.nb * u.S[1] + u.S[2];
    return u;
}

/* ZeRO's bytes of one rank of the stage, as zero.c lays them out; workspace: ZeRO-2/3's
 * gradient scratch (embedding, ln_f, one block) and reduce-scatter buffer, ZeRO-3's
 * gathered parameters (embedding, ln_f and two blocks, or under a pipeline the whole
 * stage). bf16: parameters and gradients in bf16, fp32 master weights of the slices, and
 * on the CPU the fp32 host staging of the reductions (the largest unit and slice; on a
 * device that is host memory, left out as the memory report does), or with device
 * collectives fp32 device copies of the same sizes. */
static double zero_stage_bytes(const dt_layout *L, const gpt_layout *lay, int shards) {
    unit_sizes u = units_of(L, lay, shards);
    int z = L->zero, bf16 = dt_layout_bf16(L);
    double maxS = fmax(u.S[0], fmax(u.S[1], u.S[2])), maxP = fmax(u.P[0], fmax(u.P[1], u.P[2]));
    double f = sizeof(float), e = bf16 ? 2 : f;
    double b = ((z <= 2 ? u.padded : u.shard) + (z == 1 ? u.padded : u.shard)) * e + 2 * u.shard * f;
    if (bf16) b += u.shard * f;
    if (z >= 2) b += (maxS + u.P[0] + u.P[2] + u.P[1]) * e;
    if (z >= 3) b += (L->pp > 1 ? u.padded : u.P[0] + u.P[2] + 2 * u.P[1]) * e;
    if (bf16 && L->backend == DT_BACKEND_CPU) b += (maxP + maxS) * f;
    if (bf16 && dt_layout_nccl(L)) b += (maxP + maxS) * f; /* the fp32 device copies */
    /* fp32 on the device communicator: a second block scratch and reduce-scatter buffer,
     * so each unit's reduce-scatter overlaps the next unit's backward */
    if (!bf16 && z >= 2 && L->cfg.parallel.overlap && dt_layout_nccl(L)) b += (maxS + u.P[1]) * f;
    return b;
}

/* Bitwise mode's reduction workspace on one rank of the stage, as bitwise.c allocates it:
 * the fold's ceil(log2 m) + 2 buffers over the leaf layout (the flat units; ZeRO-1's
 * padded ones; ZeRO-2/3's shard), plus the head's share of wte where one rank holds both
 * ends; the exchange buffer (half the largest unit); with ZeRO-2/3 and both ends, the
 * head's wte gradient. */
static double bitwise_bytes(const dt_layout *L, const gpt_layout *lay, int shards, int leaves) {
    const gpt_shape *s = &L->shape;
    unit_sizes u = units_of(L, lay, shards);
    int z = dt_layout_ps(L) ? 0 : L->zero;
    const double *unit = z ? u.P : u.cnt;
    double maxunit = fmax(unit[0], fmax(unit[1], unit[2]));
    double n = z == 0 ? u.flat : z == 1 ? u.padded : u.shard;
    double wte = (double)s->padded_vocab * s->n_embd, head = 0;
    if (L->pp <= 1) { /* one rank holds both ends: the head's share of wte apart */
        n += z >= 2 ? u.S[0] : wte;
        maxunit = fmax(maxunit, wte);
        if (z >= 2) head = wte;
    }
    int h = 0;
    while ((1 << h) < leaves) h++;
    return ((h + 2) * n + floor(maxunit / 2) + 1 + head) * sizeof(float);
}

static double stage_bytes(const dt_layout *L, int stage) {
    double psi = stage_psi(L, stage);
    int shards = L->dp * L->cp; /* ZeRO shards over the data- and context-parallel ranks together */
    dt_state_bytes b = dt_estimate_fp32(psi, shards, L->zero);
    double state = dt_layout_ps(L) && shards > 1 ? 16 * psi : b.params + b.grads + b.optim;
    if (L->zero > 0 && !dt_layout_ps(L)) { /* ZeRO's engine runs on one shard too */
        gpt_layout lay = layout_of(L, stage);
        state = zero_stage_bytes(L, &lay, shards);
    } else if (dt_layout_bf16(L)) {
        state = mixed(psi, shards, 0);
    }
    /* workspace (DDP all-reduces the gradients in place: no bucket copy): the ring's blocks */
    double work = (double)dt_cp_ring_bytes(L->micro, L->T, L->cp, L->shape.n_embd, L->tp);
    /* DDP reduces bf16 gradients in fp32, in a copy (on a device backend in host memory,
     * which the estimate of device memory leaves out, as the memory report does) */
    if (dt_layout_bf16(L) && shards > 1 && L->zero == 0 && L->backend == DT_BACKEND_CPU) work += 4 * psi;
    /* with device collectives bf16 DDP widens one bucket at a time into an fp32 device copy */
    if (dt_layout_bf16(L) && shards > 1 && L->zero == 0 && dt_layout_nccl(L))
        work += 4 * fmin(floor(L->cfg.parallel.bucket_mb * 1024.0 * 1024.0 / 4) + 1, psi);
    if (dt_layout_bitwise(L)) {
        gpt_layout lay = layout_of(L, stage);
        work += bitwise_bytes(L, &lay, shards, L->m);
    }
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
    if (json) {
        fprintf(out, "{\"psi\": %.0f, \"n\": %d, \"tp\": %d, \"sp\": %s, \"activations\": %.0f, \"activation_regions\": "
                "{\"sequence\": %zu, \"tensor\": %zu, \"other\": %zu}, \"fp32\": [", psi, n, tp,
                c->parallel.sp ? "true" : "false", act, reg[GPT_ACT_SEQUENCE], reg[GPT_ACT_TENSOR], reg[GPT_ACT_OTHER]);
        for (int z = 0; z <= 3; z++) {
            dt_state_bytes b = dt_estimate_fp32(psi, shards, z);
            fprintf(out, "%s{\"zero\": %d, \"params\": %.0f, \"grads\": %.0f, \"optim\": %.0f, \"total\": %.0f}",
                    z ? ", " : "", z, b.params, b.grads, b.optim, b.params + b.grads + b.optim);
        }
        fprintf(out, "], \"mixed\": [%.0f, %.0f, %.0f, %.0f], \"stages\": [", mixed(psi, shards, 0),
                mixed(psi, shards, 1), mixed(psi, shards, 2), mixed(psi, shards, 3));
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
    static const char *mf[4] = {"16psi", "4psi+12psi/N", "2psi+14psi/N", "16psi/N"};
    static const char *ff[4] = {"16psi", "8psi+8psi/N", "4psi+12psi/N", "16psi/N"};
    for (int z = 0; z <= 3; z++) {
        dt_state_bytes b = dt_estimate_fp32(psi, shards, z);
        fprintf(out, "zero %-3d %-14s %9.1f MB   %-14s %9.1f MB %9.1f MB %9.1f MB %9.1f MB\n", z, mf[z],
                mixed(psi, shards, z) / 1e6, ff[z], b.params / 1e6, b.grads / 1e6, b.optim / 1e6,
                (b.params + b.grads + b.optim) / 1e6);
    }
    fprintf(out, "ps: rank 0 holds 16psi = %.1f MB, the other ranks 8psi = %.1f MB\n", 16 * psi / 1e6, 8 * psi / 1e6);
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
