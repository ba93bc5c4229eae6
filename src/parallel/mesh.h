/* Device mesh: world = dp × pp × cp × tp, tp innermost (consecutive ranks, so a
 * tensor-parallel group stays inside a node), then cp, pp, and dp outermost:
 *   rank = ((dp_rank·pp + pp_rank)·cp + cp_rank)·tp + tp_rank
 * Every process group is built here, in one place. */
#ifndef DT_MESH_H
#define DT_MESH_H
#include "../comm/comm.h"
#include "../core/status.h"

typedef struct {
    int world, dp, pp, cp, tp;
    int rank, dp_rank, pp_rank, cp_rank, tp_rank;
    dt_comm *world_comm; /* not owned */
    dt_comm *dp_comm, *pp_comm, *cp_comm, *tp_comm;
} dt_mesh;

/* Fails (DT_EINPUT, before any work) if tp·pp·cp does not divide the world size. */
dt_status dt_mesh_create(dt_mesh *m, dt_comm *world, int tp, int pp, int cp);
void dt_mesh_destroy(dt_mesh *m);
/* Pure arithmetic, for tests and the launcher: coordinates of a rank. */
void dt_mesh_coords(int rank, int pp, int cp, int tp, int *dp_r, int *pp_r, int *cp_r, int *tp_r);

#endif
