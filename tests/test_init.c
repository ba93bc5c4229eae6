/* Layout-independent initialisation: element i of a tensor is a pure function of
 * (seed, name, i), so any split of a tensor (rows, columns, the q/k/v thirds of c_attn,
 * any order) initialises to exactly the unsplit values; gpt_init is that function applied
 * to every element; the draws are N(0, std²) and independent across tensors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/rng.h"
#include "model/gpt.h"

/* the values of a [rows, cols] tensor assembled from a P-way column split, shard by shard
 * in reverse order (as a rank holding piece p would compute them) */
static void assemble_columns(const gpt_init_rule *r, int rows, int cols, int P, float *out) {
    for (int p = P - 1; p >= 0; p--) {
        int c0 = cols * p / P, c1 = cols * (p + 1) / P;
        for (int i = rows - 1; i >= 0; i--)
            for (int j = c0; j < c1; j++) out[(size_t)i * cols + j] = gpt_init_at(r, (uint64_t)i * cols + j);
    }
}

int main(void) {
    /* the rules */
    gpt_init_rule b = gpt_init_rule_for("h.3.mlp.c_fc.bias", 12, 1), ln = gpt_init_rule_for("h.0.ln_1.weight", 12, 1),
                  w = gpt_init_rule_for("h.0.attn.c_attn.weight", 12, 1),
                  pr = gpt_init_rule_for("h.0.mlp.c_proj.weight", 12, 1);
    CHECK(b.kind == 0 && gpt_init_at(&b, 5) == 0.0f, "bias rule");
    CHECK(ln.kind == 1 && gpt_init_at(&ln, 5) == 1.0f, "LayerNorm rule");
    CHECK(w.kind == 2 && w.std == 0.02f, "weight std %g", w.std);
    CHECK(pr.kind == 2 && pr.std == 0.02f / sqrtf(24.0f), "residual projection std %g", pr.std);
    /* fixed values: the initialisation is part of the format (checkpoints, digests) */
    uint64_t k = dt_rng_key(1337, "wte.weight");
    CHECK(dt_rng_normal_at(k, 0) == 0.8097264301897813 && dt_rng_normal_at(k, 1) == -0.032500426385941861 &&
              dt_rng_normal_at(k, 123456789) == 0.27715339850034765,
          "known draws changed: %.17g %.17g", dt_rng_normal_at(k, 0), dt_rng_normal_at(k, 1));

    /* any split gives the unsplit values: column splits (tensor parallel, c_attn [C, 3C]
     * is split per q/k/v third), row splits, any order */
    int rows = 48, cols = 144;
    size_t n = (size_t)rows * cols;
    float *full = malloc(n * sizeof *full), *got = malloc(n * sizeof *got);
    for (size_t i = 0; i < n; i++) full[i] = gpt_init_at(&w, i);
    for (int P = 1; P <= 6; P++) {
        assemble_columns(&w, rows, cols, P, got);
        CHECK(!memcmp(full, got, n * sizeof *got), "column split into %d", P);
        memset(got, 0, n * sizeof *got);
        for (int p = 0; p < P; p++) /* row split */
            for (int i = rows * p / P; i < rows * (p + 1) / P; i++)
                for (int j = 0; j < cols; j++) got[(size_t)i * cols + j] = gpt_init_at(&w, (uint64_t)i * cols + j);
        CHECK(!memcmp(full, got, n * sizeof *got), "row split into %d", P);
    }
    /* q/k/v thirds each split in P pieces (fused QKV with a stride) */
    for (int P = 1; P <= 4; P++) {
        memset(got, 0, n * sizeof *got);
        int third = cols / 3;
        for (int p = 0; p < P; p++)
            for (int part = 0; part < 3; part++)
                for (int i = 0; i < rows; i++)
                    for (int j = part * third + third * p / P; j < part * third + third * (p + 1) / P; j++)
                        got[(size_t)i * cols + j] = gpt_init_at(&w, (uint64_t)i * cols + j);
        CHECK(!memcmp(full, got, n * sizeof *got), "q/k/v thirds split into %d", P);
    }

    /* gpt_init applies the rules to every element; padded vocabulary rows are zero */
    gpt_shape s = {2, 2, 16, 8, 70, .padded_vocab = 0};
    gpt_model m;
    CHECK(gpt_create(&m, &s, dt_ops_cpu(), 1, 8) == DT_OK, "create");
    gpt_init(&m, 42);
    int same = 1;
    for (int i = 0; i < m.ntensors; i++) {
        const gpt_tensor *t = &m.tensors[i];
        gpt_init_rule r = gpt_init_rule_for(t->name, s.n_layer, 42);
        const float *v = m.params + t->offset;
        size_t keep = (size_t)t->saved_rows * t->shape[1];
        for (size_t j = 0; j < t->numel; j++) same &= v[j] == (j < keep ? gpt_init_at(&r, j) : 0.0f);
    }
    CHECK(same, "gpt_init = gpt_init_at for every element, padding zero");
    /* with tensor-parallel shard specs (q|k|v columns split per part, wte's padded vocabulary
     * rows split), gpt_init writes each rank's piece of the same global values */
    float *full_params = malloc(m.nparams * sizeof(float));
    memcpy(full_params, m.params, m.nparams * sizeof(float));
    static const char *split_names[] = {"h.1.attn.c_attn.weight", "h.1.attn.c_attn.bias", "h.0.mlp.c_fc.weight",
                                        "h.0.mlp.c_proj.weight", "wte.weight"};
    static const int split_dim[] = {1, 1, 1, 0, 0}, split_parts[] = {3, 3, 1, 1, 1};
    for (int pieces = 2; pieces <= 4; pieces *= 2)
        for (int p = 0; p < pieces; p++) {
            int ok = 1;
            for (int k = 0; k < 5; k++) {
                gpt_tensor *t = (gpt_tensor *)gpt_find(&m, split_names[k]);
                ok &= dt_shard_split(&t->shard, split_dim[k], pieces, p, split_parts[k], t->name) == DT_OK;
            }
            gpt_init(&m, 42);
            for (int k = 0; k < 5; k++) {
                gpt_tensor *t = (gpt_tensor *)gpt_find(&m, split_names[k]);
                int64_t lr, lc;
                dt_shard_local_shape(&t->shard, &lr, &lc);
                for (int64_t r = 0; r < lr; r++)
                    for (int64_t c = 0; c < lc; c++) {
                        float want = dt_shard_row_is_real(&t->shard, r)
                                         ? full_params[t->offset + dt_shard_global_index(&t->shard, r, c)]
                                         : 0.0f;
                        ok &= m.params[t->offset + r * lc + c] == want;
                    }
                t->shard = t->ndim == 2 ? dt_shard_full(t->shape[0], t->shape[1], t->saved_rows)
                                        : dt_shard_full(1, t->shape[0], 1);
            }
            CHECK(ok, "piece %d of %d initialises to its slice of the unsharded weights", p, pieces);
        }
    free(full_params);
    gpt_destroy(&m);

    /* statistics: N(0, 0.02²) and no correlation between two tensors */
    gpt_init_rule a = gpt_init_rule_for("h.1.mlp.c_fc.weight", 12, 7), c = gpt_init_rule_for("h.2.mlp.c_fc.weight", 12, 7);
    double sum = 0, sq = 0, cross = 0;
    size_t N = 400000;
    for (size_t i = 0; i < N; i++) {
        double x = gpt_init_at(&a, i), y = gpt_init_at(&c, i);
        sum += x, sq += x * x, cross += x * y;
    }
    double mean = sum / N, sd = sqrt(sq / N - mean * mean), corr = cross / N / (0.02 * 0.02);
    CHECK(fabs(mean) < 0.02 * 5 / sqrt((double)N) && fabs(sd / 0.02 - 1) < 0.01 && fabs(corr) < 0.01,
          "mean %g, std %g, correlation %g", mean, sd, corr);
    free(full);
    free(got);
    return check_finish();
}
