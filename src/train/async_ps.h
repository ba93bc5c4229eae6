/* The asynchronous parameter server (parallel.dp_mode ps-async; docs/parallelism.md,
 * "Asynchronous parameter server"): data-parallel rank 0 serves, the other ranks work.
 * The run's data is cut into tasks, N per global batch (N = the data-parallel size): task
 * k is the rows data-parallel rank k mod N would train in global step k / N. A worker
 * asks for a task, gets it with the newest weights, computes the task's gradient (the
 * mean over its tokens) and sends it back; the server applies each gradient as it
 * arrives, one AdamW update per task (the learning rate of the task's global step), and
 * answers with the next task. No rank waits for the slowest: a fast worker takes more
 * tasks. The staleness bound s (parallel.staleness) makes a worker wait while the server
 * is more than s updates past the weights of the oldest task still in progress, so no
 * gradient trails far behind; s = 0 runs the synchronous central rank instead (dp_mode
 * ps, bit for bit). The server writes a metrics line every N updates (a global step's
 * worth of data); at the end, and at each checkpoint or validation step, every update so
 * far is applied and every rank gets the server's weights. Nondeterministic by
 * nature (the order of arrivals), except in its fixed mode (bitwise determinism): task t
 * is handed out at update max(0, t - s) of the run exactly and the gradients are applied in
 * task order (an early one waits in a buffer), so the run is delayed SGD with a fixed
 * delay of s tasks: the same weights whatever the workers' speed, a straggler included. */
#ifndef DT_ASYNC_PS_H
#define DT_ASYNC_PS_H
#include "../comm/comm.h"
#include "../parallel/parallelize.h"

/* What the server reports per global step (every N updates). */
typedef struct {
    long long step;
    double loss, lr, grad_norm; /* the loss over the step's tasks' tokens; the last update's rate and norm */
    double seconds, tokens;     /* since the last report */
    double staleness_mean;      /* updates between a gradient's weights and its application, over the step */
    int staleness_max;
} dt_async_step;

typedef struct {
    dt_par *par;
    dt_comm *comm;     /* the data-parallel group (rank 0 serves) */
    long long last;    /* the run's last global step (train.steps): no task past it */
    int staleness;     /* the bound s >= 1 */
    int inverse_lr;    /* parallel.staleness_lr inverse: each update's rate over its gradient's staleness (>= 1) */
    int fixed;         /* parallel.determinism bitwise: task t computed at the weights of update t - s exactly,
                          updates applied in task order (reproducible, whatever the workers' speed) */
    dt_par_fill fill;  /* the rows of the loader's current global batch */
    void *ctx;
    void (*seek)(void *ctx, long long step); /* the loader to global step `step`'s batch (never backwards) */
    void (*report)(void *ctx, const dt_async_step *s); /* the server's, per global step */
    int (*stopping)(void *ctx); /* the server's: hand out no new step (a signal) */
} dt_async_opts;

typedef struct dt_async_ps dt_async_ps;

/* Its buffers, allocated once (collective over o->comm: every rank agrees). */
dt_status dt_async_ps_create(dt_async_ps **out, const dt_async_opts *o);
void dt_async_ps_free(dt_async_ps *ps);
/* Global steps at .. stop - 1 (collective over comm); *steps: those done (fewer after a
 * signal: the run is then at `at + *steps`). The run stops at a global step's boundary,
 * every update before it applied and none after: a checkpoint or a validation may follow.
 * In the fixed order the tasks of the next s updates are handed out ahead, as the run
 * without the stop would, and their gradients wait on the server (its rank state), so
 * stopping, saving and resuming does not change the run. Every rank ends with the
 * server's weights. */
dt_status dt_async_ps_run(dt_async_ps *ps, long long at, long long stop, long long *steps, double *seconds,
                          double *tokens);
/* The server's gradients waiting for their turn (fixed order) as this rank's checkpoint
 * state (ckpt/rank_state.h; workers write none), and back; a checkpoint without rank
 * state (another mode's) starts with none. ps: the dt_async_ps (dt_par_rank_state's hooks). */
dt_status dt_async_ps_save(void *ps, const char *dir, long long step, int rank, const char *layout);
dt_status dt_async_ps_load(void *ps, const char *step_dir, long long step, int rank, const char *layout);

#endif
