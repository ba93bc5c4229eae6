#include "mesh.h"

#include <string.h>

#include "../../core/config.h"

void dt_mesh_coords(int rank, int pp, int cp, int tp, int *dp_r, int *pp_r, int *cp_r, int *tp_r) {
    *tp_r = rank % tp;
    *cp_r = rank / tp % cp;
    *pp_r = rank / (tp * cp) % pp;
    *dp_r = rank / (tp * cp * pp);
}

int dt_mesh_rank_of(int dp_r, int pp_r, int cp_r, int tp_r, int pp, int cp, int tp) {
    return ((dp_r * pp + pp_r) * cp + cp_r) * tp + tp_r;
}

int dt_mesh_group_of(dt_mesh_group g, int rank, int dp, int pp, int cp, int tp, int *color, int *index) {
    int d, p, c, t;
    dt_mesh_coords(rank, pp, cp, tp, &d, &p, &c, &t);
    /* a group's color is the world rank of its member with its free coordinates at 0 */
    switch (g) {
    case DT_MESH_DP:
        *color = dt_mesh_rank_of(0, p, c, t, pp, cp, tp);
        *index = d;
        return dp;
    case DT_MESH_PP:
        *color = dt_mesh_rank_of(d, 0, c, t, pp, cp, tp);
        *index = p;
        return pp;
    case DT_MESH_CP:
        *color = dt_mesh_rank_of(d, p, 0, t, pp, cp, tp);
        *index = c;
        return cp;
    case DT_MESH_TP:
        *color = dt_mesh_rank_of(d, p, c, 0, pp, cp, tp);
        *index = t;
        return tp;
    case DT_MESH_DP_CP:
        *color = dt_mesh_rank_of(0, p, 0, t, pp, cp, tp);
        *index = d * cp + c;
        return dp * cp;
    case DT_MESH_EMB:
        if (p == 0 || p == pp - 1) {
            *color = dt_mesh_rank_of(d, 0, c, t, pp, cp, tp);
            *index = p == 0 ? 0 : 1;
            return pp == 1 ? 1 : 2;
        }
        break;
    default: break;
    }
    *color = DT_COMM_NO_GROUP;
    *index = -1;
    return 0;
}

void dt_mesh_pp_neighbours(int rank, int pp, int cp, int tp, int *prev, int *next) {
    int d, p, c, t;
    dt_mesh_coords(rank, pp, cp, tp, &d, &p, &c, &t);
    *prev = p > 0 ? dt_mesh_rank_of(d, p - 1, c, t, pp, cp, tp) : -1;
    *next = p < pp - 1 ? dt_mesh_rank_of(d, p + 1, c, t, pp, cp, tp) : -1;
}

dt_status dt_mesh_create(dt_mesh *m, dt_comm *world, int tp, int pp, int cp) {
    memset(m, 0, sizeof *m);
    m->world_comm = world;
    m->world = dt_comm_size(world);
    m->rank = dt_comm_rank(world);
    int dp = dt_config_dp_size(m->world, tp, pp, cp);
    if (!dp)
        return dt_fail(DT_EINPUT, "parallel: world size %d is not divisible by tp x pp x cp = %d x %d x %d", m->world,
                       tp, pp, cp);
    m->tp = tp;
    m->pp = pp;
    m->cp = cp;
    m->dp = dp;
    dt_mesh_coords(m->rank, pp, cp, tp, &m->dp_rank, &m->pp_rank, &m->cp_rank, &m->tp_rank);
    m->pp_first = m->pp_rank == 0;
    m->pp_last = m->pp_rank == pp - 1;
    dt_mesh_pp_neighbours(m->rank, pp, cp, tp, &m->pp_prev, &m->pp_next);
    dt_comm **comm[DT_MESH_NGROUPS] = {&m->dp_comm, &m->pp_comm,    &m->cp_comm,
                                       &m->tp_comm, &m->dp_cp_comm, &m->emb_comm};
    /* for the watchdog's messages ("all-reduce #12 on dp group ...") */
    static const char *const names[DT_MESH_NGROUPS] = {"dp", "pp", "cp", "tp", "dp_cp", "embedding"};
    for (int g = 0; g < DT_MESH_NGROUPS; g++) {
        int color, index;
        dt_mesh_group_of((dt_mesh_group)g, m->rank, m->dp, pp, cp, tp, &color, &index);
        if (g == DT_MESH_DP_CP) m->dp_cp_rank = index;
        if (g == DT_MESH_EMB) {
            m->in_emb = index >= 0;
            m->emb_rank = index;
        }
        DT_TRY(dt_comm_split(world, color, index, comm[g]));
        dt_comm_set_name(*comm[g], names[g]);
    }
    return DT_OK;
}

void dt_mesh_destroy(dt_mesh *m) {
    dt_comm *all[] = {m->dp_comm, m->pp_comm, m->cp_comm, m->tp_comm, m->dp_cp_comm, m->emb_comm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) dt_comm_free(all[i]);
    memset(m, 0, sizeof *m);
}

/* "{a,b,...}": the members of rank's group g, or "-" outside any. */
static void print_group(FILE *out, dt_mesh_group g, int rank, int dp, int pp, int cp, int tp) {
    int color, index, world = dp * pp * cp * tp, found = 0, size;
    char buf[64];
    size_t used = 0;
    if ((size = dt_mesh_group_of(g, rank, dp, pp, cp, tp, &color, &index)) == 0) {
        fprintf(out, " %-14s", "-");
        return;
    }
    buf[used++] = '{';
    for (int r = color; r < world && found < size; r++) { /* members from the first (its color) on */
        int c2, i2;
        if (dt_mesh_group_of(g, r, dp, pp, cp, tp, &c2, &i2) == 0 || c2 != color) continue;
        char item[16];
        int w = snprintf(item, sizeof item, "%s%d", found ? "," : "", r);
        if ((size_t)w + 5 > sizeof buf - used) { /* long groups: the first members, then "..." */
            memcpy(buf + used, ",...", 4);
            used += 4;
            break;
        }
        memcpy(buf + used, item, (size_t)w);
        used += (size_t)w;
        found++;
    }
    buf[used++] = '}';
    buf[used] = 0;
    fprintf(out, " %-14s", buf);
}

void dt_mesh_print(FILE *out, int dp, int pp, int cp, int tp) {
    fprintf(out, "layout: world %d = dp %d x pp %d x cp %d x tp %d; rank = ((dp_rank*pp + pp_rank)*cp + cp_rank)*tp + "
            "tp_rank\n", dp * pp * cp * tp, dp, pp, cp, tp);
    fprintf(out, "%-5s %-11s %-14s %-14s %-14s %-14s %-14s %s\n", "rank", "dp pp cp tp", "tp group", "cp group",
            "pp group", "dp group", "dp x cp group", "embedding");
    static const dt_mesh_group order[] = {DT_MESH_TP, DT_MESH_CP, DT_MESH_PP, DT_MESH_DP, DT_MESH_DP_CP, DT_MESH_EMB};
    for (int r = 0; r < dp * pp * cp * tp; r++) {
        int d, p, c, t;
        dt_mesh_coords(r, pp, cp, tp, &d, &p, &c, &t);
        fprintf(out, "%-5d %-2d %-2d %-2d %-2d", r, d, p, c, t);
        for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) print_group(out, order[k], r, dp, pp, cp, tp);
        fprintf(out, "\n");
    }
}
