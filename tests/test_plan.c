/* The layout planner's model, checked piece by piece: which groups lie inside a node, the
 * communication volume of each group against the seed formulas (ring all-reduce
 * 2(N−1)/N·M over the gradients; tp's four all-reduces per block and micro-batch; a
 * pipeline's two messages per micro-batch; the ring's 3·cp−2 blocks per block and
 * micro-batch), the bubble (p−1)/(m+p−1), memory = the estimator's, step time = compute
 * stretched by the bubble or by ranks sharing cores, plus the optimizer and communication;
 * a rate per shard shape; groups across nodes sharing the node's link; layouts that cannot
 * run are refused (unless planned on paper), and the full list fits in memory and is
 * sorted by step time; offload's suggestions where only offload fits. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/config.h"
#include "model/gpt.h"
#include "parallel/layout/estimate.h"
#include "parallel/layout/plan.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)) + 1e-12; }

int main(void) {
    CHECK(dt_plan_group_intra(DT_PLAN_TP, 2, 1, 1, 8, 8) && !dt_plan_group_intra(DT_PLAN_CP, 1, 1, 2, 8, 8) &&
              !dt_plan_group_intra(DT_PLAN_DP, 2, 1, 1, 8, 8) && dt_plan_group_intra(DT_PLAN_PP, 2, 2, 1, 2, 4) &&
              !dt_plan_group_intra(DT_PLAN_TP, 1, 1, 1, 8, 6) && dt_plan_group_intra(DT_PLAN_DP, 2, 1, 1, 2, 4),
          "groups inside a node: tp innermost, then cp, pp, dp");

    dt_config c;
    dt_config_defaults(&c);
    c.model.n_layer = 4;
    c.model.n_head = 4;
    c.model.n_embd = 64;
    c.model.seq_len = 64;
    c.model.vocab_size = 256;
    c.train.seq_len = 64;
    c.train.micro_batch = 2;
    c.train.global_batch = 16;
    dt_machine mc = {.world = 8, .ranks_per_node = 4, .memory = 0, .flops = 1e10, .intra = {1e-6, 1e10},
                     .inter = {1e-5, 1e9}};
    gpt_shape s = {4, 4, 64, 64, 256, .padded_vocab = 0};
    CHECK(gpt_shape_check(&s) == DT_OK, "shape");
    double psi = (double)gpt_param_count(&s), C = 64, T = 64;

    dt_plan_entry e;
    CHECK(dt_plan_layout(&c, &mc, 8, 1, 1, 1, 0, &e) == DT_OK, "dp 8");
    CHECK(e.m == 1 && near(e.comm_bytes[DT_PLAN_DP], 2.0 * 7 / 8 * psi * 4) && e.comm_s[DT_PLAN_TP] == 0 &&
              !e.intra[DT_PLAN_DP],
          "dp 8: one ring all-reduce of the gradients, across nodes (%.0f bytes)", e.comm_bytes[DT_PLAN_DP]);
    dt_config lc = c;
    lc.parallel.zero = 0;
    CHECK(near(e.memory, dt_estimate_rank_bytes(&lc, 8)), "memory = the estimator's");
    double flops = 16 * T * gpt_flops_per_token(&s, 64) / 8 / 1e10;
    CHECK(near(e.compute_s, flops) && near(e.step_s, e.compute_s + e.comm_s[DT_PLAN_DP]), "step = compute + dp");

    /* a ring across nodes whose members neighbour inside a node too waits for its slowest
     * hop each step: an intra link slower per message (an oversubscribed node) sets α */
    {
        dt_machine slow = mc;
        slow.intra = (dt_link){1e-3, 5e8};
        dt_plan_entry q;
        /* the ring all-reduce over 8: 2·7 messages per unit (4 blocks, the embeddings, the final norm) */
        double msgs = 2.0 * 7 * 6, vol = 2.0 * 7 / 8 * psi * 4;
        CHECK(dt_plan_layout(&c, &slow, 8, 1, 1, 1, 0, &q) == DT_OK &&
                  near(q.comm_s[DT_PLAN_DP], msgs * 1e-3 + vol / 5e8),
              "dp 8 across nodes over a slower intra link: its α and β (%.3g s)", q.comm_s[DT_PLAN_DP]);
        slow.ranks_per_node = 1; /* one rank a node: every hop crosses */
        CHECK(dt_plan_layout(&c, &slow, 8, 1, 1, 1, 0, &q) == DT_OK &&
                  near(q.comm_s[DT_PLAN_DP], e.comm_s[DT_PLAN_DP]),
              "dp 8, a rank per node: the inter link alone (%.3g against %.3g s)", q.comm_s[DT_PLAN_DP],
              e.comm_s[DT_PLAN_DP]);
    }

    CHECK(dt_plan_layout(&c, &mc, 2, 2, 1, 2, 1, &e) == DT_OK, "dp 2 x pp 2 x tp 2");
    double rows = 2 * T, m = 4;
    CHECK(e.m == 4 && near(e.bubble, 1.0 / 5) && e.intra[DT_PLAN_TP] && e.intra[DT_PLAN_PP] && !e.intra[DT_PLAN_DP],
          "m 4, bubble 1/5, tp and pp inside a node");
    CHECK(near(e.comm_bytes[DT_PLAN_TP], m * 2 * 4 * 2.0 * 1 / 2 * rows * C * 4), "tp: 4 all-reduces per block");
    CHECK(near(e.comm_bytes[DT_PLAN_PP], 2 * m * rows * C * 4), "pp: an activation and a gradient per micro-batch");
    double comm = 0;
    for (int g = 0; g < DT_PLAN_NGROUPS; g++) comm += e.comm_s[g];
    CHECK(near(e.step_s, e.compute_s * (m + 1) / m + comm), "step = compute / (1 - bubble) + communication");

    CHECK(dt_plan_layout(&c, &mc, 2, 1, 4, 1, 0, &e) == DT_OK, "dp 2 x cp 4");
    CHECK(near(e.comm_bytes[DT_PLAN_CP], 4 * 4 * (3.0 * 4 - 2) * (2 * T / 4) * 3 * C * 4),
          "cp: 3cp-2 blocks per block and micro-batch");

    CHECK(dt_plan_layout(&c, &mc, 1, 1, 1, 8, 0, &e) == DT_EINPUT, "tp 8 does not divide 4 heads");
    CHECK(dt_plan_layout(&c, &mc, 1, 1, 8, 1, 0, &e) == DT_OK, "cp 8: 64 positions in 16 chunks");
    c.train.seq_len = 40;
    CHECK(dt_plan_layout(&c, &mc, 1, 1, 8, 1, 0, &e) == DT_EINPUT, "cp 8 does not split 40 positions");
    c.train.seq_len = 64;
    CHECK(dt_plan_layout(&c, &mc, 1, 8, 1, 1, 0, &e) == DT_EINPUT, "pp 8 exceeds 4 blocks");

    /* ranks sharing a node's cores: 4 ranks on 2 cores compute at half speed unless the
     * bubble costs more; the optimizer's time per parameter, over a ZeRO shard */
    mc.cores = 2;
    mc.optim_s = 1e-9;
    CHECK(dt_plan_layout(&c, &mc, 8, 1, 1, 1, 0, &e) == DT_OK && e.share == 2 && near(e.optim_s, psi * 1e-9) &&
              near(e.step_s, 2 * e.compute_s + 2 * e.optim_s + e.comm_s[DT_PLAN_DP]),
          "dp 8, 4 ranks per node on 2 cores: step = 2 x (compute + optimizer) + dp");
    CHECK(dt_plan_layout(&c, &mc, 8, 1, 1, 1, 1, &e) == DT_OK && near(e.optim_s, psi / 8 * 1e-9), "ZeRO-1: a shard");
    c.train.global_batch = 4;
    CHECK(dt_plan_layout(&c, &mc, 1, 4, 1, 2, 0, &e) == DT_OK && e.m == 2 &&
              near(e.step_s - e.comm_s[DT_PLAN_TP] - e.comm_s[DT_PLAN_PP] - e.comm_s[DT_PLAN_DP] - 2 * e.optim_s,
                   e.compute_s * 5 / 2),
          "pp 4, m 2: the bubble (5/2) outweighs 2 ranks per core");
    c.train.global_batch = 16;
    mc.cores = 0;
    mc.optim_s = 0;

    /* hybrid sharding: ZeRO-3 within each node's 4 ranks (their ring passes over the
     * intra link), each rank's quarter of the gradients all-reduced with its peer on the
     * other node: every rank of a node crosses the link, with a quarter of the model each */
    dt_plan_entry z3;
    CHECK(dt_plan_layout(&c, &mc, 8, 1, 1, 1, 3, &z3) == DT_OK, "dp 8 ZeRO-3");
    CHECK(dt_plan_layout_hsdp(&c, &mc, 8, 1, 1, 1, 3, 4, &e) == DT_OK && e.shard == 4, "dp 8 ZeRO-3, dp_shard 4");
    double passes = z3.comm_bytes[DT_PLAN_DP] / (7.0 / 8 * psi * 4), inside = passes * 3.0 / 4 * psi * 4;
    double across = 2.0 * 1 / 2 * psi / 4 * 4;
    CHECK(near(e.comm_bytes[DT_PLAN_DP], inside + across) && near(e.cross_bytes, 4 * across) &&
              near(z3.cross_bytes, z3.comm_bytes[DT_PLAN_DP]) && e.comm_s[DT_PLAN_DP] < z3.comm_s[DT_PLAN_DP],
          "HSDP: %.0f passes inside, the shard across (%.0f bytes over a node's link, ZeRO-3 over 8: %.0f)", passes,
          e.cross_bytes, z3.cross_bytes);
    lc = c;
    lc.parallel.zero = 3;
    lc.parallel.dp_shard = 4;
    CHECK(near(e.memory, dt_estimate_rank_bytes(&lc, 8)) && e.memory > z3.memory, "HSDP memory = the estimator's");
    CHECK(dt_plan_layout_hsdp(&c, &mc, 8, 1, 1, 1, 0, 4, &e) == DT_EINPUT &&
              dt_plan_layout_hsdp(&c, &mc, 8, 1, 1, 1, 3, 3, &e) == DT_EINPUT,
          "HSDP needs a ZeRO stage and a group size dividing dp");
    {
        static dt_plan_entry every[4096];
        int k = dt_plan_all(&c, &mc, every, 4096), shards = 0;
        for (int i = 0; i < k; i++) shards += every[i].shard > 0;
        CHECK(shards > 0, "the plan offers HSDP layouts (%d of %d)", shards, k);
    }

    /* the planner's per-unit policies: ZeRO-3 with the embeddings replicated (wte + wpe, one
     * unit) all-reduces them per micro-batch (2 passes) where ZeRO-3 passes 3 times over
     * them, gathers nothing for them, and updates them whole; memory the estimator's */
    {
        double emb = 256.0 * 64 + 64.0 * 64, mb = 1; /* m: 16 / (2 x 8) */
        CHECK(dt_plan_layout_policy(&c, &mc, 8, 1, 1, 1, 3, 0, 1, &e) == DT_OK && e.policy == 1,
              "ZeRO-3 with %s", dt_plan_policies[1]);
        CHECK(near(e.comm_bytes[DT_PLAN_DP], (3 * mb * (psi - emb) + 2 * mb * emb) * 7.0 / 8 * 4) &&
                  near(e.comm_s[DT_PLAN_DP], (3 * mb * 5 + 2 * mb * 1) * 7 * 1e-5 + e.comm_bytes[DT_PLAN_DP] / 1e9),
              "replicated embeddings: all-reduced, not gathered (%.0f bytes)", e.comm_bytes[DT_PLAN_DP]);
        lc = c;
        lc.parallel.zero = 3;
        strcpy(lc.parallel.policy, dt_plan_policies[1]);
        CHECK(near(e.memory, dt_estimate_rank_bytes(&lc, 8)) && e.memory > z3.memory, "policy memory = the estimator's");
        lc.parallel.tp = 2;
        dt_status st = dt_plan_layout_policy(&c, &mc, 4, 1, 1, 2, 3, 0, 1, &e);
        CHECK(st == DT_OK && near(e.memory, dt_estimate_rank_bytes(&lc, 4)),
              "a replicated unit with tp: its tp piece, memory the estimator's (%d: %.0f against %.0f)", st, e.memory,
              (double)dt_estimate_rank_bytes(&lc, 4));
        lc.parallel.tp = 1;
        CHECK(dt_plan_layout_policy(&c, &mc, 4, 2, 1, 1, 1, 0, 1, &e) == DT_EINPUT,
              "a replicated unit with pp: refused as the run refuses it");
        CHECK(dt_plan_layout_policy(&c, &mc, 8, 1, 1, 1, 3, 4, 3, &e) == DT_OK &&
                  near(e.cross_bytes, 4 * (2.0 / 2 * (psi - emb - 128) / 4 * 4) + 4 * (2.0 / 2 * (emb + 128) * 4)),
              "HSDP with replicated units: their whole gradient across (%.0f bytes)", e.cross_bytes);
        static dt_plan_entry every[4096];
        int k = dt_plan_all(&c, &mc, every, 4096), pol = 0, other = 0;
        for (int i = 0; i < k; i++) {
            pol += every[i].policy > 0;
            other += every[i].policy > 0 && (every[i].zero == 0 || every[i].tp * every[i].pp * every[i].cp > 1);
        }
        CHECK(pol > 0 && other == 0, "the plan offers policies (%d of %d), with ZeRO stages of dp alone", pol, k);
        lc = c;
        strcpy(lc.parallel.policy, "ln_f.*:ddp");
        k = dt_plan_all(&lc, &mc, every, 4096), pol = 0;
        for (int i = 0; i < k; i++) pol += every[i].policy > 0;
        CHECK(k > 0 && pol == 0 && dt_plan_layout_policy(&lc, &mc, 8, 1, 1, 1, 3, 0, 1, &e) == DT_EINPUT,
              "a config's own policy is the only one planned");
    }

    /* a measured rate per shard shape: tp 2's smaller GEMMs at half the rate */
    mc.rates[mc.nrates++] = (dt_plan_rate){2, 1, 5e9};
    CHECK(dt_plan_layout(&c, &mc, 4, 1, 1, 2, 0, &e) == DT_OK && near(e.compute_s, 2 * flops), "tp 2 at its rate");
    mc.nrates = 0;

    /* groups across nodes share the node's link: dp 2 x tp 4 on nodes of 4 has four dp
     * groups crossing each node's link, each at a quarter of its bandwidth */
    CHECK(dt_plan_link_share(DT_PLAN_DP, 2, 1, 1, 4, 4) == 4 && dt_plan_link_share(DT_PLAN_DP, 8, 1, 1, 1, 4) == 1 &&
              dt_plan_link_share(DT_PLAN_PP, 1, 2, 1, 4, 4) == 4 && dt_plan_link_share(DT_PLAN_DP, 2, 2, 1, 2, 4) == 4 &&
              dt_plan_link_share(DT_PLAN_TP, 8, 1, 1, 1, 4) == 4,
          "groups of a kind per node");
    CHECK(dt_plan_layout(&c, &mc, 2, 1, 1, 4, 0, &e) == DT_OK && !e.intra[DT_PLAN_DP], "dp 2 x tp 4");
    double msgs = 2.0 * 1 * (4 + 2), vol = 2.0 * 1 / 2 * (double)gpt_param_count_tp(&s, 4) * 4;
    CHECK(near(e.comm_bytes[DT_PLAN_DP], vol) && near(e.comm_s[DT_PLAN_DP], msgs * 1e-5 + vol / (1e9 / 4)),
          "dp across nodes at a quarter of the link (%g s)", e.comm_s[DT_PLAN_DP]);

    /* layouts this build refuses for a feature (bitwise mode with tp but without its
     * canonical chunks) are planned on paper with --any-feature; bf16 traffic is in 2-byte
     * elements */
    strcpy(c.precision, "bf16");
    CHECK(dt_plan_layout(&c, &mc, 4, 1, 1, 2, 1, &e) == DT_OK &&
              near(e.comm_bytes[DT_PLAN_TP], 2 * 4 * 4 * 2.0 * 1 / 2 * (2 * T) * C * 2),
          "tp 2 and ZeRO-1 with bf16, 2-byte activations");
    strcpy(c.parallel.determinism, "bitwise");
    strcpy(c.parallel.tp_chunks, "1");
    CHECK(dt_plan_layout(&c, &mc, 4, 1, 1, 2, 1, &e) == DT_EINPUT, "bitwise mode with tp, tp_chunks 1 refused");
    mc.any_feature = 1;
    CHECK(dt_plan_layout(&c, &mc, 4, 1, 1, 2, 1, &e) == DT_OK &&
              near(e.comm_bytes[DT_PLAN_TP], 2 * 4 * 4 * 2.0 * 1 / 2 * (2 * T) * C * 2),
          "--any-feature: bitwise mode with tp, tp_chunks 1 planned");
    mc.any_feature = 0;
    strcpy(c.parallel.tp_chunks, "4");
    strcpy(c.parallel.determinism, "fast");
    strcpy(c.precision, "fp32");
    dt_error_clear();

    dt_plan_entry all[256];
    mc.memory = 40e6;
    int n = dt_plan_all(&c, &mc, all, 256), sorted = 1, fits = 1, whole = 1;
    for (int i = 0; i < n; i++) {
        if (i && all[i].step_s < all[i - 1].step_s) sorted = 0;
        if (all[i].memory > mc.memory) fits = 0;
        if (all[i].dp * all[i].pp * all[i].cp * all[i].tp != 8) whole = 0;
    }
    CHECK(n > 10 && sorted && fits && whole, "%d layouts, sorted, all fit, all of the world", n);
    dt_plan_print(stdout, all, n < 8 ? n : 8, 0);

    /* nothing fits: the nearest layout is the least memory of any that runs, and each
     * suggestion is a plan with a layout that fits, the extreme one of its kind */
    mc.memory = 0;
    n = dt_plan_all(&c, &mc, all, 256);
    double least = all[0].memory;
    for (int i = 1; i < n; i++) least = fmin(least, all[i].memory);
    mc.memory = least * 0.9;
    CHECK(dt_plan_all(&c, &mc, all, 256) == 0, "a budget under the least memory: no layout fits");
    dt_plan_advice a;
    dt_plan_advise(&c, &mc, &a);
    CHECK(a.runs && near(a.nearest.memory, least) && a.nfixes >= 2, "nearest %.0f bytes (least %.0f), %d fixes",
          a.nearest.memory, least, a.nfixes);
    int kinds = 0;
    for (int i = 0; i < a.nfixes; i++) {
        const dt_plan_fix *x = &a.fixes[i];
        dt_config fc = c;
        dt_machine fm = mc;
        kinds |= 1 << x->kind;
        if (x->kind == DT_FIX_RANKS) fm.world = x->value;
        if (x->kind == DT_FIX_RECOMPUTE || x->kind == DT_FIX_ALL) strcpy(fc.train.recompute, "full");
        if (x->kind == DT_FIX_MICRO || x->kind == DT_FIX_ALL) fc.train.micro_batch = x->value;
        if (x->kind == DT_FIX_BF16 || x->kind == DT_FIX_ALL) strcpy(fc.precision, "bf16");
        if (x->kind == DT_FIX_OFFLOAD_CPU) strcpy(fc.offload.optimizer, "cpu");
        if (x->kind == DT_FIX_OFFLOAD_NVME) {
            strcpy(fc.offload.optimizer, "nvme");
            strcpy(fc.offload.param, "nvme");
        }
        int got = dt_plan_all(&fc, &fm, all, 256);
        CHECK(got > 0 && x->best.memory <= mc.memory && x->best.step_s == all[0].step_s,
              "fix %d (value %d): %d layouts fit, the best is the suggestion's", x->kind, x->value, got);
        if (x->kind == DT_FIX_RANKS) { /* the smallest such world */
            int smaller = 0;
            for (int w = mc.world + 1; w < x->value; w++) {
                fm.world = w;
                smaller += dt_plan_all(&fc, &fm, all, 256);
            }
            CHECK(x->value > mc.world && smaller == 0, "more ranks: %d, the smallest world that fits", x->value);
        }
        if (x->kind == DT_FIX_MICRO) { /* the largest such micro-batch */
            fc.train.micro_batch = x->value + 1;
            CHECK(x->value < c.train.micro_batch &&
                      (x->value + 1 == c.train.micro_batch || dt_plan_all(&fc, &fm, all, 256) == 0),
                  "micro-batch %d: the largest that fits", x->value);
        }
    }
    CHECK((kinds & (1 << DT_FIX_RANKS)) && (kinds & (1 << DT_FIX_MICRO)), "more ranks and a smaller micro-batch fit");
    dt_plan_print_advice(stdout, &a, &mc, 0);
    mc.memory = 1; /* a byte: nothing fits, whatever the change */
    dt_plan_advise(&c, &mc, &a);
    CHECK(a.runs && a.nfixes == 0 && !a.only_offload, "a budget of a byte: the nearest layout, no fix (%d)", a.nfixes);

    /* offload (docs/offload.md): a model whose state outweighs its activations (a wide
     * vocabulary, short sequences, one sequence per micro-batch) on one device rank */
    dt_config o = c;
    o.model.vocab_size = 16384;
    o.model.seq_len = o.train.seq_len = 16;
    o.train.micro_batch = 1;
    o.train.global_batch = 1;
    strcpy(o.backend, "emulated");
    dt_machine m1 = {.world = 1, .ranks_per_node = 1, .flops = 1e10, .intra = {1e-6, 1e10}, .inter = {1e-5, 1e9}};
    CHECK(dt_plan_layout(&o, &m1, 1, 1, 1, 1, 0, &e) == DT_OK, "the offload model on one rank");
    double all_on = e.memory;
    strcpy(o.offload.optimizer, "cpu");
    CHECK(dt_plan_layout(&o, &m1, 1, 1, 1, 1, 0, &e) == DT_OK, "with offload.optimizer cpu");
    gpt_shape os = {4, 4, 64, 16, 16384, .padded_vocab = 0};
    CHECK(gpt_shape_check(&os) == DT_OK, "the offload model's shape");
    double off = e.memory, opsi = (double)gpt_param_count(&os);
    CHECK(near(all_on - off, 8 * opsi), "cpu offload, fp32, a device backend: 8 bytes per parameter off the budget "
          "(%.0f of %.0f)", all_on - off, all_on);
    strcpy(o.offload.optimizer, "none");
    m1.memory = (all_on + off) / 2;
    dt_plan_advise(&o, &m1, &a);
    int found = 0;
    for (int i = 0; i < a.nfixes; i++) found |= a.fixes[i].kind == DT_FIX_OFFLOAD_CPU && a.fixes[i].best.memory == off;
    CHECK(found && a.only_offload, "between the two: only offload.optimizer=cpu fits on one rank (%d fixes)", a.nfixes);
    dt_plan_print_advice(stdout, &a, &m1, 0);
    strcpy(o.backend, "cpu"); /* the CPU's device memory is the host's: moving the state there saves nothing */
    dt_plan_advise(&o, &m1, &a);
    found = 0;
    for (int i = 0; i < a.nfixes; i++) found |= a.fixes[i].kind == DT_FIX_OFFLOAD_CPU;
    CHECK(!found, "the CPU backend: no host-memory offload suggested");
    /* parameter offload is ZeRO-3's, on paper too; an nvme plan needs no directory yet */
    strcpy(o.offload.param, "cpu");
    o.train.global_batch = 8;
    mc.any_feature = 1;
    CHECK(dt_plan_layout(&o, &mc, 8, 1, 1, 1, 2, &e) == DT_EINPUT && strstr(dt_error_message(), "offload.param"),
          "offload.param with ZeRO-2: refused even with --any-feature");
    mc.any_feature = 0;
    dt_error_clear();
    strcpy(o.offload.param, "nvme");
    strcpy(o.offload.optimizer, "nvme");
    CHECK(dt_plan_layout(&o, &mc, 8, 1, 1, 1, 3, &e) == DT_OK, "nvme offload with ZeRO-3 planned without nvme_path");
    return check_finish();
}
