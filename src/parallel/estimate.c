#include "estimate.h"

#include <stdio.h>
#include <string.h>

#include "../model/gpt.h"

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

/* Parameters one rank holds: with tensor parallelism its pieces (the formulas above then
 * apply to them, over the data-parallel ranks). */
static double rank_psi(const dt_config *c, const gpt_shape *s) {
    int tp = c->parallel.tp > 0 ? c->parallel.tp : 1;
    return (double)(tp > 1 ? gpt_param_count_tp(s, tp) : gpt_param_count(s));
}

/* Activation bytes of one rank (its tensor/sequence-parallel pieces), and by region. */
static double act_bytes_regions(const dt_config *c, const gpt_shape *s, size_t *regions) {
    int T = c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len;
    gpt_layout lay = {.tp = c->parallel.tp > 0 ? c->parallel.tp : 1, .sp = c->parallel.sp};
    return (double)gpt_activation_bytes_layout(s, c->train.micro_batch, T, !strcmp(c->precision, "bf16") ? 2 : 4,
                                               &lay, regions);
}
static double act_bytes(const dt_config *c, const gpt_shape *s) { return act_bytes_regions(c, s, NULL); }

double dt_estimate_rank_bytes(const dt_config *c, int dp) {
    gpt_shape s = {c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.seq_len, c->model.vocab_size, 0};
    if (gpt_shape_check(&s) != DT_OK) return 0;
    double psi = rank_psi(c, &s);
    dt_state_bytes b = dt_estimate_fp32(psi, dp, c->parallel.zero);
    int bf16 = !strcmp(c->precision, "bf16");
    double state = !strcmp(c->parallel.dp_mode, "ps") && dp > 1 ? 16 * psi : b.params + b.grads + b.optim;
    if (bf16) state = mixed(psi, dp, c->parallel.zero);
    /* workspace: a DDP bucket; ZeRO-3 holds a few gathered blocks (one block ~ psi / n_layer) */
    double work = c->parallel.zero >= 3 ? 4 * 4 * psi / s.n_layer : c->parallel.bucket_mb * 1048576.0;
    return state + act_bytes(c, &s) + work;
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

dt_status dt_estimate_print(const dt_config *c, int n, int json, FILE *out) {
    gpt_shape s = {c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.seq_len, c->model.vocab_size, 0};
    DT_TRY(gpt_shape_check(&s));
    int tp = c->parallel.tp > 0 ? c->parallel.tp : 1;
    if (s.n_head % tp != 0 || s.padded_vocab % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_head %d and the padded vocabulary %d", tp,
                       s.n_head, s.padded_vocab);
    if (c->parallel.sp && tp <= 1) return dt_fail(DT_EINPUT, "parallel.sp needs parallel.tp > 1");
    double psi = rank_psi(c, &s);
    int T = c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len;
    if (c->parallel.sp && ((long long)c->train.micro_batch * T) % tp != 0)
        return dt_fail(DT_EINPUT, "parallel.sp: the micro-batch's %d x %d tokens do not split into parallel.tp %d "
                       "sequence pieces", c->train.micro_batch, T, tp);
    size_t reg[GPT_ACT_NREGIONS];
    double act = act_bytes_regions(c, &s, reg);
    if (json) {
        fprintf(out, "{\"psi\": %.0f, \"n\": %d, \"tp\": %d, \"sp\": %s, \"activations\": %.0f, \"activation_regions\": "
                "{\"sequence\": %zu, \"tensor\": %zu, \"other\": %zu}, \"fp32\": [", psi, n, tp,
                c->parallel.sp ? "true" : "false", act, reg[GPT_ACT_SEQUENCE], reg[GPT_ACT_TENSOR], reg[GPT_ACT_OTHER]);
        for (int z = 0; z <= 3; z++) {
            dt_state_bytes b = dt_estimate_fp32(psi, n, z);
            fprintf(out, "%s{\"zero\": %d, \"params\": %.0f, \"grads\": %.0f, \"optim\": %.0f, \"total\": %.0f}",
                    z ? ", " : "", z, b.params, b.grads, b.optim, b.params + b.grads + b.optim);
        }
        fprintf(out, "], \"mixed\": [%.0f, %.0f, %.0f, %.0f]}\n", mixed(psi, n, 0), mixed(psi, n, 1),
                mixed(psi, n, 2), mixed(psi, n, 3));
        return DT_OK;
    }
    fprintf(out, "model: %d layers, %d wide, vocab %d (padded %d): psi = %.0f parameters%s; N = %d data-parallel ranks\n",
            s.n_layer, s.n_embd, s.vocab_size, s.padded_vocab, psi,
            tp > 1 ? " per tensor-parallel rank" : "", n);
    if (tp > 1)
        fprintf(out, "tensor parallel %d: each rank holds 1/%d of wte, c_attn, c_fc and the c_proj weights (%.0f of "
                "%.0f parameters)\n", tp, tp, psi, (double)gpt_param_count(&s));
    fprintf(out, "%-8s %-14s %12s   %-14s %12s %12s %12s %12s\n", "stage", "bf16+fp32", "per rank", "fp32 (cpu)",
            "params", "grads", "optimizer", "per rank");
    static const char *mf[4] = {"16psi", "4psi+12psi/N", "2psi+14psi/N", "16psi/N"};
    static const char *ff[4] = {"16psi", "8psi+8psi/N", "4psi+12psi/N", "16psi/N"};
    for (int z = 0; z <= 3; z++) {
        dt_state_bytes b = dt_estimate_fp32(psi, n, z);
        fprintf(out, "zero %-3d %-14s %9.1f MB   %-14s %9.1f MB %9.1f MB %9.1f MB %9.1f MB\n", z, mf[z],
                mixed(psi, n, z) / 1e6, ff[z], b.params / 1e6, b.grads / 1e6, b.optim / 1e6,
                (b.params + b.grads + b.optim) / 1e6);
    }
    fprintf(out, "ps: rank 0 holds 16psi = %.1f MB, the other ranks 8psi = %.1f MB\n", 16 * psi / 1e6, 8 * psi / 1e6);
    fprintf(out, "activations (micro-batch %d x %d tokens, %s%s): %.1f MB per rank, in every mode\n",
            c->train.micro_batch, T, c->precision, c->parallel.sp ? ", sequence parallel" : "", act / 1e6);
    fprintf(out, "  LayerNorm and residual rows %.1f MB, attention and MLP inner %.1f MB, head and scratch %.1f MB\n",
            reg[GPT_ACT_SEQUENCE] / 1e6, reg[GPT_ACT_TENSOR] / 1e6, reg[GPT_ACT_OTHER] / 1e6);
    if (tp > 1) { /* what the other choice of parallel.sp would give */
        dt_config other = *c;
        other.parallel.sp = !c->parallel.sp;
        fprintf(out, "  with parallel.sp=%s: %.1f MB (sequence parallelism splits the LayerNorm and residual rows)\n",
                other.parallel.sp ? "true" : "false", act_bytes(&other, &s) / 1e6);
    }
    return DT_OK;
}
