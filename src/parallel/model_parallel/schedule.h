/* Pipeline schedules as data (docs/parallelism.md, "Pipeline parallelism"; Qi et al.
 * 2023 for zero bubble). A schedule is, for each pipeline rank, the ordered list of what
 * it does in one optimizer step: forward (F), backward (B: the input gradient, the weight gradient too unless split),
 * weight gradient (W, zero-bubble only), and the sends and receives of activations and
 * gradients between stages. One runner executes any list; the simulator below runs every
 * rank's list symbolically (no model, no MPI), so a schedule is checked before it trains.
 *
 * Model chunks: with p ranks and v virtual stages per rank the layers form p·v chunks in
 * order; rank r holds chunks r, r + p, ..., r + (v-1)·p (Megatron's interleaving), local
 * chunk k being global chunk k·p + r. Micro-batches are 0..m-1.
 *
 * Semantics of the simulator: a send never blocks; a receive blocks until the matching
 * send was issued. The runner's sends complete only when received; it reuses a slot's
 * buffers after waiting on their earlier sends, where dt_schedule_slots made sure that
 * wait cannot deadlock. */
#ifndef DT_SCHEDULE_H
#define DT_SCHEDULE_H
#include <stddef.h>

#include "../../core/status.h"

typedef enum { DT_SCHED_GPIPE, DT_SCHED_1F1B, DT_SCHED_INTERLEAVED, DT_SCHED_ZBH1, DT_SCHED_N } dt_schedule;

typedef enum {
    DT_OP_F,         /* forward of (mb, chunk) */
    DT_OP_B,         /* backward: input gradient (and weight gradient unless the schedule has W) */
    DT_OP_W,         /* weight gradient of (mb, chunk) */
    DT_OP_SEND_ACT,  /* chunk's output activation to the next chunk's rank */
    DT_OP_RECV_ACT,  /* chunk's input activation from the previous chunk's rank */
    DT_OP_SEND_GRAD, /* gradient of chunk's input to the previous chunk's rank */
    DT_OP_RECV_GRAD, /* gradient of chunk's output from the next chunk's rank */
    DT_OP_N
} dt_op_kind;

typedef struct {
    dt_op_kind kind;
    int mb;    /* micro-batch */
    int chunk; /* local chunk index, 0..v-1 */
    int peer;  /* sends and receives: the other pipeline rank */
} dt_pp_op;

/* "gpipe", "1f1b", "interleaved", "zb-h1". */
dt_status dt_schedule_parse(const char *name, dt_schedule *out);
const char *dt_schedule_name(dt_schedule s);
/* Whether (p, v, m) suit the schedule; DT_EINPUT with one line naming the rule if not:
 * p >= 1, m >= 1; v = 1 except for interleaved, which needs v >= 2 and m divisible by p
 * (its micro-batches go round in groups of p). */
dt_status dt_schedule_check(dt_schedule s, int p, int v, int m);
/* Most operations one rank's list can hold (sizes the caller's array). */
int dt_schedule_max_ops(int v, int m);
/* Rank r's list, in order; returns its length. (p, v, m) must pass dt_schedule_check. */
int dt_schedule_ops(dt_schedule s, int p, int v, int m, int r, dt_pp_op *ops);
/* Whether the schedule splits the backward into B and W. */
int dt_schedule_splits_backward(dt_schedule s);

/* Every rank's list run symbolically: each F costs t_f, B t_b (t_b + t_w when the
 * schedule does not split the backward), W t_w, per chunk (a chunk is 1/v of a stage);
 * communication is free. Fails (DT_ERUNTIME naming the rank and operation) on a deadlock,
 * a receive without its send, an operation out of order (a chunk's F before its B before
 * its W; every (mb, chunk) exactly once each) or a send that nothing receives. */
typedef struct {
    double makespan;       /* time until the last rank finishes */
    double bubble;         /* 1 - (busy time of all ranks) / (p · makespan) */
    int peak_inflight[64]; /* per rank: most chunks whose F ran and whose backward (W when split) did not */
    double peak_stages;    /* the largest peak_inflight / v over ranks: in-flight micro-batches of a whole stage */
} dt_sim_result;
dt_status dt_schedule_simulate(dt_schedule s, int p, int v, int m, double t_f, double t_b, double t_w,
                               dt_sim_result *out);
/* The same for any lists (plans[r], lens[r] operations for rank r; split: the backward is
 * B + W), so a hand-made or damaged plan can be checked too. */
dt_status dt_plan_simulate(const char *name, dt_pp_op *const *plans, const int *lens, int p, int v, int m,
                           int split, double t_f, double t_b, double t_w, dt_sim_result *out);
/* The schedule's textbook bubble fraction (equal costs per stage): GPipe and 1F1B
 * (p-1)/(m+p-1); interleaved (p-1)/(v·m+p-1); zb-h1: (p-1)·(t_f+t_b-t_w) over
 * m·(t_f+t_b+t_w) + that (the paper's estimate). */
double dt_schedule_bubble_formula(dt_schedule s, int p, int v, int m, double t_f, double t_b, double t_w);
/* Activation slots of rank r's list (schedule s, p, v, m): each chunk pass holds one from
 * its first operation to its last, the lowest free one whose previous pass's sends were
 * certainly received (happens-before over every rank's list) before the new pass
 * overwrites what they send: its output in the forward, its residual gradient at the
 * gradient's receive (the head: in the forward's loss). A send's buffer is then free
 * once received, so the runner's waits on earlier sends never wait on a receive that
 * waits on this rank: no deadlock, with sends that complete only when received (MPI's
 * rendezvous), and no copies. op_slot[i] (NULL: not wanted) = operation i's slot.
 * Returns the slots used, -1 if (p, v, m) do not suit s or memory ran out. */
int dt_schedule_slots(dt_schedule s, int p, int v, int m, int r, int *op_slot);

/* A text drawing of the schedule (one line per rank, one character per time unit of
 * t_f = 1, t_b = 2, or 1 + t_w 1 when split, per chunk pass): a forward is the
 * micro-batch's digit, its backward the letter (0: a, 1: b, ...), a W the capital, '.'
 * idle. */
dt_status dt_schedule_draw(dt_schedule s, int p, int v, int m, char *buf, size_t cap);

#endif
