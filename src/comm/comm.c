/* World setup and communicators (init, split, free), names and sizes, and the choice of
 * algorithm per collective (the files of the rest of comm.h: its top comment). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_core.h"

/* Next communicator slot of the flight recorder in this process (0 is the world's). */
static int g_next_slot = 1;

/* ---- names, sizes, algorithm choice ---- */

static const char *const g_algo_names[DT_ALGO_N] = {"mpi", "ring", "rhd", "tree", "shm", "auto"};
static const char *const g_coll_names[DT_COLL_N] = {"allreduce", "reduce_scatter", "allgather", "bcast"};

dt_status dt_algo_parse(const char *name, dt_algo *out) {
    for (int a = 0; a < DT_ALGO_N; a++)
        if (name && strcmp(name, g_algo_names[a]) == 0) {
            *out = (dt_algo)a;
            return DT_OK;
        }
    return dt_fail(DT_EINPUT, "unknown communication algorithm '%s' (expected mpi, ring, rhd, tree, shm or auto)",
                   name ? name : "(null)");
}

const char *dt_algo_name(dt_algo a) { return (unsigned)a < DT_ALGO_N ? g_algo_names[a] : "?"; }
const char *dt_coll_name(dt_coll c) { return (unsigned)c < DT_COLL_N ? g_coll_names[c] : "?"; }
size_t dt_dtype_size(dt_dtype t) { return t == DT_F64 ? 8 : t == DT_F32 ? 4 : t == DT_BF16 ? 2 : 0; }
const char *dt_dtype_name(dt_dtype t) {
    return t == DT_F64 ? "f64" : t == DT_F32 ? "f32" : t == DT_BF16 ? "bf16" : "?";
}

int dt_algo_supports(dt_algo a, dt_coll c) {
    if ((unsigned)c >= DT_COLL_N) return 0;
    switch (a) {
    case DT_ALGO_MPI:
    case DT_ALGO_SHM:
    case DT_ALGO_AUTO: return 1;
    case DT_ALGO_RING: return c != DT_COLL_BCAST;
    case DT_ALGO_RHD: return c == DT_COLL_ALLREDUCE;
    case DT_ALGO_TREE: return c == DT_COLL_ALLREDUCE || c == DT_COLL_BCAST;
    default: return 0;
    }
}

dt_status dt_comm_set_algo(dt_comm *c, dt_coll coll, dt_algo algo) {
    if ((unsigned)coll >= DT_COLL_N) return dt_fail(DT_EINPUT, "set_algo: unknown collective %d", (int)coll);
    if ((unsigned)algo >= DT_ALGO_N) return dt_fail(DT_EINPUT, "set_algo: unknown algorithm %d", (int)algo);
    if (!dt_algo_supports(algo, coll))
        return dt_fail(DT_EINPUT, "communication algorithm '%s' does not implement %s", dt_algo_name(algo),
                       dt_coll_name(coll));
    if (algo == DT_ALGO_SHM && !c->fg.one_node)
        return dt_fail(DT_EINPUT,
                       "communication algorithm 'shm' needs every rank on one node (%d of the %d ranks are on this "
                       "node)",
                       c->local_size, c->size);
    c->algo[coll] = algo;
    return DT_OK;
}

dt_algo dt_comm_get_algo(const dt_comm *c, dt_coll coll) {
    return (unsigned)coll < DT_COLL_N ? c->algo[coll] : DT_ALGO_MPI;
}

/* ---- communicators ---- */

/* Wraps `user` (owned from here on; MPI_COMM_NULL for a world of one without MPI). */
static dt_status comm_make(MPI_Comm user, int mpi, int threads, dt_comm **out) {
    *out = NULL;
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) {
        if (user != MPI_COMM_NULL) MPI_Comm_free(&user);
        return dt_fail(DT_ERUNTIME, "communicator: out of memory");
    }
    c->mpi = mpi;
    c->fl.slot = -1;
    c->threads = threads;
    c->user = user;
    c->rank = 0;
    c->size = 1;
    c->fg.comm = c->fg.node = MPI_COMM_NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    dt_status st = DT_OK;
    if (mpi) {
        MPI_Comm_set_errhandler(user, MPI_ERRORS_RETURN);
        st = dtc_mpi(&c->fg, MPI_Comm_rank(user, &c->rank), "MPI_Comm_rank");
        if (!st) st = dtc_mpi(&c->fg, MPI_Comm_size(user, &c->size), "MPI_Comm_size");
    }
    if (!st) st = dtc_ctx_init(&c->fg, user, c->rank, c->size);
    if (st) {
        st = dt_fail(st, "communicator setup: %s", c->fg.err);
        dt_comm_free(c);
        return st;
    }
    c->world_of = calloc((size_t)c->size, sizeof *c->world_of);
    if (!c->world_of) {
        dt_comm_free(c);
        return dt_fail(DT_ERUNTIME, "communicator: out of memory");
    }
    if (mpi) { /* the members as world ranks, for the watchdog's messages */
        MPI_Group g, w;
        int *idx = malloc((size_t)c->size * sizeof *idx);
        if (idx && MPI_Comm_group(user, &g) == MPI_SUCCESS) {
            if (MPI_Comm_group(MPI_COMM_WORLD, &w) == MPI_SUCCESS) {
                for (int i = 0; i < c->size; i++) idx[i] = i;
                MPI_Group_translate_ranks(g, c->size, idx, w, c->world_of);
                MPI_Group_free(&w);
            }
            MPI_Group_free(&g);
        }
        free(idx);
    }
    snprintf(c->name, sizeof c->name, "%s", "world");
    c->fl.size = c->size;
    c->fl.name = c->name;
    c->local_rank = c->rank;
    c->local_size = c->size;
    if (c->fg.node != MPI_COMM_NULL) {
        MPI_Comm_rank(c->fg.node, &c->local_rank);
        MPI_Comm_size(c->fg.node, &c->local_size);
    }
    *out = c;
    return DT_OK;
}

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

dt_status dt_comm_init(dt_comm **world, int *argc, char ***argv) {
    *world = NULL;
    if (!launched_by_mpi()) {
        dtc_watch_open(MPI_COMM_NULL, 0, 1);
        return comm_make(MPI_COMM_NULL, 0, 0, world);
    }
    int inited = 0, provided = MPI_THREAD_SINGLE, owns = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return dt_fail(DT_ERUNTIME, "MPI_Init_thread failed");
        owns = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (!dtc_bf16_ops_create()) {
        if (owns) MPI_Finalize();
        return dt_fail(DT_ERUNTIME, "communicator setup: MPI_Op_create failed");
    }
    MPI_Comm user;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &user) != MPI_SUCCESS) {
        if (owns) MPI_Finalize();
        return dt_fail(DT_ERUNTIME, "communicator setup: MPI_Comm_dup of MPI_COMM_WORLD failed");
    }
    dt_status st = comm_make(user, 1, provided >= MPI_THREAD_MULTIPLE, world);
    if (st) {
        if (owns) MPI_Finalize();
        return st;
    }
    (*world)->owns_mpi = owns;
    dtc_watch_open(user, (*world)->rank, (*world)->size);
    (*world)->fl.slot = 0;
    dtc_watch_register(0, (*world)->size, (*world)->world_of);
    return DT_OK;
}

void dt_comm_free(dt_comm *c) {
    if (!c) return;
    if (c->thr_on) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->work);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thr, NULL);
    }
    if (c->bg) {
        dtc_ctx_free(c->bg);
        free(c->bg);
    }
    while (c->nreg > 0) dt_comm_free_shared(c, c->reg[c->nreg - 1].base[c->rank]); /* collective, like the rest */
    dtc_ctx_free(&c->fg);
    if (c->user != MPI_COMM_NULL) MPI_Comm_free(&c->user);
    if (c->fl.slot >= 0) dtc_watch_forget(c->fl.slot);
    free(c->world_of);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->work);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void dt_comm_finalize(dt_comm *world) {
    if (!world) return;
    int owns = world->owns_mpi;
    dt_comm_free(world);
    dtc_watch_close();
    if (owns) {
        dtc_bf16_ops_free();
        MPI_Finalize();
    }
}

void dt_comm_abort(dt_comm *c, int code) {
    if (c && c->mpi) MPI_Abort(c->user, code);
    exit(code); /* a world without MPI is this process */
}

void dt_comm_set_name(dt_comm *c, const char *name) {
    if (c) snprintf(c->name, sizeof c->name, "%s", name);
}

int dt_comm_rank(const dt_comm *c) { return c->rank; }
int dt_comm_size(const dt_comm *c) { return c->size; }
int dt_comm_local_rank(const dt_comm *c) { return c->local_rank; }
int dt_comm_local_size(const dt_comm *c) { return c->local_size; }

dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
    *out = NULL;
    if (color < 0 && color != DT_COMM_NO_GROUP) return dt_fail(DT_EINPUT, "split: color %d is negative", color);
    if (!c->mpi) return color == DT_COMM_NO_GROUP ? DT_OK : comm_make(MPI_COMM_NULL, 0, 0, out);
    MPI_Comm nc;
    uint64_t fid = dtc_rec_begin(c, DT_FOP_SPLIT, 0, -1, 1);
    dt_status st = dtc_mpi(
        &c->fg, MPI_Comm_split(c->user, color == DT_COMM_NO_GROUP ? MPI_UNDEFINED : color, key, &nc), "MPI_Comm_split");
    dtc_watch_end(fid, !st);
    if (st) {
        st = dt_fail(st, "split: %s", c->fg.err);
        c->fg.err[0] = 0;
        return st;
    }
    if (nc == MPI_COMM_NULL) return DT_OK;
    st = comm_make(nc, 1, c->threads, out);
    if (!st) { /* a flight-recorder slot every member agrees on: the highest next free one */
        dt_comm *n = *out;
        int slot = g_next_slot;
        if (MPI_Allreduce(MPI_IN_PLACE, &slot, 1, MPI_INT, MPI_MAX, n->user) == MPI_SUCCESS) {
            g_next_slot = slot + 1;
            if (slot < DT_FLIGHT_MAX_COMMS) {
                n->fl.slot = slot;
                dtc_watch_register(slot, n->size, n->world_of);
            }
        }
        snprintf(n->name, sizeof n->name, "%s", "split");
    }
    if (!st) memcpy((*out)->algo, c->algo, sizeof c->algo);
    if (!st && !(*out)->fg.one_node)
        for (int k = 0; k < DT_COLL_N; k++)
            if ((*out)->algo[k] == DT_ALGO_SHM) (*out)->algo[k] = DT_ALGO_MPI;
    return st;
}
