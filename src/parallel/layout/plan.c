#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/timer.h"
#include "../../model/gpt.h"
#include "../../optim/optimizer.h"
#include "../model_parallel/context_parallel.h"
#include "../data_parallel/strategy.h"
#include "estimate.h"
#include "layout.h"
#include "policy.h"
#include "../model_parallel/pipeline.h"
#include "../model_parallel/tensor_parallel.h"

int dt_plan_group_intra(int g, int dp, int pp, int cp, int tp, int ranks_per_node) {
    int world = dp * pp * cp * tp, span; /* consecutive ranks a group's members spread over */
    switch (g) {
    case DT_PLAN_TP: span = tp; break;
    case DT_PLAN_CP: span = tp * cp; break;
    case DT_PLAN_PP: span = tp * cp * pp; break;
    default: span = dp > 1 ? world : tp * cp; break; /* dp x cp: the dp coordinate is outermost */
    }
    if (world <= ranks_per_node) return 1;
    return span <= ranks_per_node && ranks_per_node % span == 0;
}

/* The rate measured for this shard shape, else the machine's one figure. */
static double rate_of(const dt_machine *mc, int tp, int cp) {
    for (int i = 0; i < mc->nrates; i++)
        if (mc->rates[i].tp == tp && mc->rates[i].cp == cp) return mc->rates[i].flops;
    return mc->flops;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

int dt_plan_link_share(int g, int dp, int pp, int cp, int tp, int ranks_per_node) {
    int world = dp * pp * cp * tp, R = ranks_per_node < world ? ranks_per_node : world, n = 0;
    long long *id = malloc(sizeof(long long) * (size_t)R);
    if (!id) return R; /* the most it can be */
    for (int r = 0; r < R; r++) { /* rank = ((d·pp + p)·cp + c)·tp + t: tp innermost */
        long long t = r % tp, c = r / tp % cp, p = r / tp / cp % pp, d = r / tp / cp / pp;
        id[r] = g == DT_PLAN_TP ? (d * pp + p) * cp + c
              : g == DT_PLAN_CP ? (d * pp + p) * tp + t
              : g == DT_PLAN_PP ? (d * cp + c) * tp + t
                                : p * tp + t; /* the dp x cp group */
    }
    qsort(id, (size_t)R, sizeof *id, cmp_ll);
    for (int r = 0; r < R; r++) n += r == 0 || id[r] != id[r - 1];
    free(id);
    return n;
}

/* The link of a group whose ring crosses nodes, sharing the node's link with share such
 * rings: where its members also neighbour inside a node (their stride under the node's
 * ranks), each ring step waits for its slowest hop, so the larger α and the smaller β. */
static dt_link crossing_link(const dt_machine *mc, int share, int stride) {
    dt_link l = mc->inter;
    l.beta /= share;
    if (stride < mc->ranks_per_node) {
        if (mc->intra.alpha > l.alpha) l.alpha = mc->intra.alpha;
        if (mc->intra.beta > 0 && mc->intra.beta < l.beta) l.beta = mc->intra.beta;
    }
    return l;
}

static double link_time(const dt_link *l, double messages, double bytes) {
    return messages * l->alpha + (l->beta > 0 ? bytes / l->beta : 0.0);
}

int dt_plan_shard_ok(const dt_config *c, const gpt_shape *s, int tp, int cp) {
    int T = c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len;
    return gpt_tp_splits_heads(s, tp) && cp >= 1 && s->padded_vocab % tp == 0 && (cp == 1 || T % (2 * cp) == 0);
}

const char *const dt_plan_policies[DT_PLAN_NPOLICIES] = {"", "w?e.weight:ddp", "ln_f.*:ddp",
                                                          "w?e.weight:ddp,ln_f.*:ddp"};

dt_status dt_plan_layout(const dt_config *c, const dt_machine *mc, int dp, int pp, int cp, int tp, int zero,
                         dt_plan_entry *out) {
    return dt_plan_layout_policy(c, mc, dp, pp, cp, tp, zero, 0, 0, out);
}

dt_status dt_plan_layout_hsdp(const dt_config *c, const dt_machine *mc, int dp, int pp, int cp, int tp, int zero,
                              int shard, dt_plan_entry *out) {
    return dt_plan_layout_policy(c, mc, dp, pp, cp, tp, zero, shard, 0, out);
}

/* Hybrid sharding's data-parallel traffic, added to out: strategy.h's ring passes of psi
 * inside a shard group of k ranks, then each rank's slice (its gradient shard; a
 * replicated unit whole) all-reduced over the R = dp / k replicas. */
static void hsdp_comm(const dt_machine *mc, dt_plan_entry *out, int k, double passes, double psi, double slice,
                      double f, double units) {
    int dp = out->dp, stride = out->pp * out->cp * out->tp, rpn = mc->ranks_per_node, R = dp / k;
    int world = dp * stride, span = k * stride; /* a shard group: consecutive ranks */
    int intra = world <= rpn || (span <= rpn && rpn % span == 0);
    dt_link in = intra ? mc->intra : crossing_link(mc, dt_plan_link_share(DT_PLAN_DP, k, out->pp, out->cp, out->tp, rpn), stride);
    double vol = passes * (k - 1.0) / k * psi * f, msgs = passes * (k - 1) * units;
    /* the replicas of a shard: one rank in each shard group; every rank of a node is in a
     * different one while the node holds at most one group's span, each crossing the link */
    int across = world > rpn;
    dt_link out_l = across ? mc->inter : mc->intra;
    int groups = span < rpn ? span : rpn;
    if (across) out_l.beta /= groups;
    double rvol = 2.0 * (R - 1.0) / R * slice * f, rmsgs = 2.0 * (R - 1) * units;
    out->comm_bytes[DT_PLAN_DP] += vol + rvol;
    out->comm_s[DT_PLAN_DP] += link_time(&in, msgs, vol) + link_time(&out_l, rmsgs, rvol);
    out->intra[DT_PLAN_DP] = intra && !across;
    out->cross_bytes += (intra ? 0.0 : vol * dt_plan_link_share(DT_PLAN_DP, k, out->pp, out->cp, out->tp, rpn)) +
                        (across ? rvol * groups : 0.0);
}

dt_status dt_plan_layout_policy(const dt_config *c, const dt_machine *mc, int dp, int pp, int cp, int tp, int zero,
                                int shard, int policy, dt_plan_entry *out) {
    memset(out, 0, sizeof *out);
    if (policy < 0 || policy >= DT_PLAN_NPOLICIES || (policy && c->parallel.policy[0]))
        return dt_fail(DT_EINPUT, "plan: policy %d: the config's own, or one of the planner's where it has none", policy);
    if (shard && (zero < 1 || shard <= 1 || shard >= dp || dp % shard))
        return dt_fail(DT_EINPUT, "plan: dp_shard %d: ZeRO 1-3 within groups that divide dp %d (1 < dp_shard < dp)",
                       shard, dp);
    dt_layout base; /* the config's model */
    dt_layout_derive(&base, c, 0);
    gpt_shape s = base.shape;
    DT_TRY(gpt_shape_check(&s));
    if (dp * pp * cp * tp != mc->world)
        return dt_fail(DT_EINPUT, "plan: %d x %d x %d x %d is not the world %d", dp, pp, cp, tp, mc->world);
    dt_config lc = *c; /* the layout as a config: the estimator's memory */
    /* a plan is on paper: the offload directory is train's to check (a fix suggests nvme) */
    if (!lc.offload.nvme_path[0]) strcpy(lc.offload.nvme_path, "plan");
    lc.parallel.tp = tp;
    lc.parallel.pp = pp;
    lc.parallel.cp = cp;
    lc.parallel.dp_shard = shard;
    if (policy) strcpy(lc.parallel.policy, dt_plan_policies[policy]);
    DT_TRY(dt_config_resolve_micro_batch(&lc, mc->world)); /* parallel.micro_batches fixes m, not the micro-batch */
    int T = c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len, micro = lc.train.micro_batch;
    long long gb = lc.train.global_batch > 0 ? lc.train.global_batch : (long long)micro * dp;
    if (!dt_plan_shard_ok(c, &s, tp, cp))
        return dt_fail(DT_EINPUT, "plan: tp %d does not divide the heads and the padded vocabulary, or cp %d does not "
                       "split the sequence", tp, cp);
    if (s.n_layer < pp) return dt_fail(DT_EINPUT, "plan: pp %d exceeds the %d blocks", pp, s.n_layer);
    if (gb % ((long long)micro * dp)) return dt_fail(DT_EINPUT, "plan: dp %d does not divide the global batch", dp);
    const dt_dp_strategy *mode = dt_dp_candidate(&lc, zero);
    if (!mode) return dt_fail(DT_EINPUT, "plan: no data-parallel mode for ZeRO stage %d", zero);
    if (mode->sharded && dp * cp == 1) return dt_fail(DT_EINPUT, "plan: ZeRO needs several data-parallel ranks");
    if (strcmp(lc.offload.param, "none") && !mode->params_shard) /* even --any-feature: nothing to offload */
        return dt_fail(DT_EINPUT, "plan: offload.param needs a parameter shard (ZeRO-3)");
    int m = (int)(gb / ((long long)micro * dp));
    lc.parallel.sp = c->parallel.sp && tp > 1;
    lc.parallel.virtual_stages = 1;
    lc.parallel.pp_split[0] = 0;
    strcpy(lc.parallel.schedule, "1f1b");
    lc.log.sample_tokens = 0; /* what the trainer refuses for the layout itself, not for a sample */
    dt_layout run; /* what the trainer would run: its one check */
    DT_TRY(dt_layout_build(&run, &lc, mc->world));
    if (!mc->any_feature && dt_layout_check(&run, DT_CHECK_FEATURES) != DT_OK)
        return dt_fail(DT_EINPUT, "plan: dp %d pp %d cp %d tp %d does not run (dtrain train says why)", dp, pp, cp, tp);
    *out = (dt_plan_entry){.dp = dp, .pp = pp, .cp = cp, .tp = tp, .zero = zero, .m = m, .shard = shard,
                           .policy = policy};
    out->memory = dt_estimate_layout_bytes(&run);

    /* compute: the step's FLOPs spread evenly, at the rate of this rank's shard shape; a
     * pipeline waits (p-1) micro-batch slots; ranks sharing a node's cores each run slower */
    double tokens = (double)gb * T;
    out->compute_s = tokens * gpt_flops_per_token(&s, T) / mc->world / rate_of(mc, tp, cp);
    if (dt_layout_recompute(&run)) out->compute_s *= 4.0 / 3.0; /* each block's forward twice */
    out->bubble = pp > 1 ? (pp - 1.0) / (m + pp - 1.0) : 0.0;
    int node = mc->world < mc->ranks_per_node ? mc->world : mc->ranks_per_node;
    out->share = mc->cores > 0 && node > mc->cores ? (double)node / mc->cores : 1.0;
    double L = (double)s.n_layer / pp, C = s.n_embd, rows = (double)micro * T / cp;
    double f = dt_layout_bf16(&run) ? 2.0 : 4.0; /* bytes of an activation, a gradient, a gathered weight */
    for (int g = 0; g < DT_PLAN_NGROUPS; g++) out->intra[g] = dt_plan_group_intra(g, dp, pp, cp, tp, mc->ranks_per_node);
    /* a group across nodes shares its node's link with the node's other groups of its kind:
     * each group's ring crosses it once, so the link's bandwidth is divided among them */
    dt_link lks[DT_PLAN_NGROUPS];
    const dt_link *lk[DT_PLAN_NGROUPS];
    for (int g = 0; g < DT_PLAN_NGROUPS; g++) {
        int stride = g == DT_PLAN_TP ? 1 : g == DT_PLAN_CP ? tp : g == DT_PLAN_PP ? tp * cp : cp > 1 ? tp : tp * pp;
        lks[g] = out->intra[g] ? mc->intra
                               : crossing_link(mc, dt_plan_link_share(g, dp, pp, cp, tp, mc->ranks_per_node), stride);
        lk[g] = &lks[g];
    }
    if (tp > 1) { /* per block and micro-batch: 2 all-reduces forward, 2 backward, of the block's rows */
        double n = m * L * 4, bytes = n * 2.0 * (tp - 1) / tp * rows * C * f, msgs = n * 2.0 * (tp - 1);
        int r = gpt_kv_replicas(&s, tp);
        if (r > 1) { /* replicated key/value heads: their dk | dv over the r replicas, once per block backward */
            double nk = m * L, HS = C / s.n_head;
            bytes += nk * 2.0 * (r - 1) / r * rows * 2 * HS * f;
            msgs += nk * 2.0 * (r - 1);
        }
        out->comm_bytes[DT_PLAN_TP] = bytes;
        out->comm_s[DT_PLAN_TP] = link_time(lk[DT_PLAN_TP], msgs, bytes);
    }
    if (cp > 1) { /* per block and micro-batch: q, k, v blocks cp-1 times forward; backward again, with dk, dv cp times */
        double n = m * L * (3.0 * cp - 2), bytes = n * rows * 3 * C / tp * f;
        out->comm_bytes[DT_PLAN_CP] = bytes;
        out->comm_s[DT_PLAN_CP] = link_time(lk[DT_PLAN_CP], n, bytes);
    }
    if (pp > 1) { /* per micro-batch: the activation forward, its gradient back */
        double n = 2.0 * m, bytes = n * rows * C / (lc.parallel.sp ? tp : 1) * f;
        out->comm_bytes[DT_PLAN_PP] = bytes;
        out->comm_s[DT_PLAN_PP] = link_time(lk[DT_PLAN_PP], n, bytes);
    }
    int N = dp * cp;
    gpt_layout lay = {.tp = tp, .sp = run.sp, .recompute = dt_layout_recompute(&run)};
    /* a rank's parameters: its tp piece of the model, a pp-th of it per stage; ZeRO updates a shard */
    gpt_layout ul = dt_unit_layout(lc.parallel.unit_split, lc.parallel.unit_blocks, &s);
    double psi = (double)gpt_param_count_layout(&s, &lay) / pp, units = s.n_layer / pp * (ul.split_blocks ? 2 : 1) + 2;
    /* a policy's ddp units (the layout's check: pp, cp 1): whole on every rank of the dp
     * group (a tp piece of them), their gradients all-reduced when the stage reduces (once a
     * step, or per micro-batch) */
    size_t rp = 0, kp = 0;
    int ru = 0, ku = 0;
    gpt_layout pl = ul; /* the units' tp pieces */
    pl.tp = tp, pl.sp = run.sp;
    if (lc.parallel.policy[0])
        DT_TRY(dt_policy_replicated(lc.parallel.policy, zero, &s, &pl, &rp, &ru, &kp, &ku));
    /* the ddp units (psi_r), the zero2 units kept whole among zero3's (psi_k: a reduce-scatter
     * per micro-step, one gather a step), the rest (psi_s) */
    double psi_r = (double)rp, psi_k = (double)kp, psi_s = psi - psi_r - psi_k;
    const double *ring = mode->ring[pp > 1];
    double passes = ring[0] + ring[1] * m, passes_r = 2.0 * (ring[1] > 0 ? m : 1), passes_k = m + 1.0;
    out->optim_s = ((psi_s + psi_k) / (mode->sharded ? (shard ? shard : N) : 1) + psi_r) * mc->optim_s;
    if (shard) { /* the layout's check: cp 1 */
        hsdp_comm(mc, out, shard, passes, psi_s, psi_s / shard, f, units - ru - ku);
        if (ru) hsdp_comm(mc, out, shard, passes_r, psi_r, psi_r, f, ru);
        if (ku) hsdp_comm(mc, out, shard, passes_k, psi_k, psi_k / shard, f, ku);
    } else if (N > 1) { /* gradients over dp x cp, in ring passes of part each ((N-1) messages per unit),
                    as many as the mode makes (strategy.h); a pipeline gathers ZeRO-3's parameters once */
        double vol = (passes * psi_s + passes_r * psi_r + passes_k * psi_k) * (N - 1.0) / N * f;
        double msgs = (passes * (units - ru - ku) + passes_r * ru + passes_k * ku) * (N - 1);
        out->comm_bytes[DT_PLAN_DP] = vol;
        out->comm_s[DT_PLAN_DP] = link_time(lk[DT_PLAN_DP], msgs, vol);
    }
    /* what a node sends across its link: a ring spanning nodes crosses each node's link
     * once, so each crossing group sends one rank's volume (HSDP: hsdp_comm's) */
    for (int g = 0; g < DT_PLAN_NGROUPS; g++)
        if (!out->intra[g] && !(g == DT_PLAN_DP && shard))
            out->cross_bytes += out->comm_bytes[g] * dt_plan_link_share(g, dp, pp, cp, tp, mc->ranks_per_node);
    double piped = out->compute_s * (m + pp - 1.0) / m, shared = out->compute_s * out->share;
    out->step_s = (piped > shared ? piped : shared) + out->optim_s * out->share;
    for (int g = 0; g < DT_PLAN_NGROUPS; g++) out->step_s += out->comm_s[g];
    out->tokens_per_s = tokens / out->step_s;
    return DT_OK;
}

static int by_step(const void *a, const void *b) {
    const dt_plan_entry *x = a, *y = b;
    if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
    return x->memory < y->memory ? -1 : x->memory > y->memory;
}

/* The shard group sizes tried after k (0: none, then each divisor of dp between 1 and
 * dp; dp ends the loop): ZeRO stages only. */
static int next_shard(int zero, int dp, int k) {
    if (zero < 1) return dp;
    for (k = k < 2 ? 2 : k + 1; k < dp; k++)
        if (dp % k == 0) return k;
    return dp;
}

int dt_plan_all(const dt_config *c, const dt_machine *mc, dt_plan_entry *out, int cap) {
    int n = 0, W = mc->world;
    for (int tp = 1; tp <= W; tp++)
        for (int pp = 1; W % tp == 0 && pp <= W / tp; pp++)
            for (int cp = 1; (W / tp) % pp == 0 && cp <= W / tp / pp; cp++) {
                if ((W / tp / pp) % cp) continue;
                int dp = W / tp / pp / cp;
                for (int z = 0; z <= 3; z++)
                    for (int k = 0; k < dp && n < cap; k = next_shard(z, dp, k)) /* 0: one group; HSDP's */
                        /* the planner's policies: ZeRO stages of dp ranks alone (where the engine runs them) */
                        for (int p = 0; p < (z && !c->parallel.policy[0] && tp * pp * cp == 1 ? DT_PLAN_NPOLICIES : 1) &&
                                        n < cap; p++) {
                            dt_plan_entry e;
                            if (dt_plan_layout_policy(c, mc, dp, pp, cp, tp, z, k, p, &e) != DT_OK) {
                                dt_error_clear(); /* a layout that does not run: not an error of the plan */
                                continue;
                            }
                            if (mc->memory > 0 && e.memory > mc->memory) continue;
                            out[n++] = e;
                        }
            }
    qsort(out, (size_t)n, sizeof *out, by_step);
    return n;
}

/* Every layout of the world that runs: the best that fits (by_step) into *fit, the one
 * needing the least memory into *low; returns how many fit. */
static int scan(const dt_config *c, const dt_machine *mc, dt_plan_entry *fit, dt_plan_entry *low, int *runs) {
    int n = 0, W = mc->world;
    *runs = 0;
    for (int tp = 1; tp <= W; tp++)
        for (int pp = 1; W % tp == 0 && pp <= W / tp; pp++)
            for (int cp = 1; (W / tp) % pp == 0 && cp <= W / tp / pp; cp++) {
                if ((W / tp / pp) % cp) continue;
                int dp = W / tp / pp / cp;
                for (int z = 0; z <= 3; z++)
                    for (int k = 0; k < dp; k = next_shard(z, dp, k)) {
                        dt_plan_entry e;
                        if (dt_plan_layout_hsdp(c, mc, dp, pp, cp, tp, z, k, &e) != DT_OK) {
                            dt_error_clear();
                            continue;
                        }
                        if (low && (!*runs || e.memory < low->memory)) *low = e;
                        (*runs)++;
                        if (mc->memory > 0 && e.memory > mc->memory) continue;
                        if (fit && (!n || by_step(&e, fit) < 0)) *fit = e;
                        n++;
                    }
            }
    return n;
}

void dt_plan_advise(const dt_config *c, const dt_machine *mc, dt_plan_advice *a) {
    memset(a, 0, sizeof *a);
    int runs;
    scan(c, mc, NULL, &a->nearest, &a->runs);
    dt_plan_fix f;
    /* more ranks, the same memory each (uncalibrated shapes at the machine's one rate) */
    for (int w = mc->world + 1; w <= DT_PLAN_MAX_WORLD; w++) {
        dt_machine m2 = *mc;
        m2.world = w;
        if (mc->ranks_per_node >= mc->world) m2.ranks_per_node = w; /* one node: still one */
        if (scan(c, &m2, &f.best, NULL, &runs) > 0) {
            f.kind = DT_FIX_RANKS;
            f.value = w;
            a->fixes[a->nfixes++] = f;
            break;
        }
    }
    dt_config lc = *c;
    dt_layout base; /* the config's own choices */
    dt_layout_derive(&base, c, 0);
    if (!dt_layout_recompute(&base)) {
        strcpy(lc.train.recompute, "full");
        if (scan(&lc, mc, &f.best, NULL, &runs) > 0) {
            f.kind = DT_FIX_RECOMPUTE;
            f.value = 0;
            a->fixes[a->nfixes++] = f;
        }
    }
    lc = *c; /* the micro-batch the layouts run (parallel.micro_batches may set it per layout) */
    int micro = lc.train.micro_batch;
    if (dt_config_resolve_micro_batch(&lc, mc->world) == DT_OK) micro = lc.train.micro_batch;
    dt_error_clear();
    for (int mb = micro - 1; mb >= 1; mb--) {
        lc = *c;
        lc.parallel.micro_batches = 0;
        lc.train.micro_batch = mb;
        if (scan(&lc, mc, &f.best, NULL, &runs) > 0) {
            f.kind = DT_FIX_MICRO;
            f.value = mb;
            a->fixes[a->nfixes++] = f;
            break;
        }
    }
    if (!dt_layout_bf16(&base)) {
        lc = *c;
        strcpy(lc.precision, "bf16");
        if (scan(&lc, mc, &f.best, NULL, &runs) > 0) {
            f.kind = DT_FIX_BF16;
            f.value = 0;
            a->fixes[a->nfixes++] = f;
        }
    }
    if (a->nfixes == 0 || (a->nfixes == 1 && a->fixes[0].kind == DT_FIX_RANKS)) { /* no one change here: all of them */
        lc = *c;
        strcpy(lc.train.recompute, "full");
        strcpy(lc.precision, "bf16");
        lc.parallel.micro_batches = 0;
        lc.train.micro_batch = 1;
        if (scan(&lc, mc, &f.best, NULL, &runs) > 0) {
            f.kind = DT_FIX_ALL;
            f.value = 1;
            a->fixes[a->nfixes++] = f;
        }
    }
    /* ZeRO-Offload: the optimizer state in host memory (on the CPU backend that is the
     * same memory, so the estimator's budget does not shrink and it is not suggested);
     * ZeRO-Infinity: the optimizer state and ZeRO-3's parameter shard in files */
    int here = a->nfixes > 0 && a->fixes[0].kind == DT_FIX_RANKS; /* fixes at this world, so far */
    here = a->nfixes > here;
    lc = *c;
    if (!strcmp(lc.offload.optimizer, "none")) {
        strcpy(lc.offload.optimizer, "cpu");
        if (scan(&lc, mc, &f.best, NULL, &runs) > 0) {
            f.kind = DT_FIX_OFFLOAD_CPU;
            f.value = 0;
            a->fixes[a->nfixes++] = f;
        }
    }
    lc = *c;
    if (strcmp(lc.offload.optimizer, "nvme") || strcmp(lc.offload.param, "nvme")) {
        strcpy(lc.offload.optimizer, "nvme");
        strcpy(lc.offload.param, "nvme");
        if (scan(&lc, mc, &f.best, NULL, &runs) > 0) {
            f.kind = DT_FIX_OFFLOAD_NVME;
            f.value = 0;
            a->fixes[a->nfixes++] = f;
        }
    }
    a->only_offload = !here && a->nfixes > 0 && a->fixes[a->nfixes - 1].kind >= DT_FIX_OFFLOAD_CPU;
}

/* A fix as the arguments that give it to plan (and train) */
static void fix_args(const dt_plan_fix *x, char *buf, size_t cap) {
    switch (x->kind) {
    case DT_FIX_RANKS: snprintf(buf, cap, "-n %d", x->value); break;
    case DT_FIX_RECOMPUTE: snprintf(buf, cap, "--set train.recompute=full"); break;
    case DT_FIX_MICRO: snprintf(buf, cap, "--set train.micro_batch=%d", x->value); break;
    case DT_FIX_BF16: snprintf(buf, cap, "--set precision=bf16"); break;
    case DT_FIX_OFFLOAD_CPU: snprintf(buf, cap, "--set offload.optimizer=cpu"); break;
    case DT_FIX_OFFLOAD_NVME: snprintf(buf, cap, "--set offload.optimizer=nvme --set offload.param=nvme"); break;
    default: snprintf(buf, cap, "--set train.recompute=full --set train.micro_batch=1 --set precision=bf16"); break;
    }
}

static const char *const fix_key[DT_FIX_N] = {"ranks", "recompute", "micro_batch", "bf16", "all", "offload_cpu",
                                               "offload_nvme"};

static void layout_name(const dt_plan_entry *x, char *buf, size_t cap) {
    static const char *const repl[DT_PLAN_NPOLICIES] = {"", " ddp:emb", " ddp:ln_f", " ddp:emb,ln_f"};
    snprintf(buf, cap, "dp%d pp%d cp%d tp%d z%d", x->dp, x->pp, x->cp, x->tp, x->zero);
    size_t n = strlen(buf);
    if (x->shard && n < cap) snprintf(buf + n, cap - n, " s%d", x->shard);
    n = strlen(buf);
    if (n < cap) snprintf(buf + n, cap - n, "%s", repl[x->policy]);
}

static const char *policy_of(const dt_plan_entry *x) { /* a planner's policy; "" for the config's own (index 0) */
    return dt_plan_policies[x->policy];
}

static void layout_json(FILE *f, const dt_plan_entry *x) {
    fprintf(f, "{\"dp\": %d, \"pp\": %d, \"cp\": %d, \"tp\": %d, \"zero\": %d, \"dp_shard\": %d, \"policy\": \"%s\", "
            "\"m\": %d, \"memory\": %.0f, \"step_s\": %.6g, \"tokens_per_s\": %.6g}", x->dp, x->pp, x->cp, x->tp,
            x->zero, x->shard, policy_of(x), x->m, x->memory, x->step_s, x->tokens_per_s);
}

void dt_plan_print_advice(FILE *f, const dt_plan_advice *a, const dt_machine *mc, int json) {
    char args[96], lay[64];
    if (json) {
        fprintf(f, "{\"fits\": false, \"world\": %d, \"budget\": %.0f, \"nearest\": ", mc->world, mc->memory);
        if (a->runs) layout_json(f, &a->nearest);
        else fprintf(f, "null");
        fprintf(f, ", \"suggestions\": [");
        for (int i = 0; i < a->nfixes; i++) {
            const dt_plan_fix *x = &a->fixes[i];
            fix_args(x, args, sizeof args);
            fprintf(f, "%s{\"change\": \"%s\", \"args\": \"%s\", ", i ? ", " : "", fix_key[x->kind], args);
            if (x->kind == DT_FIX_RANKS || x->kind == DT_FIX_MICRO) fprintf(f, "\"value\": %d, ", x->value);
            fprintf(f, "\"layout\": ");
            layout_json(f, &x->best);
            fprintf(f, "}");
        }
        fprintf(f, "], \"only_offload\": %s, \"max_world\": %d}\n", a->only_offload ? "true" : "false",
                DT_PLAN_MAX_WORLD);
        return;
    }
    if (!a->runs) {
        fprintf(f, "no layout of %d ranks runs this model (divisibility: heads, vocabulary, batch, blocks)\n",
                mc->world);
    } else {
        layout_name(&a->nearest, lay, sizeof lay);
        fprintf(f, "nearest: %s needs %.1f MB per rank, %.1f MB over the budget of %.1f MB (every ZeRO stage "
                "tried)\n", lay, a->nearest.memory / 1e6, (a->nearest.memory - mc->memory) / 1e6, mc->memory / 1e6);
    }
    for (int i = 0; i < a->nfixes; i++) {
        const dt_plan_fix *x = &a->fixes[i];
        fix_args(x, args, sizeof args);
        layout_name(&x->best, lay, sizeof lay);
        const char *why = x->kind == DT_FIX_RANKS ? "the fewest ranks that fit"
                          : x->kind == DT_FIX_RECOMPUTE ? "activations recomputed in backward, 4/3 the compute"
                          : x->kind == DT_FIX_MICRO ? "the largest micro-batch that fits, more accumulation steps"
                          : x->kind == DT_FIX_BF16  ? "bf16 weights and activations, fp32 master weights"
                          : x->kind == DT_FIX_ALL   ? "no one of them alone fits"
                          : x->kind == DT_FIX_OFFLOAD_CPU
                              ? "ZeRO-Offload: fp32 master weights and AdamW moments in host memory"
                              : "ZeRO-Infinity: optimizer state and ZeRO-3's parameter shard in files; set "
                                "offload.nvme_path too";
        fprintf(f, "fits with %s (%s): %s, %.1f MB per rank\n", args, why, lay, x->best.memory / 1e6);
    }
    if (a->only_offload)
        fprintf(f, "only offload fits on %d rank%s: train.recompute=full, a smaller micro-batch and bf16 do not, "
                "alone or together (docs/offload.md)\n", mc->world, mc->world > 1 ? "s" : "");
    if (!a->nfixes)
        fprintf(f, "nothing fits with more ranks (up to %d), train.recompute=full, a smaller micro-batch or bf16, "
                "alone or together, nor with the optimizer state in host memory or the optimizer state and the "
                "parameters on NVMe\n", DT_PLAN_MAX_WORLD);
}

void dt_plan_print(FILE *f, const dt_plan_entry *e, int n, int json) {
    static const char *gn[DT_PLAN_NGROUPS] = {"tp", "cp", "pp", "dp"};
    if (!json)
        fprintf(f, "%-4s %-34s %4s %10s %7s %9s %9s %9s %9s %9s %10s\n", "#", "layout", "m", "memory MB", "bubble",
                "tp ms", "cp ms", "pp ms", "dp ms", "step ms", "tokens/s");
    for (int i = 0; i < n; i++) {
        const dt_plan_entry *x = &e[i];
        if (json) {
            fprintf(f, "{\"dp\": %d, \"pp\": %d, \"cp\": %d, \"tp\": %d, \"zero\": %d, \"dp_shard\": %d, "
                    "\"policy\": \"%s\", \"m\": %d, \"memory\": %.0f, \"bubble\": %.4f, \"compute_s\": %.6g, "
                    "\"share\": %.4g, \"optim_s\": %.6g, \"step_s\": %.6g, \"tokens_per_s\": %.6g, \"cross_bytes\": %.0f",
                    x->dp, x->pp, x->cp, x->tp, x->zero, x->shard, policy_of(x), x->m, x->memory, x->bubble,
                    x->compute_s, x->share, x->optim_s, x->step_s, x->tokens_per_s, x->cross_bytes);
            for (int g = 0; g < DT_PLAN_NGROUPS; g++)
                fprintf(f, ", \"%s_bytes\": %.0f, \"%s_s\": %.6g, \"%s_intra\": %s", gn[g], x->comm_bytes[g], gn[g],
                        x->comm_s[g], gn[g], x->intra[g] ? "true" : "false");
            fprintf(f, "}\n");
            continue;
        }
        char lay[64];
        layout_name(x, lay, sizeof lay);
        fprintf(f, "%-4d %-34s %4d %10.1f %7.3f %9.2f %9.2f %9.2f %9.2f %9.2f %10.0f\n", i + 1, lay, x->m,
                x->memory / 1e6, x->bubble, 1e3 * x->comm_s[DT_PLAN_TP], 1e3 * x->comm_s[DT_PLAN_CP],
                1e3 * x->comm_s[DT_PLAN_PP], 1e3 * x->comm_s[DT_PLAN_DP], 1e3 * x->step_s, x->tokens_per_s);
    }
}
