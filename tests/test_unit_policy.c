/* Wrap units and the per-unit sharding policy (src/parallel/layout/policy.c,
 * parallel.unit_blocks): units of k blocks in the tensor table (block j in unit 1 + j/k,
 * ln_f last, the counts the estimator reads); a policy's mode per unit (first matching
 * rule per tensor, else parallel.zero), its stage and whether it replicates some units;
 * the refusals: a glob matching nothing, a rule splitting a unit, zero1 with another ZeRO
 * stage (zero2 units among zero3's run), a rule
 * without a mode or with an unknown one; parallel.unit_split: where a block may begin a
 * unit (its second norm), the policy over the halves, and its refusals (a unit that
 * would cut a half, some blocks split and not others, a glob matching nothing). */
#include <string.h>

#include "check.h"
#include "model/gpt.h"
#include "parallel/layout/policy.h"

/* 4 blocks, C = 8, 2 heads, vocabulary 70, 8 positions */
static gpt_shape SHAPE = {4, 2, 8, 8, 70, .padded_vocab = 0};

static void units_of_blocks(int k) {
    gpt_model m;
    gpt_layout lay = {.unit_blocks = k};
    CHECK(gpt_table_layout(&m, &SHAPE, &lay, NULL) == DT_OK, "table with unit_blocks %d", k);
    CHECK(m.nunits == 2 + 4 / k, "unit_blocks %d: %d units", k, m.nunits);
    for (int i = 0; i < m.ntensors; i++) {
        const gpt_tensor *t = &m.tensors[i];
        int want = t->layer >= 0 ? 1 + t->layer / k : !strncmp(t->name, "ln_f", 4) ? m.nunits - 1 : 0;
        CHECK(t->unit == want, "unit_blocks %d: %s in unit %d, want %d", k, t->name, t->unit, want);
    }
    size_t first, block[2], last, one[2];
    int nb;
    gpt_unit_counts_layout(&SHAPE, NULL, &first, one, &last, &nb);
    gpt_unit_counts_layout(&SHAPE, &lay, &first, block, &last, &nb);
    CHECK(block[0] == (size_t)k * one[0] && !block[1] && nb == 4 / k && m.units[1].count == block[0],
          "unit_blocks %d: block unit %zu", k, block[0]);
    gpt_destroy(&m);
}

/* k blocks per unit; k = -1: each block split in two (parallel.unit_split) */
static void modes(const char *policy, int zero, int k, const signed char *want, int n) {
    gpt_model m;
    gpt_layout lay = {.unit_blocks = k > 0 ? k : 1, .split_blocks = k < 0};
    signed char got[16];
    CHECK(gpt_table_layout(&m, &SHAPE, &lay, NULL) == DT_OK, "table");
    CHECK(m.nunits == n && dt_policy_units(policy, zero, &m, got) == DT_OK, "policy '%s'", policy);
    for (int u = 0; u < n; u++) CHECK(got[u] == want[u], "'%s': unit %d mode %d, want %d", policy, u, got[u], want[u]);
    gpt_destroy(&m);
}

static const gpt_layout ONE = {.unit_blocks = 1};

static void split_refused(const char *split, const char *why) {
    int sb = 7;
    CHECK(dt_unit_split(split, &SHAPE, &sb) == DT_EINPUT && sb == 0, "unit_split '%s' accepted", split);
    CHECK(strstr(dt_error_message(), why) != NULL, "unit_split '%s': %s, want %s", split, dt_error_message(), why);
    dt_error_clear();
}

static void refused(const char *policy, int zero, int k, const char *why) {
    int stage, repl;
    gpt_layout units = {.unit_blocks = k > 0 ? k : 1, .split_blocks = k < 0};
    CHECK(dt_policy_stage(policy, zero, &SHAPE, &units, &stage, &repl) == DT_EINPUT, "'%s' accepted", policy);
    CHECK(strstr(dt_error_message(), why) != NULL, "'%s': %s, want %s", policy, dt_error_message(), why);
    dt_error_clear();
}

int main(void) {
    CHECK(gpt_shape_check(&SHAPE) == DT_OK, "shape");
    units_of_blocks(1);
    units_of_blocks(2);
    units_of_blocks(4);
    /* the embeddings ddp, the rest ZeRO-3; the blocks ZeRO-2, the rest ddp; two blocks per unit */
    modes("w?e.weight:ddp", 3, 1, (const signed char[]){0, 3, 3, 3, 3, 3}, 6);
    modes("wte.weight:ddp,wpe.weight:ddp", 3, 1, (const signed char[]){0, 3, 3, 3, 3, 3}, 6);
    modes("h.*:zero2", 0, 1, (const signed char[]){0, 2, 2, 2, 2, 0}, 6);
    modes("h.[01].*:ddp", 3, 2, (const signed char[]){3, 0, 3, 3}, 4);
    modes("h.0.*:zero3,h.*:ddp", 0, 1, (const signed char[]){0, 3, 0, 0, 0, 0}, 6); /* first match wins */
    int stage, repl;
    CHECK(dt_policy_stage("w?e.weight:ddp", 3, &SHAPE, &ONE, &stage, &repl) == DT_OK && stage == 3 && repl,
          "embeddings ddp: stage %d, replicated %d", stage, repl);
    CHECK(dt_policy_stage("h.*:ddp", 0, &SHAPE, &ONE, &stage, &repl) == DT_OK && stage == 0 && !repl,
          "every unit ddp: plain DDP (stage %d, replicated %d)", stage, repl);
    CHECK(dt_policy_stage("h.*:zero1,w?e.weight:zero1,ln_f.*:zero1", 3, &SHAPE, &ONE, &stage, &repl) == DT_OK &&
              stage == 1 && !repl,
          "every unit zero1: plain ZeRO-1 (stage %d)", stage);
    refused("x.*:ddp", 3, 1, "matches no tensor");
    refused("wte.weight:ddp", 3, 1, "splits a unit");
    refused("h.0.*:ddp", 3, 2, "splits a unit"); /* half of a two-block unit */
    refused("h.0.*:zero1", 3, 1, "mixes zero1 and zero3");
    refused("h.0.*:zero1", 2, 1, "mixes zero1 and zero2");
    /* zero2 units among zero3's: the run's stage 3, the units apart */
    CHECK(dt_policy_stage("h.*:zero2", 3, &SHAPE, &ONE, &stage, &repl) == DT_OK && stage == 3 && repl,
          "blocks zero2, the rest zero3: stage %d, apart %d", stage, repl);
    CHECK(dt_policy_stage("h.*:zero3", 2, &SHAPE, &ONE, &stage, &repl) == DT_OK && stage == 3 && repl,
          "blocks zero3, the rest zero2: stage %d, apart %d", stage, repl);
    modes("h.[01].*:zero2,w?e.weight:ddp", 3, 1, (const signed char[]){0, 2, 2, 3, 3, 3}, 6);
    refused("h.*", 3, 1, "is not GLOB:MODE");
    refused("h.*:fsdp", 3, 1, "is not ddp, zero1");
    /* a block in two units: its attention half (ln_1 .. attn.c_proj) and MLP half (ln_2 ..) */
    gpt_model m;
    gpt_layout sl = {.split_blocks = 1};
    CHECK(gpt_table_layout(&m, &SHAPE, &sl, NULL) == DT_OK && m.nunits == 2 + 2 * 4, "split blocks: units");
    for (int i = 0; i < m.ntensors; i++) {
        const gpt_tensor *t = &m.tensors[i];
        int mlp = strstr(t->name, ".ln_2.") || strstr(t->name, ".mlp.");
        int want = t->layer >= 0 ? 1 + 2 * t->layer + mlp : !strncmp(t->name, "ln_f", 4) ? m.nunits - 1 : 0;
        CHECK(t->unit == want, "split: %s in unit %d, want %d", t->name, t->unit, want);
    }
    gpt_destroy(&m);
    int sb = 0;
    CHECK(dt_unit_split("h.*.ln_2.weight", &SHAPE, &sb) == DT_OK && sb == 1, "h.*.ln_2.weight: split %d", sb);
    CHECK(dt_unit_split("h.*.ln_1.weight,ln_f.weight,wte.weight", &SHAPE, &sb) == DT_OK && sb == 0,
          "unit starts already (a block's first, ln_f's): no split (%d)", sb);
    CHECK(dt_unit_split("", &SHAPE, &sb) == DT_OK && sb == 0, "empty: no split");
    split_refused("h.*.mlp.c_fc.bias", "would cut h.0.ln_2.weight .. h.0.mlp.c_proj.bias");
    split_refused("h.*.attn.c_proj.weight", "would cut h.0.ln_1.weight .. h.0.attn.c_proj.bias");
    split_refused("ln_f.bias", "would cut ln_f.weight .. ln_f.bias");
    split_refused("h.1.ln_2.weight", "splits 1 of the 4 blocks (not block 0)");
    split_refused("h.*.ln_3.weight", "matches no tensor");
    /* the policy over the halves: the MLP halves replicated, the rest ZeRO-3 */
    modes("h.*.ln_2.*:ddp,h.*.mlp.*:ddp", 3, -1, (const signed char[]){3, 3, 0, 3, 0, 3, 0, 3, 0, 3}, 10);
    refused("h.*.mlp.*:ddp", 3, -1, "splits a unit"); /* ln_2 opens the MLP half */
    return check_finish();
}
