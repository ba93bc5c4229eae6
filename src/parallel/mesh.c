#include "mesh.h"

#include <string.h>

void dt_mesh_coords(int rank, int pp, int cp, int tp, int *dp_r, int *pp_r, int *cp_r, int *tp_r) {
    *tp_r = rank % tp;
    *cp_r = rank / tp % cp;
    *pp_r = rank / (tp * cp) % pp;
    *dp_r = rank / (tp * cp * pp);
}

dt_status dt_mesh_create(dt_mesh *m, dt_comm *world, int tp, int pp, int cp) {
    memset(m, 0, sizeof *m);
    m->world_comm = world;
    m->world = dt_comm_size(world);
    m->rank = dt_comm_rank(world);
    long long model = (long long)tp * pp * cp;
    if (tp < 1 || pp < 1 || cp < 1 || m->world % model != 0)
        return dt_fail(DT_EINPUT, "parallel: world size %d is not divisible by tp x pp x cp = %d x %d x %d", m->world,
                       tp, pp, cp);
    m->tp = tp;
    m->pp = pp;
    m->cp = cp;
    m->dp = m->world / (int)model;
    dt_mesh_coords(m->rank, pp, cp, tp, &m->dp_rank, &m->pp_rank, &m->cp_rank, &m->tp_rank);
    /* Each group: ranks that agree on every other coordinate. color = the other coordinates. */
    int r = m->rank;
    int dp_color = r % (tp * cp * pp);                                     /* (pp, cp, tp) */
    int tp_color = r / tp;                                                 /* (dp, pp, cp) */
    int cp_color = (r / (tp * cp)) * tp + m->tp_rank;                      /* (dp, pp, tp) */
    int pp_color = m->dp_rank * (cp * tp) + m->cp_rank * tp + m->tp_rank; /* (dp, cp, tp) */
    DT_TRY(dt_comm_split(world, dp_color, m->dp_rank, &m->dp_comm));
    DT_TRY(dt_comm_split(world, pp_color, m->pp_rank, &m->pp_comm));
    DT_TRY(dt_comm_split(world, cp_color, m->cp_rank, &m->cp_comm));
    DT_TRY(dt_comm_split(world, tp_color, m->tp_rank, &m->tp_comm));
    return DT_OK;
}

void dt_mesh_destroy(dt_mesh *m) {
    if (m->dp_comm) dt_comm_free(m->dp_comm);
    if (m->pp_comm) dt_comm_free(m->pp_comm);
    if (m->cp_comm) dt_comm_free(m->cp_comm);
    if (m->tp_comm) dt_comm_free(m->tp_comm);
    memset(m, 0, sizeof *m);
}
