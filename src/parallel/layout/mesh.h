/* Device mesh: world = dp × pp × cp × tp, tp innermost (consecutive ranks, so a
 * tensor-parallel group stays inside a node), then cp, pp, and dp outermost:
 *   rank = ((dp_rank·pp + pp_rank)·cp + cp_rank)·tp + tp_rank
 * Every process group is built here, in one place. In each group the members are ordered
 * by world rank, so a member's index (its rank in the group's communicator) is:
 *   dp, pp, cp, tp: ranks differing in that coordinate only; index = that coordinate;
 *   dp_cp: ranks sharing pp and tp (dp·cp of them; index dp_rank·cp + cp_rank): where
 *     gradients are reduced when context parallelism is on (Megatron's data-parallel group
 *     with context parallelism); the same ranks as dp when cp = 1;
 *   emb: for each (dp, cp, tp), the first and the last pipeline stage (index 0 and 1; one
 *     rank, index 0, when pp = 1): tied embeddings are all-reduced over it. The stages in
 *     between are in no emb group. */
#ifndef DT_MESH_H
#define DT_MESH_H
#include <stdio.h>

#include "../../comm/comm.h"
#include "../../core/status.h"

typedef enum {
    DT_MESH_DP,
    DT_MESH_PP,
    DT_MESH_CP,
    DT_MESH_TP,
    DT_MESH_DP_CP,
    DT_MESH_EMB,
    DT_MESH_NGROUPS
} dt_mesh_group;

typedef struct {
    int world, dp, pp, cp, tp;
    int rank, dp_rank, pp_rank, cp_rank, tp_rank;
    int dp_cp_rank;        /* index in dp_cp_comm */
    int in_emb, emb_rank;  /* member of an emb group (first or last stage), index in it (-1 if not) */
    int pp_first, pp_last; /* first / last pipeline stage (both when pp = 1) */
    int pp_prev, pp_next;  /* world ranks of the previous / next stage of this rank's pipeline, -1 at the ends */
    dt_comm *world_comm;   /* not owned */
    dt_comm *dp_comm, *pp_comm, *cp_comm, *tp_comm, *dp_cp_comm;
    dt_comm *emb_comm; /* NULL when !in_emb */
} dt_mesh;

/* Fails (DT_EINPUT, before any work) if tp·pp·cp does not divide the world size.
 * Collective over world (every group is a split of it). */
dt_status dt_mesh_create(dt_mesh *m, dt_comm *world, int tp, int pp, int cp);
void dt_mesh_destroy(dt_mesh *m);

/* Pure arithmetic, for tests and the launcher (no MPI; shapes as in dt_mesh_create). */
/* Coordinates of a rank. */
void dt_mesh_coords(int rank, int pp, int cp, int tp, int *dp_r, int *pp_r, int *cp_r, int *tp_r);
/* World rank at the given coordinates (the inverse of dt_mesh_coords). */
int dt_mesh_rank_of(int dp_r, int pp_r, int cp_r, int tp_r, int pp, int cp, int tp);
/* The group of kind g holding rank, in a world of dp·pp·cp·tp: *color is the world rank
 * of its first member (DT_COMM_NO_GROUP when rank is in none: emb on a middle stage),
 * *index the rank's index in it (-1 if none). Returns the group's size (0 if none). */
int dt_mesh_group_of(dt_mesh_group g, int rank, int dp, int pp, int cp, int tp, int *color, int *index);
/* The resolved layout of a world of dp·pp·cp·tp ranks as text: the sizes, then per rank
 * its coordinates and the members of each of its groups (what `dtrain config -n N`
 * prints). */
void dt_mesh_print(FILE *out, int dp, int pp, int cp, int tp);
/* World ranks of the previous and next stage of rank's pipeline (same dp, cp, tp), -1 at
 * the ends. (In pp_comm they are pp_rank - 1 and pp_rank + 1.) */
void dt_mesh_pp_neighbours(int rank, int pp, int cp, int tp, int *prev, int *next);

#endif
