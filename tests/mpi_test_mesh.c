/* Device mesh on real communicators: for every (tp, pp, cp) whose product divides the
 * world size, each group's communicator has the expected size and this rank's index, and
 * holds exactly the expected world ranks (gathered over it, against the ranks that share
 * the right coordinates, computed here from the rank formula); emb is NULL on middle
 * stages; pipeline neighbours exchange messages (dt_isend/dt_irecv on the world) with the
 * ranks one stage away. Usage: mpirun -np N mpi_test_mesh [SOURCE_DIR] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/layout/mesh.h"

static int g_pass, g_fail, g_rank, g_printed;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) g_pass++;                                                                        \
        else {                                                                                     \
            g_fail++;                                                                              \
            if (g_printed++ < 30) {                                                                \
                fprintf(stderr, "rank %d: FAIL %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fprintf(stderr, "\n");                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#define OK(expr, what) CHECK((expr) == DT_OK, "%s: %s", what, dt_error_message())
#define MAXW 64

typedef struct {
    int d, p, c, t;
} coords;

/* rank = ((d·pp + p)·cp + c)·tp + t, inverted here independently of dt_mesh_coords */
static coords coords_of(int r, int pp, int cp, int tp) {
    coords k;
    k.t = r % tp;
    r /= tp;
    k.c = r % cp;
    r /= cp;
    k.p = r % pp;
    k.d = r / pp;
    return k;
}

/* Whether world rank q belongs to rank r's group of kind g (emb: r is a member). */
static int in_group(dt_mesh_group g, coords r, coords q, int pp) {
    switch (g) {
    case DT_MESH_DP: return q.p == r.p && q.c == r.c && q.t == r.t;
    case DT_MESH_PP: return q.d == r.d && q.c == r.c && q.t == r.t;
    case DT_MESH_CP: return q.d == r.d && q.p == r.p && q.t == r.t;
    case DT_MESH_TP: return q.d == r.d && q.p == r.p && q.c == r.c;
    case DT_MESH_DP_CP: return q.p == r.p && q.t == r.t;
    case DT_MESH_EMB: return q.d == r.d && q.c == r.c && q.t == r.t && (q.p == 0 || q.p == pp - 1);
    default: return 0;
    }
}

static void test_shape(dt_comm *world, int tp, int pp, int cp) {
    int n = dt_comm_size(world), r = g_rank;
    char what[96];
    snprintf(what, sizeof what, "mesh tp=%d pp=%d cp=%d on %d", tp, pp, cp, n);
    dt_mesh m;
    OK(dt_mesh_create(&m, world, tp, pp, cp), what);
    coords me = coords_of(r, pp, cp, tp);
    CHECK(m.dp == n / (tp * pp * cp) && m.dp_rank == me.d && m.pp_rank == me.p && m.cp_rank == me.c &&
              m.tp_rank == me.t,
          "%s: coordinates (%d %d %d %d), want (%d %d %d %d)", what, m.dp_rank, m.pp_rank, m.cp_rank, m.tp_rank, me.d,
          me.p, me.c, me.t);
    int member_emb = me.p == 0 || me.p == pp - 1;
    CHECK(m.in_emb == member_emb && (m.emb_comm != NULL) == member_emb && m.pp_first == (me.p == 0) &&
              m.pp_last == (me.p == pp - 1),
          "%s: in_emb %d, emb_comm %p, first %d, last %d", what, m.in_emb, (void *)m.emb_comm, m.pp_first, m.pp_last);
    dt_comm *comm[DT_MESH_NGROUPS] = {m.dp_comm, m.pp_comm, m.cp_comm, m.tp_comm, m.dp_cp_comm, m.emb_comm};
    int index[DT_MESH_NGROUPS] = {me.d, me.p, me.c, me.t, me.d * cp + me.c, me.p == 0 ? 0 : 1};
    CHECK(m.dp_cp_rank == index[DT_MESH_DP_CP] && (!member_emb || m.emb_rank == index[DT_MESH_EMB]),
          "%s: dp_cp_rank %d, emb_rank %d", what, m.dp_cp_rank, m.emb_rank);
    for (int g = 0; g < DT_MESH_NGROUPS; g++) {
        if (!comm[g]) continue;
        int want[MAXW], nw = 0, got[MAXW] = {0};
        for (int q = 0; q < n; q++)
            if (in_group((dt_mesh_group)g, me, coords_of(q, pp, cp, tp), pp)) want[nw++] = q;
        int size = dt_comm_size(comm[g]);
        CHECK(size == nw && dt_comm_rank(comm[g]) == index[g], "%s group %d: size %d (want %d), rank %d (want %d)",
              what, g, size, nw, dt_comm_rank(comm[g]), index[g]);
        if (size != nw) continue;
        double mine = r, all[MAXW];
        OK(dt_allgather(comm[g], &mine, all, 1, DT_F64), what);
        for (int k = 0; k < nw; k++) got[k] = (int)all[k];
        CHECK(memcmp(got, want, (size_t)nw * sizeof(int)) == 0, "%s group %d: members %d %d ..., want %d %d ...", what,
              g, got[0], nw > 1 ? got[1] : -1, want[0], nw > 1 ? want[1] : -1);
    }
    /* pipeline: this rank's number goes to the next stage; the previous stage's arrives */
    int want_prev = me.p > 0 ? r - tp * cp : -1, want_next = me.p < pp - 1 ? r + tp * cp : -1;
    CHECK(m.pp_prev == want_prev && m.pp_next == want_next, "%s: prev %d next %d, want %d %d", what, m.pp_prev,
          m.pp_next, want_prev, want_next);
    double out = r, in = -1;
    dt_request *rs = NULL, *rr = NULL;
    if (m.pp_prev >= 0) OK(dt_irecv(world, &in, 1, DT_F64, m.pp_prev, 21, &rr), what);
    if (m.pp_next >= 0) OK(dt_isend(world, &out, 1, DT_F64, m.pp_next, 21, &rs), what);
    if (rr) OK(dt_wait(rr), what);
    if (rs) OK(dt_wait(rs), what);
    CHECK(m.pp_prev < 0 || in == m.pp_prev, "%s: received %g from the previous stage %d", what, in, m.pp_prev);
    dt_mesh_destroy(&m);
}

int main(int argc, char **argv) {
    dt_comm *world = NULL;
    if (dt_comm_init(&world, &argc, &argv) != DT_OK) {
        fprintf(stderr, "mpi_test_mesh: %s\n", dt_error_message());
        return 1;
    }
    g_rank = dt_comm_rank(world);
    int n = dt_comm_size(world), shapes = 0;
    if (n > MAXW) {
        dt_comm_finalize(world);
        return 77;
    }
    for (int tp = 1; tp <= n; tp++)
        for (int pp = 1; pp <= n; pp++)
            for (int cp = 1; cp <= n; cp++)
                if (n % (tp * pp * cp) == 0) {
                    test_shape(world, tp, pp, cp);
                    shapes++;
                }
    dt_mesh m;
    dt_error_clear();
    CHECK(dt_mesh_create(&m, world, n + 1, 1, 1) == DT_EINPUT, "tp = %d accepted on %d ranks", n + 1, n);
    dt_mesh_destroy(&m);
    double tot[2] = {g_pass, g_fail};
    if (dt_allreduce(world, tot, 2, DT_F64, DT_SUM) != DT_OK) tot[1] += 1;
    if (g_rank == 0) printf("%.0f passed, %.0f failed (%d ranks, %d shapes)\n", tot[0], tot[1], n, shapes);
    dt_comm_finalize(world);
    return tot[1] > 0 ? 1 : 0;
}
