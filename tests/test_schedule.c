/* Pipeline schedules as data, checked symbolically: every generated plan for p <= 8,
 * v <= 4, m <= 32 runs to the end on every rank (no deadlock, every receive matched, every
 * (micro-batch, chunk) F before its B before its W exactly once), with the in-flight
 * activations each schedule promises (GPipe m, 1F1B and zb-h1 at most p micro-batches of
 * a stage) and the bubble of its formula (GPipe, 1F1B, interleaved exactly with equal
 * stage costs; zb-h1 below 1F1B's), and activation slots (dt_schedule_slots) exactly as
 * many as the passes in flight. A damaged plan (two operations swapped, a receive
 * dropped) is caught. Prints the p = 4, m = 8 drawings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parallel/model_parallel/pipeline.h"
#include "parallel/model_parallel/schedule.h"

int main(void) {
    dt_schedule s;
    CHECK(dt_schedule_parse("1f1b", &s) == DT_OK && s == DT_SCHED_1F1B, "parse 1f1b");
    CHECK(dt_schedule_parse("zb-h1", &s) == DT_OK && s == DT_SCHED_ZBH1, "parse zb-h1");
    CHECK(dt_schedule_parse("pipedream", &s) == DT_EINPUT, "unknown schedule");
    CHECK(dt_schedule_check(DT_SCHED_INTERLEAVED, 4, 2, 6) == DT_EINPUT, "interleaved: m %% p");
    CHECK(dt_schedule_check(DT_SCHED_INTERLEAVED, 4, 1, 8) == DT_EINPUT, "interleaved: v >= 2");
    CHECK(dt_schedule_check(DT_SCHED_1F1B, 4, 2, 8) == DT_EINPUT, "v > 1 without interleaving");

    int plans = 0, worst_formula = 0;
    double zb_vs_1f1b = 0; /* largest zb-h1 bubble / 1F1B bubble */
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 32; m++)
            for (int si = 0; si < DT_SCHED_N; si++)
                for (int v = 1; v <= 4; v++) {
                    dt_schedule sc = (dt_schedule)si;
                    if (dt_schedule_check(sc, p, v, m) != DT_OK) continue;
                    dt_sim_result r, ref;
                    dt_status st = dt_schedule_simulate(sc, p, v, m, 1.0, 2.0, 1.0, &r);
                    plans++;
                    CHECK(st == DT_OK, "%s p %d v %d m %d runs", dt_schedule_name(sc), p, v, m);
                    if (st != DT_OK) continue;
                    int bad = 0;
                    for (int k = 0; k < p; k++) {
                        int peak = r.peak_inflight[k];
                        if (sc == DT_SCHED_GPIPE) bad |= peak != m;
                        if (sc == DT_SCHED_1F1B) bad |= peak != (m < p - k ? m : p - k);
                        if (sc == DT_SCHED_ZBH1) bad |= peak > p || peak > m;
                        if (sc == DT_SCHED_INTERLEAVED) { /* Megatron's warm-up plus the one in steady state */
                            int warm = (p - k - 1) * 2 + (v - 1) * p;
                            bad |= peak > (warm < m * v ? warm + 1 : m * v);
                        }
                    }
                    CHECK(!bad, "%s p %d v %d m %d: in-flight %d %d ...", dt_schedule_name(sc), p, v, m,
                          r.peak_inflight[0], r.peak_inflight[p > 1 ? 1 : 0]);
                    /* activation slots (a pass holds one from its first operation to its
                     * last, and the runner's waits on earlier sends never deadlock): as
                     * many as the passes in flight, no more */
                    for (int k = 0; k < p; k++) {
                        int n = dt_schedule_slots(sc, p, v, m, k, NULL);
                        CHECK(n == r.peak_inflight[k] && dt_pp_slots(sc, p, v, k, m) == n,
                              "%s p %d v %d m %d rank %d: %d slots for %d in flight (dt_pp_slots %d)",
                              dt_schedule_name(sc), p, v, m, k, n, r.peak_inflight[k], dt_pp_slots(sc, p, v, k, m));
                    }
                    if (sc != DT_SCHED_ZBH1) {
                        double f = dt_schedule_bubble_formula(sc, p, v, m, 1.0, 2.0, 1.0);
                        if (fabs(r.bubble - f) > 1e-9) {
                            worst_formula++;
                            fprintf(stderr, "%s p %d v %d m %d: bubble %.4f, formula %.4f\n", dt_schedule_name(sc), p,
                                    v, m, r.bubble, f);
                        }
                    } else if (p > 1 &&
                               dt_schedule_simulate(DT_SCHED_1F1B, p, 1, m, 1.0, 2.0, 1.0, &ref) == DT_OK) {
                        if (r.bubble / ref.bubble > zb_vs_1f1b) zb_vs_1f1b = r.bubble / ref.bubble;
                        CHECK(r.bubble < ref.bubble, "zb-h1 p %d m %d: bubble %.4f not below 1F1B's %.4f", p, m,
                              r.bubble, ref.bubble);
                    }
                }
    CHECK(worst_formula == 0, "%d plans off their bubble formula", worst_formula);
    printf("%d plans checked; zb-h1's bubble at most %.2f of 1F1B's\n", plans, zb_vs_1f1b);

    /* damaged plans are caught: a rank's first two operations swapped (a receive after the
     * compute that needs it), a receive dropped (a send nobody takes) */
    int cap = dt_schedule_max_ops(1, 4), lens[4];
    dt_pp_op *all = malloc((size_t)4 * cap * sizeof *all), *pl[4];
    for (int r = 0; r < 4; r++) {
        pl[r] = all + (size_t)r * cap;
        lens[r] = dt_schedule_ops(DT_SCHED_1F1B, 4, 1, 4, r, pl[r]);
    }
    dt_sim_result r;
    CHECK(dt_plan_simulate("1f1b", pl, lens, 4, 1, 4, 0, 1, 2, 1, &r) == DT_OK, "the intact plan runs");
    dt_pp_op t = pl[1][0];
    pl[1][0] = pl[1][1];
    pl[1][1] = t;
    CHECK(dt_plan_simulate("1f1b", pl, lens, 4, 1, 4, 0, 1, 2, 1, &r) == DT_ERUNTIME, "F before its receive");
    pl[1][1] = pl[1][0];
    pl[1][0] = t;
    int at = -1;
    for (int i = 0; i < lens[2] && at < 0; i++)
        if (pl[2][i].kind == DT_OP_RECV_GRAD) at = i;
    memmove(&pl[2][at], &pl[2][at + 1], (size_t)(lens[2] - at - 1) * sizeof(dt_pp_op));
    lens[2]--;
    CHECK(dt_plan_simulate("1f1b", pl, lens, 4, 1, 4, 0, 1, 2, 1, &r) == DT_ERUNTIME, "a dropped receive");
    /* a circular wait: every rank receives before anything is sent */
    dt_pp_op ring[2][1] = {{{DT_OP_RECV_GRAD, 0, 0, 1}}, {{DT_OP_RECV_ACT, 0, 0, 0}}};
    dt_pp_op *rp[2] = {ring[0], ring[1]};
    int rl[2] = {1, 1};
    CHECK(dt_plan_simulate("ring", rp, rl, 2, 1, 1, 0, 1, 2, 1, &r) == DT_ERUNTIME, "deadlock found");
    free(all);

    char buf[4096];
    for (int si = 0; si < DT_SCHED_N; si++) {
        int v = si == DT_SCHED_INTERLEAVED ? 2 : 1;
        dt_sim_result q;
        CHECK(dt_schedule_draw((dt_schedule)si, 4, v, 8, buf, sizeof buf) == DT_OK, "draw");
        CHECK(dt_schedule_simulate((dt_schedule)si, 4, v, 8, 1, 2, 1, &q) == DT_OK, "simulate");
        printf("%s, p 4, v %d, m 8: bubble %.3f (formula %.3f), peak in-flight %.1f micro-batches\n%s",
               dt_schedule_name((dt_schedule)si), v, q.bubble,
               dt_schedule_bubble_formula((dt_schedule)si, 4, v, 8, 1, 2, 1), q.peak_stages, buf);
    }
    return check_finish();
}
