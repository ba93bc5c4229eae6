/* The communication watchdog (watchdog.h): the node-shared books, the thread that
 * watches this rank's book, and the diagnosis it prints when a wait outlasts
 * comm.timeout. */

#include "watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/timer.h"
#include "comm_internal.h"

/* Before dtc_watch_open, and where no shared window can be had: a private book. */
static dt_flight_book g_private;
static dt_flight_book *g_book = &g_private;
static int g_rank, g_size = 1;
static MPI_Comm g_node = MPI_COMM_NULL;
static MPI_Win g_win = MPI_WIN_NULL;
static const dt_flight_book **g_peers; /* world rank -> its book when on this node, else NULL */

/* communicator slot -> members (world ranks), under g_mu */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { int size; const int *world_of; } g_members[DT_FLIGHT_MAX_COMMS];

static pthread_t g_thr;
static int g_thr_on;
static pthread_mutex_t g_tmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_tcv = PTHREAD_COND_INITIALIZER;
static int g_stop;
static double g_timeout;
static char g_dump[1024];

void dtc_watch_open(MPI_Comm world, int rank, int size) {
    g_rank = rank;
    g_size = size;
    dt_flight_book_init(&g_private, rank, (int)getpid());
    if (world == MPI_COMM_NULL || size < 2) return;
    g_peers = calloc((size_t)size, sizeof *g_peers);
    if (!g_peers) return;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &g_node) != MPI_SUCCESS) {
        g_node = MPI_COMM_NULL;
        return;
    }
    MPI_Comm_set_errhandler(g_node, MPI_ERRORS_RETURN);
    int ln = 1;
    MPI_Comm_size(g_node, &ln);
    size_t bytes = (sizeof(dt_flight_book) + 4095u) / 4096u * 4096u;
    dt_flight_book *mine = NULL;
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    int rc = MPI_Win_allocate_shared((MPI_Aint)bytes, 1, info, g_node, &mine, &g_win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) { /* every rank of the node fails alike: private books */
        g_win = MPI_WIN_NULL;
        g_peers[rank] = &g_private;
        return;
    }
    dt_flight_book_init(mine, rank, (int)getpid());
    g_book = mine;
    MPI_Barrier(g_node); /* every book names its rank */
    for (int q = 0; q < ln; q++) {
        MPI_Aint sz;
        int du;
        void *p = NULL;
        if (MPI_Win_shared_query(g_win, q, &sz, &du, &p) != MPI_SUCCESS || !p) continue;
        const dt_flight_book *b = p;
        if (b->world_rank >= 0 && b->world_rank < size) g_peers[b->world_rank] = b;
    }
}

static void stop_thread(void) {
    if (!g_thr_on) return;
    pthread_mutex_lock(&g_tmu);
    g_stop = 1;
    pthread_cond_signal(&g_tcv);
    pthread_mutex_unlock(&g_tmu);
    pthread_join(g_thr, NULL);
    g_thr_on = 0;
}

void dtc_watch_close(void) {
    stop_thread();
    if (g_win != MPI_WIN_NULL) {
        g_private = *g_book; /* records made after this (none expected) still have a home */
        g_book = &g_private;
        MPI_Win_free(&g_win);
    }
    if (g_node != MPI_COMM_NULL) MPI_Comm_free(&g_node);
    free(g_peers);
    g_peers = NULL;
}

void dtc_watch_register(int slot, int size, const int *world_of) {
    if (slot < 0 || slot >= DT_FLIGHT_MAX_COMMS) return;
    pthread_mutex_lock(&g_mu);
    g_members[slot].size = size;
    g_members[slot].world_of = world_of;
    pthread_mutex_unlock(&g_mu);
}

void dtc_watch_forget(int slot) { dtc_watch_register(slot, 0, NULL); }

uint64_t dtc_watch_begin(dt_flight_comm *fc, dt_fop op, size_t bytes, int peer_world, int waiting) {
    return dt_flight_begin(g_book, fc, op, bytes, peer_world, waiting, dt_now());
}
void dtc_watch_waiting(uint64_t id) { dt_flight_waiting(g_book, id, dt_now()); }
void dtc_watch_end(uint64_t id, int ok) { dt_flight_end(g_book, id, ok, dt_now()); }

void dt_watchdog_step(long long step, int micro) {
    atomic_store_explicit(&g_book->step, step, memory_order_relaxed);
    atomic_store_explicit(&g_book->micro, micro, memory_order_relaxed);
}
void dt_watchdog_micro(int micro) { atomic_store_explicit(&g_book->micro, micro, memory_order_relaxed); }
const char *dt_watchdog_dump_path(void) { return g_dump; }

/* ---- the diagnosis ---- */

typedef struct {
    char *p;
    size_t left;
} sbuf;
static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->left < 2) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p, b->left, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t k = (size_t)n < b->left ? (size_t)n : b->left - 1;
    b->p += k;
    b->left -= k;
}

/* ", no sign of life for 12 s" when rank w's watchdog has stopped ticking (a stopped or
 * killed process), else "" */
static void life_of(sbuf *b, int w, double now) {
    const dt_flight_book *pb = g_peers ? g_peers[w] : NULL;
    double alive = pb ? atomic_load(&pb->alive) : 0.0;
    if (alive > 0.0 && now - alive > 1.0) put(b, "; its process shows no sign of life for %.0f s (stopped?)", now - alive);
}

/* "(its last op: all-reduce #11 on dp group ..., completed)" */
static void last_of(sbuf *b, int w, double now) {
    const dt_flight_book *pb = g_peers ? g_peers[w] : NULL;
    if (!pb) return;
    const dt_flight_rec *l = dt_flight_last(pb);
    char d[256];
    if (l) {
        dt_flight_describe(l, d, sizeof d);
        int st = atomic_load(&l->state);
        put(b, " (its last op: %s, %s", d,
            st == DT_FREC_STARTED ? "still in it" : st == DT_FREC_DONE ? "completed" : "failed");
    } else {
        put(b, " (no op yet");
    }
    life_of(b, w, now);
    put(b, ")");
}

/* "rank 2 has not arrived (...)" or what is known instead; books to dump in *extra */
static void who(sbuf *b, const dt_flight_rec *r, double now, int *extra, int *nextra) {
    *nextra = 0;
    if (r->op == DT_FOP_SEND || r->op == DT_FOP_RECV) {
        put(b, "waiting for rank %d", (int)r->peer);
        last_of(b, r->peer, now);
        if (r->peer >= 0 && r->peer < g_size) extra[(*nextra)++] = r->peer;
        return;
    }
    pthread_mutex_lock(&g_mu);
    int n = r->comm_slot >= 0 && r->comm_slot < DT_FLIGHT_MAX_COMMS ? g_members[r->comm_slot].size : 0;
    const int *wof = n ? g_members[r->comm_slot].world_of : NULL;
    enum { MAXN = 4096 };
    if (n > MAXN) n = MAXN;
    static const dt_flight_book *books[MAXN];
    static int late[MAXN], members[MAXN];
    for (int i = 0; i < n; i++) {
        members[i] = wof[i];
        books[i] = g_peers && wof[i] >= 0 && wof[i] < g_size ? g_peers[wof[i]] : NULL;
    }
    pthread_mutex_unlock(&g_mu);
    if (!n) {
        put(b, "the members of the group are unknown");
        return;
    }
    int k = dt_flight_late(books, n, r->comm_slot, r->seq, late), unknown = 0;
    for (int i = 0; i < n; i++) unknown += late[i] < 0;
    if (k > 0) {
        put(b, "rank%s", k > 1 ? "s" : "");
        for (int i = 0, j = 0; i < n; i++)
            if (late[i] == 1) put(b, "%s %d", j++ ? "," : "", members[i]);
        put(b, " %s not arrived", k > 1 ? "have" : "has");
        for (int i = 0, j = 0; i < n && j < 4; i++)
            if (late[i] == 1) {
                if (k > 1) put(b, "%s rank %d", j ? ";" : ":", members[i]);
                last_of(b, members[i], now);
                extra[(*nextra)++] = members[i];
                j++;
            }
    } else if (!unknown) {
        put(b, "every rank has arrived, so one stopped inside it or the transport failed");
        for (int i = 0; i < n; i++) {
            const dt_flight_book *pb = books[i];
            double alive = pb ? atomic_load(&pb->alive) : 0.0;
            if (members[i] != g_rank && alive > 0.0 && now - alive > 1.0 && *nextra < 4) {
                put(b, "; rank %d shows no sign of life for %.0f s (stopped?)", members[i], now - alive);
                extra[(*nextra)++] = members[i];
            }
        }
    }
    if (unknown) {
        put(b, "%srank%s", k > 0 ? "; " : "", unknown > 1 ? "s" : "");
        for (int i = 0, j = 0; i < n; i++)
            if (late[i] < 0) put(b, "%s %d", j++ ? "," : "", members[i]);
        put(b, " (on other nodes) cannot be inspected");
    }
}

static void dump(const dt_flight_rec *r, const char *line, const int *extra, int nextra, double now) {
    FILE *f = fopen(g_dump, "w");
    if (!f) { /* e.g. the metrics' directory is not on this node */
        snprintf(g_dump, sizeof g_dump, "/tmp/dtrain-flight-rank%d.tsv", g_rank);
        f = fopen(g_dump, "w");
    }
    if (!f) return;
    fprintf(f, "# %s\n", line);
    (void)r;
    dt_flight_dump(f, g_book, now);
    for (int i = 0; i < nextra; i++)
        if (g_peers && g_peers[extra[i]] && extra[i] != g_rank) {
            fprintf(f, "\n");
            dt_flight_dump(f, g_peers[extra[i]], now);
        }
    fclose(f);
}

static void diagnose(const dt_flight_rec *r, double now) {
    char line[2048], d[256];
    int extra[8], nextra = 0;
    dt_flight_describe(r, d, sizeof d);
    sbuf b = {line, sizeof line};
    put(&b, "comm: %s waited %.1f s (comm.timeout %g s): ", d, now - atomic_load(&r->t_wait), g_timeout);
    who(&b, r, now, extra, &nextra);
    dump(r, line, extra, nextra, now);
    /* one write: lines of ranks that time out together do not interleave */
    char out[2400];
    int n = snprintf(out, sizeof out, "dtrain: error: rank %d: %s; flight recorder: %s\n", g_rank, line, g_dump);
    if (n > 0) (void)!write(2, out, (size_t)n < sizeof out ? (size_t)n : sizeof out - 1);
    _exit(DT_ERUNTIME); /* the process: mpirun ends the other ranks */
}

static void *watch(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the trainer's */
    double tick = g_timeout / 20 < 0.1 ? g_timeout / 20 : 0.1;
    if (tick < 0.005) tick = 0.005;
    /* a tick far later than due: this process was stopped (SIGSTOP, a debugger) and its
     * peers may have timed out on it; its own waits count from now */
    double last = dt_now(), since = 0.0;
    pthread_mutex_lock(&g_tmu);
    while (!g_stop) {
        double now = dt_now();
        if (now - last > 1.0 + 10 * tick) since = now;
        last = now;
        atomic_store_explicit(&g_book->alive, now, memory_order_relaxed);
        const dt_flight_rec *r = dt_flight_overdue(g_book, now, g_timeout, since);
        if (r) diagnose(r, now);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + (long long)(tick * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&g_tcv, &g_tmu, &ts);
    }
    pthread_mutex_unlock(&g_tmu);
    return NULL;
}

dt_status dt_watchdog_arm(double timeout, const char *dump_dir) {
    stop_thread();
    g_stop = 0;
    g_timeout = timeout;
    const char *dir = getenv("DTRAIN_FLIGHT_DIR"); /* the user's choice, else next to the metrics */
    if (!dir || !*dir) dir = dump_dir;
    if (!dir || !*dir) dir = "/tmp";
    snprintf(g_dump, sizeof g_dump, "%s/dtrain-flight-rank%d.tsv", dir, g_rank);
    if (timeout <= 0.0 || g_size < 2) return DT_OK;
    if (pthread_create(&g_thr, NULL, watch, NULL) != 0)
        return dt_fail(DT_ERUNTIME, "comm.timeout: cannot start the watchdog thread");
    g_thr_on = 1;
    return DT_OK;
}
