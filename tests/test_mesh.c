/* Device-mesh arithmetic for every shape (dp, pp, cp, tp) of 8 and of 12 ranks: ranks and
 * coordinates are inverse; each kind of group partitions the world (emb: the first and
 * last stages), has the right size, holds exactly the ranks that share the coordinates it
 * should, and indexes its members 0.. in world-rank order; pipeline neighbours are
 * consistent (next of prev is self). Also dt_mesh_create on a world of one without MPI.
 * (The communicators on 2-4 ranks: mpi_test_mesh.c.) */
#include <stdlib.h>

#include "check.h"
#include "parallel/layout/mesh.h"

#define MAXW 12

typedef struct {
    int d, p, c, t;
} coords;

/* Whether ranks a and b must share a group of kind g (both in one, for emb). */
static int same_group(dt_mesh_group g, coords a, coords b, int pp) {
    switch (g) {
    case DT_MESH_DP: return a.p == b.p && a.c == b.c && a.t == b.t;
    case DT_MESH_PP: return a.d == b.d && a.c == b.c && a.t == b.t;
    case DT_MESH_CP: return a.d == b.d && a.p == b.p && a.t == b.t;
    case DT_MESH_TP: return a.d == b.d && a.p == b.p && a.c == b.c;
    case DT_MESH_DP_CP: return a.p == b.p && a.t == b.t;
    case DT_MESH_EMB:
        return a.d == b.d && a.c == b.c && a.t == b.t && (a.p == 0 || a.p == pp - 1) && (b.p == 0 || b.p == pp - 1);
    default: return 0;
    }
}

static void test_shape(int dp, int pp, int cp, int tp) {
    int n = dp * pp * cp * tp;
    coords co[MAXW];
    for (int r = 0; r < n; r++) {
        dt_mesh_coords(r, pp, cp, tp, &co[r].d, &co[r].p, &co[r].c, &co[r].t);
        CHECK(co[r].d < dp && dt_mesh_rank_of(co[r].d, co[r].p, co[r].c, co[r].t, pp, cp, tp) == r,
              "shape %dx%dx%dx%d: rank %d does not round-trip", dp, pp, cp, tp, r);
    }
    const int want_size[DT_MESH_NGROUPS] = {dp, pp, cp, tp, dp * cp, pp == 1 ? 1 : 2};
    for (int g = 0; g < DT_MESH_NGROUPS; g++) {
        int color[MAXW], index[MAXW], size[MAXW], covered = 0;
        for (int r = 0; r < n; r++)
            size[r] = dt_mesh_group_of((dt_mesh_group)g, r, dp, pp, cp, tp, &color[r], &index[r]);
        for (int r = 0; r < n; r++) {
            int member = g != DT_MESH_EMB || co[r].p == 0 || co[r].p == pp - 1;
            if (!member) {
                CHECK(color[r] == DT_COMM_NO_GROUP && index[r] == -1 && size[r] == 0,
                      "shape %dx%dx%dx%d group %d: middle stage rank %d in a group (color %d)", dp, pp, cp, tp, g, r,
                      color[r]);
                continue;
            }
            covered++;
            CHECK(size[r] == want_size[g], "shape %dx%dx%dx%d group %d rank %d: size %d, want %d", dp, pp, cp, tp, g,
                  r, size[r], want_size[g]);
            /* the members are exactly the ranks sharing the coordinates; indices 0.. in rank order */
            int members = 0, below = 0;
            for (int q = 0; q < n; q++) {
                int same = color[q] == color[r] && color[q] != DT_COMM_NO_GROUP;
                CHECK(same == same_group((dt_mesh_group)g, co[r], co[q], pp),
                      "shape %dx%dx%dx%d group %d: ranks %d and %d: same color %d", dp, pp, cp, tp, g, r, q, same);
                members += same;
                below += same && q < r;
            }
            CHECK(members == size[r] && index[r] == below && color[r] >= 0 && color[r] <= r && index[color[r]] == 0,
                  "shape %dx%dx%dx%d group %d rank %d: %d members, index %d (want %d), color %d", dp, pp, cp, tp, g, r,
                  members, index[r], below, color[r]);
        }
        int want_covered = g == DT_MESH_EMB ? dp * cp * tp * (pp == 1 ? 1 : 2) : n;
        CHECK(covered == want_covered, "shape %dx%dx%dx%d group %d: %d ranks in groups, want %d", dp, pp, cp, tp, g,
              covered, want_covered);
    }
    for (int r = 0; r < n; r++) {
        int prev, next, pp2, np2;
        dt_mesh_pp_neighbours(r, pp, cp, tp, &prev, &next);
        CHECK((prev < 0) == (co[r].p == 0) && (next < 0) == (co[r].p == pp - 1) && prev < n && next < n,
              "shape %dx%dx%dx%d rank %d (stage %d): prev %d, next %d", dp, pp, cp, tp, r, co[r].p, prev, next);
        if (prev >= 0) {
            dt_mesh_pp_neighbours(prev, pp, cp, tp, &pp2, &np2);
            CHECK(np2 == r && same_group(DT_MESH_PP, co[r], co[prev], pp) && co[prev].p == co[r].p - 1,
                  "shape %dx%dx%dx%d rank %d: prev %d, whose next is %d", dp, pp, cp, tp, r, prev, np2);
        }
        if (next >= 0) {
            dt_mesh_pp_neighbours(next, pp, cp, tp, &pp2, &np2);
            CHECK(pp2 == r && same_group(DT_MESH_PP, co[r], co[next], pp) && co[next].p == co[r].p + 1,
                  "shape %dx%dx%dx%d rank %d: next %d, whose prev is %d", dp, pp, cp, tp, r, next, pp2);
        }
    }
}

/* Every ordered factorisation of n into (dp, pp, cp, tp). */
static int test_all_shapes(int n) {
    int shapes = 0;
    for (int dp = 1; dp <= n; dp++)
        for (int pp = 1; pp <= n; pp++)
            for (int cp = 1; cp <= n; cp++)
                for (int tp = 1; tp <= n; tp++)
                    if (dp * pp * cp * tp == n) {
                        test_shape(dp, pp, cp, tp);
                        shapes++;
                    }
    return shapes;
}

static void test_world_of_one(void) {
    unsetenv("OMPI_COMM_WORLD_SIZE"); /* a world without MPI even under a launcher */
    unsetenv("PMIX_RANK");
    unsetenv("PMI_SIZE");
    dt_comm *w = NULL;
    CHECK(dt_comm_init(&w, NULL, NULL) == DT_OK && w, "init");
    if (!w) return;
    dt_mesh m;
    CHECK(dt_mesh_create(&m, w, 1, 1, 1) == DT_OK, "mesh of one");
    CHECK(m.dp == 1 && m.dp_cp_rank == 0 && m.in_emb && m.emb_rank == 0 && m.pp_first && m.pp_last &&
              m.pp_prev == -1 && m.pp_next == -1,
          "mesh of one: dp %d, dp_cp_rank %d, in_emb %d, first %d, last %d, prev %d, next %d", m.dp, m.dp_cp_rank,
          m.in_emb, m.pp_first, m.pp_last, m.pp_prev, m.pp_next);
    dt_comm *all[] = {m.dp_comm, m.pp_comm, m.cp_comm, m.tp_comm, m.dp_cp_comm, m.emb_comm};
    for (int i = 0; i < 6; i++) CHECK(all[i] && dt_comm_size(all[i]) == 1, "mesh of one: group %d", i);
    dt_mesh_destroy(&m);
    CHECK(dt_mesh_create(&m, w, 1, 2, 1) == DT_EINPUT && strstr(dt_error_message(), "not divisible"),
          "pp = 2 on one rank accepted");
    dt_mesh_destroy(&m);
    dt_error_clear();
    dt_comm_finalize(w);
}

int main(void) {
    int s8 = test_all_shapes(8), s12 = test_all_shapes(12);
    /* exponents spread over 4 factors: 8 = 2^3 in C(6,3) ways, 12 = 2^2·3 in C(5,3)·4 */
    CHECK(s8 == 20 && s12 == 40, "%d shapes of 8, %d of 12", s8, s12);
    test_world_of_one();
    return check_finish();
}
