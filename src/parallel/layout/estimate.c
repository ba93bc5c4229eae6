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
    gpt_layout lay = {.tp = L->tp, .sp = L->sp, .recompute = dt_layout_recompute(L),
                      .documents = dt_layout_documents(L), .unit_blocks = L->cfg.parallel.unit_blocks,
                      .canon = dt_layout_canon(L), .row_block = dt_layout_row_block(L),
                      .split_blocks = dt_layout_split_blocks(L)};
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

/* What offload puts in host memory and in files, per rank, and the file I/O per step. */
typedef struct {
    double host, nvme, io;
    dt_dp_offload what; /* the mode's answer: what left the device */
} offload_bytes;

/* One store of n elements x fields of elem bytes (store.h's layout): cpu, the state in host
 * memory; nvme, a file of whole blocks (each field's block_mb, rounded up to 4 KiB, the
 * usual O_DIRECT alignment) and buffer_count blocks of every field in host memory; passes
 * reads and writes of the whole file per step. */
static void add_store(offload_bytes *o, const dt_layout *L, dt_offload_kind kind, double n, int fields, double elem,
                      double reads, double writes) {
    if (kind == DT_OFFLOAD_NONE || n <= 0) return;
    if (kind == DT_OFFLOAD_CPU) {
        o->host += n * fields * elem;
        return;
    }
    /* as the store lays it out: blocks of block_mb, or of the state's own size when smaller
     * (dt_store_block_for), at most one buffer per block */
    double block = ceil(L->cfg.offload.block_mb * 1048576.0 / 4096) * 4096, whole = ceil(n * elem / 4096) * 4096;
    if (whole < block) block = whole;
    double blocks = ceil(n * elem / block), file = blocks * block * fields;
    o->host += fmin((double)L->cfg.offload.buffer_count, blocks) * fields * block;
    o->nvme += file;
    o->io += (reads + writes) * file;
}

/* One rank of the stage: its mode's state and workspace in device memory (strategy.h: the
 * table answers, a wrapper's workspace added to the mode's), its activations, context
 * parallelism's ring blocks; with off, what offload keeps elsewhere (the optimizer state
 * read and written once per step, the parameter shard read per use, written once). */
static double stage_device(const dt_layout *L, int stage, offload_bytes *off) {
    if (off) *off = (offload_bytes){0};
    const dt_dp_strategy *mode;
    dt_dp_strategy run;
    if (dt_dp_strategy_of_layout(L, &mode, &run) != DT_OK) { /* parallel.zero outside 0..3: the check says it */
        dt_error_clear();
        return 0;
    }
    gpt_layout lay = layout_of(L, stage);
    dt_dp_offload o = {0};
    /* ZeRO shards over the data- and context-parallel ranks together */
    dt_dp_stage st = {L, &lay, stage_psi(L, stage), dt_layout_shards(L), DT_SHARD_ALIGN, mode, &o};
    double state = 0, work = (double)dt_cp_bytes(L);
    run.estimate(&st, &state, &work);
    if (off) {
        off->what = o;
        add_store(off, L, L->offload_optimizer, o.optim_n, o.optim_fields, sizeof(float), 1, 1);
        add_store(off, L, L->offload_param, o.param_n, 1, o.param_elem, o.param_reads, 1);
        /* the parameter store's read-ahead buffer: whole 4 KiB pieces and one more (store.c) */
        if (L->offload_param == DT_OFFLOAD_NVME && o.param_fetch > 0)
            off->host += ceil(fmin(o.param_fetch, o.param_n) * o.param_elem / 4096) * 4096 + 4096;
        /* a device's or bf16's gradients and parameters cross to the host's update through
         * two fp32 buffers of a chunk (a block, or 2^18 elements in host memory) */
        double owned = o.optim_n + o.optim_frozen;
        if (owned > 0 && (dt_layout_bf16(L) || L->backend != DT_BACKEND_CPU)) {
            double chunk = L->offload_optimizer == DT_OFFLOAD_NVME
                               ? fmin(ceil(L->cfg.offload.block_mb * 1048576.0 / 4096) * 4096,
                                      ceil(owned * 4 / 4096) * 4096) / 4
                               : 262144;
            off->host += 2 * sizeof(float) * fmin(chunk, owned);
            /* and, handed over during backward, a host copy of the gradients (storage precision) */
            if (o.grads_early) off->host += (dt_layout_bf16(L) ? 2 : 4) * owned;
        }
        /* the frozen elements' fp32 master weights, apart from the store */
        if (o.optim_frozen > 0 && dt_layout_offload_master(L)) off->host += sizeof(float) * o.optim_frozen;
        /* the delayed update's fp32 copies of the gradients and the weights it produces */
        if (o.optim_n > 0 && L->cfg.offload.delayed_update) off->host += 2 * sizeof(float) * o.optim_n;
    }
    return state + act_bytes_regions(L, stage, NULL) + work;
}

static double stage_bytes(const dt_layout *L, int stage) { return stage_device(L, stage, NULL); }

/* The same layout with its state on the device (what offload saves). */
static dt_layout without_offload(const dt_layout *L) {
    dt_layout w = *L;
    w.offload_optimizer = w.offload_param = DT_OFFLOAD_NONE;
    return w;
}

double dt_estimate_layout_bytes(const dt_layout *L) {
    if (!dt_layout_shape_ok(L)) return 0;
    double worst = 0;
    for (int r = 0; r < L->pp; r++) { /* the fullest stage */
        offload_bytes o;
        double b = stage_device(L, r, &o);
        if (L->backend == DT_BACKEND_CPU) b += o.host; /* the CPU's device memory is the host's */
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
                   "ZeRO, offload.optimizer=nvme (`dtrain plan`), or --set train.check_memory=false to try anyway",
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

/* The offload lines of `dtrain estimate` (only with offload.*: the output without it is
 * unchanged): stage 0's device bytes against the same layout without offload, host, NVMe
 * and I/O per step, then what each store holds. */
static void print_offload(const dt_layout *L, int json, FILE *out) {
    const dt_config *c = &L->cfg;
    offload_bytes o;
    dt_layout w = without_offload(L);
    double dev = stage_device(L, 0, &o), before = stage_bytes(&w, 0);
    const dt_dp_offload *q = &o.what;
    if (json) {
        fprintf(out, "\"offload\": {\"optimizer\": \"%s\", \"param\": \"%s\", \"device\": %.0f, \"without_offload\": "
                "%.0f, \"host\": %.0f, \"nvme\": %.0f, \"io_per_step\": %.0f, \"optimizer_elements\": %.0f, "
                "\"param_elements\": %.0f, \"param_reads\": %.0f}, ", c->offload.optimizer, c->offload.param, dev, before,
                o.host, o.nvme, o.io, q->optim_n, q->param_n, q->param_reads);
        return;
    }
    fprintf(out, "offload (optimizer %s, param %s; docs/offload.md), per rank%s: device %.1f MB (%.1f MB without "
            "offload), host %.1f MB, NVMe %.1f MB, I/O %.1f MB per step\n", c->offload.optimizer, c->offload.param,
            L->pp > 1 ? " of stage 0" : "", dev / 1e6, before / 1e6, o.host / 1e6, o.nvme / 1e6, o.io / 1e6);
    if (q->optim_n > 0) {
        fprintf(out, "  optimizer state: %sAdamW moments of %.0f parameters, %.1f MB", q->optim_fields == 3 ?
                "fp32 master weights and " : "", q->optim_n, 4.0 * q->optim_fields * q->optim_n / 1e6);
        if (L->offload_optimizer == DT_OFFLOAD_CPU) fprintf(out, ", in host memory\n");
        else fprintf(out, ", in a file of whole blocks (%d fields x offload.block_mb), streamed through "
                     "offload.buffer_count blocks in host memory: read and written once per step\n", q->optim_fields);
    }
    if (q->param_n > 0)
        fprintf(out, "  parameter shard: %.0f parameters, %.1f MB, %s %.0f time%s per step (%s), written once\n",
                q->param_n, q->param_n * q->param_elem / 1e6, L->offload_param == DT_OFFLOAD_CPU ? "in host memory, fetched"
                : "in a file of whole blocks, read", q->param_reads, q->param_reads == 1 ? "" : "s",
                L->pp > 1 ? "the pipeline gathers a stage once" : "forward and backward of each micro-batch");
    if (L->offload_param != DT_OFFLOAD_NONE && q->param_n <= 0)
        fprintf(out, "  offload.param %s: this mode keeps no parameter shard (ZeRO-3 does; dtrain train refuses it)\n",
                c->offload.param);
    if ((L->offload_optimizer == DT_OFFLOAD_NVME || L->offload_param == DT_OFFLOAD_NVME))
        fprintf(out, "  NVMe blocks of %g MiB, %d in flight per field (offload.block_mb, offload.buffer_count)\n",
                c->offload.block_mb,
                c->offload.buffer_count);
    if (L->backend == DT_BACKEND_CPU)
        fprintf(out, "  backend cpu: its device memory is host memory, so a rank needs device + host = %.1f MB\n",
                (dev + o.host) / 1e6);
}

dt_status dt_estimate_print(const dt_layout *L, int json, FILE *out) {
    DT_TRY(dt_layout_check(L, DT_CHECK_ESTIMATE));
    const dt_config *c = &L->cfg;
    const gpt_shape s = L->shape;
    int n = L->dp, tp = L->tp, pp = L->pp, T = L->Tl; /* T: this rank's positions */
    double psi = stage_psi(L, 0);
    int shards = dt_layout_shards(L); /* ZeRO shards over a shard group's data- and context-parallel ranks */
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
        fprintf(out, "], ");
        if (dt_layout_offload(L)) print_offload(L, 1, out);
        fprintf(out, "\"stages\": [");
        for (int r = 0; r < pp; r++) {
            gpt_layout lay = layout_of(L, r);
            char chunks[512];
            int blocks = blocks_text(L, &lay, chunks, sizeof chunks, 1);
            offload_bytes o;
            fprintf(out, "%s{\"stage\": %d, \"first_layer\": %d, \"blocks\": %d, \"chunks\": [%s], \"slots\": %d, "
                    "\"psi\": %.0f, \"activations\": %.0f, \"rank_bytes\": %.0f", r ? ", " : "", r,
                    lay.chunks > 1 ? lay.chunk_first[0] : lay.first_layer, blocks, chunks, lay.slots ? lay.slots : 1,
                    stage_psi(L, r), act_bytes_regions(L, r, NULL), stage_device(L, r, &o));
            if (dt_layout_offload(L))
                fprintf(out, ", \"host_bytes\": %.0f, \"nvme_bytes\": %.0f, \"io_per_step\": %.0f", o.host, o.nvme, o.io);
            fprintf(out, "}");
        }
        fprintf(out, "]}\n");
        return DT_OK;
    }
    fprintf(out, "model: %d layers, %d wide, vocab %d (padded %d): psi = %.0f parameters%s; N = %d data-parallel ranks%s\n",
            s.n_layer, s.n_embd, s.vocab_size, s.padded_vocab, psi, tp > 1 ? " per tensor-parallel rank" : "", shards,
            L->cp > 1 ? " (dp x cp: ZeRO shards over the context-parallel ranks too)" : "");
    if (dt_layout_hsdp(L))
        fprintf(out, "hsdp: ZeRO within groups of %d data-parallel ranks (parallel.dp_shard), %d replicas of them, "
                "gradients all-reduced across\n", L->dp_shard, L->dp_replicas);
    int ub = L->cfg.parallel.unit_blocks, split = dt_layout_split_blocks(L);
    if (L->cfg.parallel.policy[0] || ub > 1 || split) {
        char what[96];
        if (split) snprintf(what, sizeof what, "two per block, its attention and MLP halves (parallel.unit_split)");
        else snprintf(what, sizeof what, "%d block%s per unit (parallel.unit_blocks)", ub, ub > 1 ? "s" : "");
        fprintf(out, "units: %s%s%s%s; the ZeRO rows' bytes count them\n", what,
                L->cfg.parallel.policy[0] ? ", policy " : "", L->cfg.parallel.policy,
                L->replicated ? " (its ddp units replicated, the others ZeRO)" : "");
    }
    if (tp > 1)
        fprintf(out, "tensor parallel %d: each rank holds 1/%d of wte, c_attn, c_fc and the c_proj weights (%.0f of "
                "%.0f parameters)\n", tp, tp, psi, (double)gpt_param_count(&s));
    if (gpt_kv_replicas(&s, tp) > 1)
        fprintf(out, "key/value heads: %d, each held by %d tensor-parallel ranks (k and v replicated)\n", s.n_kv_head,
                gpt_kv_replicas(&s, tp));
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
    if (dt_layout_offload(L)) print_offload(L, 0, out);
    if (pp > 1) {
        fprintf(out, "pipeline %d stages (%s, %d micro-batches; psi and activations above: stage 0):\n", pp,
                c->parallel.schedule, L->m);
        for (int r = 0; r < pp; r++) {
            gpt_layout lay = layout_of(L, r);
            char blocks[512];
            blocks_text(L, &lay, blocks, sizeof blocks, 0);
            offload_bytes o;
            fprintf(out, "  stage %d: blocks %s, psi = %.0f, %d activation slot%s = %.1f MB, per rank %.1f MB "
                    "(ZeRO %d", r, blocks, stage_psi(L, r),
                    lay.slots, lay.slots == 1 ? "" : "s", act_bytes_regions(L, r, NULL) / 1e6,
                    stage_device(L, r, &o) / 1e6, L->zero);
            if (dt_layout_offload(L)) fprintf(out, "; host %.1f MB, NVMe %.1f MB", o.host / 1e6, o.nvme / 1e6);
            fprintf(out, ")\n");
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
