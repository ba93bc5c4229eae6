#include "local_sgd.h"

#include <stdlib.h>
#include <string.h>

#include "../../ckpt/rank_state.h"
#include "../../comm/outer_link.h"
#include "../../core/mem.h"
#include "../../core/timer.h"

struct dt_local_sgd {
    dt_comm *replicas;
    dt_comm *group; /* the replica's own ranks (dp_shard > 1; NULL: one) */
    dt_dp *inner;
    size_t n, part; /* the model's parameters; each of the replica's k ranks' slice of them */
    int k, i;       /* the replica's ranks, this one's index among them */
    int R, diloco, every;
    long long last_step;
    float outer_lr, mu;
    float *theta;  /* the synchronised weights (fp32) */
    float *delta;  /* this replica's change, then the mean over the replicas */
    float *mom;    /* DiLoCo's outer momentum (NULL: local SGD) */
    int have_sync; /* theta holds the weights of the last synchronisation */
    dt_outer_link link; /* replicas as separate jobs: to the launcher's outer server (fd -1: none) */
    double seconds, sent;
};

dt_status dt_local_sgd_check(const dt_layout *L) {
    const dt_config *c = &L->cfg;
    if (L->jobs.n > 1 && !dt_layout_local_sgd(L))
        return dt_fail(DT_EINPUT, "dtrain launch --replicas: the replicas meet every parallel.sync_every steps; set "
                       "parallel.sync local_sgd or diloco (it is %s, every %d)", c->parallel.sync,
                       c->parallel.sync_every);
    if (L->jobs.n > 1 && L->world > 0 && L->dp % L->jobs.n)
        return dt_fail(DT_EINPUT, "dtrain launch --replicas %d: the %d data-parallel ranks do not split into %d "
                       "replicas", L->jobs.n, L->dp, L->jobs.n);
    if (L->jobs.n > 1 && c->parallel.dp_shard > 0 && c->parallel.dp_shard != L->dp_shard)
        return dt_fail(DT_EINPUT, "dtrain launch --replicas %d: each replica is a job of %d data-parallel ranks; "
                       "parallel.dp_shard %d says otherwise (leave it 0)", L->jobs.n, L->dp_shard,
                       c->parallel.dp_shard);
    if (!dt_layout_local_sgd(L)) return DT_OK;
    const char *mode = c->parallel.sync;
    if (L->world > 0 && L->dp_replicas < 2)
        return dt_fail(DT_EINPUT, "parallel.sync %s needs several data-parallel replicas (dp %d, parallel.dp_shard "
                       "%d ranks per replica)", mode, L->dp, L->dp_shard);
    if (dt_layout_ps(L))
        return dt_fail(DT_EINPUT, "parallel.sync %s: each replica runs DDP inside (not dp_mode ps)", mode);
    if (dt_layout_zero_enabled(L))
        return dt_fail(DT_EINPUT, "parallel.sync %s: each replica runs DDP inside (ZeRO within a replica: not yet; "
                       "parallel.zero is %d)", mode, L->zero);
    if (L->comm_backend == DT_COMM_NCCL)
        return dt_fail(DT_EINPUT, "parallel.sync %s: the synchronisation runs on the host (comm.backend mpi)", mode);
    if (!strcmp(c->data.layout, "budget"))
        return dt_fail(DT_EINPUT, "parallel.sync %s: data.layout budget is not carried (use stream, pack or pad)",
                       mode);
    if (L->sync == DT_SYNC_DILOCO && c->parallel.outer_lr <= 0)
        return dt_fail(DT_EINPUT, "parallel.outer_lr must be > 0 for diloco");
    return DT_OK;
}

dt_status dt_local_sgd_create(dt_local_sgd **out, const dt_layout *L, dt_comm *replicas, dt_comm *group, dt_dp *inner,
                              size_t n, long long last_step, int slot) {
    dt_local_sgd *s = calloc(1, sizeof *s);
    *out = s;
    if (!s) return dt_fail(DT_ERUNTIME, "out of memory (local SGD)");
    const dt_config *c = &L->cfg;
    s->replicas = replicas;
    s->inner = inner;
    s->n = n;
    s->group = group;
    s->k = group ? dt_comm_size(group) : 1;
    s->i = group ? dt_comm_rank(group) : 0;
    s->part = (n + (size_t)s->k - 1) / (size_t)s->k;
    size_t len = s->part * (size_t)s->k; /* padded to k slices: the padding stays 0 */
    s->R = dt_comm_size(replicas);
    s->diloco = L->sync == DT_SYNC_DILOCO;
    s->every = c->parallel.sync_every;
    s->last_step = last_step;
    s->outer_lr = (float)c->parallel.outer_lr;
    s->mu = (float)c->parallel.outer_momentum;
    dt_status st = dt_alloc((void **)&s->theta, len * sizeof(float), "local SGD: synchronised weights");
    if (st == DT_OK) st = dt_alloc((void **)&s->delta, len * sizeof(float), "local SGD: the replicas' change");
    if (st == DT_OK && s->diloco) st = dt_alloc((void **)&s->mom, len * sizeof(float), "DiLoCo: outer momentum");
    for (size_t i = s->n; st == DT_OK && i < len; i++) s->theta[i] = s->delta[i] = 0.0f;
    for (size_t i = 0; st == DT_OK && s->mom && i < len; i++) s->mom[i] = 0.0f;
    s->link.fd = -1;
    if (st == DT_OK && L->jobs.n > 1) /* a job of one replica; slot: this rank in it */
        st = dt_outer_connect(&s->link, L->jobs.addr, L->jobs.me, slot, 60.0);
    return dt_comm_agree(replicas, st, NULL);
}

void dt_local_sgd_free(dt_local_sgd *s) {
    if (!s) return;
    dt_free(s->theta);
    dt_free(s->delta);
    dt_free(s->mom);
    dt_outer_close(&s->link);
    free(s);
}

dt_status dt_local_sgd_before_step(dt_local_sgd *s) {
    if (s->have_sync) return DT_OK;
    DT_TRY(dt_dp_get_weights(s->inner, s->theta)); /* initialised or loaded alike on every replica */
    s->have_sync = 1;
    return DT_OK;
}

int dt_local_sgd_syncs_at(const dt_local_sgd *s, long long step) {
    return step % s->every == 0 || step == s->last_step;
}

/* A replica of k ranks (which hold the same weights) splits the work: rank i averages
 * and steps slice i only, over its peers in the other replicas, and the replica's ranks
 * then gather the slices over their own (fast) link; the slow link carries the model
 * once per replica, not k times. */
static dt_status gather_slices(dt_local_sgd *s, float *x) {
    if (s->k == 1) return DT_OK;
    DT_TRY(dt_allgather(s->group, x + s->part * (size_t)s->i, s->delta, s->part, DT_F32));
    memcpy(x, s->delta, s->n * sizeof(float));
    return DT_OK;
}

dt_status dt_local_sgd_join(dt_local_sgd *s, long long step, long long *at) {
    *at = step;
    if (s->link.fd < 0) return DT_OK;
    DT_TRY(dt_dp_get_weights(s->inner, s->theta));
    size_t lo = s->part * (size_t)s->i; /* the slice with its padding (zeros, which stay zeros) */
    /* replica 0 brings the weights (initialised or loaded); the others take the server's */
    long long mine = s->link.replica == 0 ? step : -1;
    DT_TRY(dt_outer_join(&s->link, mine, s->theta + lo, s->mom ? s->mom + lo : NULL, s->part, at));
    DT_TRY(gather_slices(s, s->theta));
    if (s->mom) DT_TRY(gather_slices(s, s->mom));
    s->have_sync = 1;
    return dt_dp_set_weights(s->inner, s->theta);
}

void dt_outer_step(float *theta, float *mom, const float *sum, size_t n, int count, float lr, float mu) {
    float inv = 1.0f / (float)count;
    if (mom) {
        for (size_t i = 0; i < n; i++) {
            float g = sum[i] * inv;
            mom[i] = mu * mom[i] + g;
            theta[i] -= lr * (g + mu * mom[i]);
        }
    } else {
        for (size_t i = 0; i < n; i++) theta[i] -= sum[i] * inv;
    }
}

dt_status dt_local_sgd_after_step(dt_local_sgd *s, long long step) {
    if (!dt_local_sgd_syncs_at(s, step)) return s->link.fd >= 0 ? dt_outer_progress(&s->link, step) : DT_OK;
    float *th = s->theta, *d = s->delta;
    size_t lo = s->part * (size_t)s->i, hi = lo + s->part < s->n ? lo + s->part : s->n, n = hi > lo ? hi - lo : 0;
    DT_TRY(dt_comm_agree(s->replicas, dt_dp_get_weights(s->inner, d), NULL)); /* before the collective */
    for (size_t i = lo; i < hi; i++) d[i] = th[i] - d[i];
    /* every replica gets the same bits of the sum (the collectives' contract), so the
     * replicas leave with the same weights */
    double t0 = dt_now();
    int count = s->R;
    if (s->link.fd >= 0) { /* replicas as separate jobs: through the launcher's outer server */
        DT_TRY(dt_outer_reduce(&s->link, step, d + lo, s->part, &count)); /* with the padding */
        s->sent += 2.0 * (double)(s->part * sizeof(float)); /* the change out, the sum back */
    } else {
        DT_TRY(dt_allreduce(s->replicas, d + lo, n, DT_F32, DT_SUM));
        s->sent += 2.0 * (double)(s->R - 1) / (double)s->R * (double)(n * sizeof(float)); /* a ring's share */
    }
    s->seconds += dt_now() - t0;
    dt_outer_step(th + lo, s->mom ? s->mom + lo : NULL, d + lo, n, count, s->outer_lr, s->mu);
    t0 = dt_now();
    DT_TRY(gather_slices(s, th));
    if (s->mom) DT_TRY(gather_slices(s, s->mom)); /* every rank holds the whole state: its checkpoint is its own */
    s->seconds += dt_now() - t0;
    return dt_dp_set_weights(s->inner, th);
}

size_t dt_local_sgd_bytes(const dt_local_sgd *s) {
    return s ? (s->mom ? 3 : 2) * s->part * (size_t)s->k * sizeof(float) : 0;
}
void dt_local_sgd_stats(const dt_local_sgd *s, double *seconds, double *sent) {
    *seconds = s ? s->seconds : 0.0;
    *sent = s ? s->sent : 0.0;
}

/* "weights", "exp_avg", "exp_avg_sq" (the replica's own), "theta_sync", "have_sync" and
 * DiLoCo's "outer_momentum" */
dt_status dt_local_sgd_save(dt_local_sgd *s, const char *dir, long long step, int rank, const char *layout) {
    size_t n = s->n;
    float *buf = malloc(3 * n * sizeof(float) + 1), have = (float)s->have_sync;
    if (!buf) return dt_fail(DT_ERUNTIME, "out of memory (saving the local SGD state)");
    dt_status st = dt_dp_get_weights(s->inner, buf);
    if (st == DT_OK) st = dt_dp_get_moments(s->inner, 0, buf + n);
    if (st == DT_OK) st = dt_dp_get_moments(s->inner, 1, buf + 2 * n);
    st_tensor_ref t[] = {{"weights", ST_F32, 1, {(int64_t)n}, buf},
                         {"exp_avg", ST_F32, 1, {(int64_t)n}, buf + n},
                         {"exp_avg_sq", ST_F32, 1, {(int64_t)n}, buf + 2 * n},
                         {"theta_sync", ST_F32, 1, {(int64_t)n}, s->theta},
                         {"have_sync", ST_F32, 1, {1}, &have},
                         {"outer_momentum", ST_F32, 1, {(int64_t)n}, s->mom}};
    if (st == DT_OK) st = dt_rank_state_save(dir, step, rank, layout, t, s->mom ? 6 : 5);
    free(buf);
    return st;
}

/* The saved run's layout differs from this one's only after " | " (its world and dp) and
 * it synchronised at `step`: each replica takes replica (its index mod W)'s state (an elastic
 * restart onto fewer or more replicas; a dropped replica's inner moments are lost). Pure
 * data parallelism only (a rank's piece of the model is then the whole of it). */
static dt_status open_resharded(dt_local_sgd *s, const char *step_dir, long long step, int rank, const char *layout,
                                st_file *f) {
    const char *saved, *bar = strchr(layout, '|');
    int world = 0;
    DT_TRY(dt_rank_state_open_from(step_dir, step, 0, f, &saved));
    const char *sbar = strchr(saved, '|');
    int same_model = bar && sbar && bar - layout == sbar - saved && !strncmp(layout, saved, (size_t)(bar - layout));
    int pure = !strncmp(layout, "tp 1 pp 1 cp 1 ", 15);
    if (!same_model || !pure || sscanf(sbar, "| world %d", &world) != 1 || world < 1 || world % s->k ||
        !dt_local_sgd_syncs_at(s, step)) {
        st_close(f);
        return dt_rank_state_open(step_dir, step, rank, layout, f); /* its one-line refusal */
    }
    st_close(f);
    int k = s->k, src = rank / k % (world / k) * k + rank % k; /* a whole replica's ranks from one saved replica */
    return dt_rank_state_open_from(step_dir, step, src, f, &saved);
}

dt_status dt_local_sgd_load(dt_local_sgd *s, const char *step_dir, long long step, int rank, const char *layout) {
    size_t n = s->n;
    st_file f = {0};
    if (dt_rank_state_open(step_dir, step, rank, layout, &f) != DT_OK) {
        dt_error_clear();
        DT_TRY(open_resharded(s, step_dir, step, rank, layout, &f));
    }
    float have = 0.0f;
    dt_status st = dt_rank_state_read(&f, "weights", s->delta, n);
    if (st == DT_OK) st = dt_dp_set_weights(s->inner, s->delta);
    if (st == DT_OK) st = dt_rank_state_read(&f, "exp_avg", s->delta, n);
    if (st == DT_OK) st = dt_dp_set_moments(s->inner, 0, s->delta);
    if (st == DT_OK) st = dt_rank_state_read(&f, "exp_avg_sq", s->delta, n);
    if (st == DT_OK) st = dt_dp_set_moments(s->inner, 1, s->delta);
    if (st == DT_OK) st = dt_rank_state_read(&f, "theta_sync", s->theta, n);
    if (st == DT_OK) st = dt_rank_state_read(&f, "have_sync", &have, 1);
    if (st == DT_OK && s->mom) st = dt_rank_state_read(&f, "outer_momentum", s->mom, n);
    s->have_sync = have != 0.0f;
    st_close(&f);
    return st;
}
