/* The flight recorder's ring and its texts (see flight_recorder.h). The owner writes its
 * book; other threads and processes only read it, so a record's fields are plain stores
 * published by the release store of its id (and its state). */
#include "flight_recorder.h"

#include <string.h>

static const char *const g_fop_names[DT_FOP_N] = {
    "all-reduce", "reduce-scatter", "all-gather", "broadcast", "reduce", "gather",
    "barrier",    "agree",          "split",      "alloc-shared", "send", "recv",
};

const char *dt_fop_name(dt_fop op) { return (unsigned)op < DT_FOP_N ? g_fop_names[op] : "?"; }

void dt_flight_book_init(dt_flight_book *b, int world_rank, int pid) {
    memset(b, 0, sizeof *b);
    b->world_rank = world_rank;
    b->pid = pid;
}

static int is_p2p(int op) { return op == DT_FOP_SEND || op == DT_FOP_RECV; }

uint64_t dt_flight_begin(dt_flight_book *b, dt_flight_comm *fc, dt_fop op, size_t bytes, int peer, int waiting,
                         double now) {
    uint64_t id = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed) + 1;
    dt_flight_rec *r = &b->ring[(id - 1) % DT_FLIGHT_RING];
    atomic_store_explicit(&r->id, 0, memory_order_relaxed); /* readers skip it while it changes */
    atomic_thread_fence(memory_order_release);
    r->seq = is_p2p(op) ? ++fc->p2p_seq : ++fc->coll_seq;
    r->bytes = bytes;
    r->t_start = now;
    atomic_store_explicit(&r->t_wait, waiting ? now : 0.0, memory_order_relaxed);
    r->t_end = 0.0;
    r->step = atomic_load_explicit(&b->step, memory_order_relaxed);
    r->micro = atomic_load_explicit(&b->micro, memory_order_relaxed);
    r->op = (int32_t)op;
    r->comm_slot = fc->slot;
    r->comm_size = fc->size;
    r->peer = peer;
    atomic_store_explicit(&r->state, DT_FREC_STARTED, memory_order_relaxed);
    strncpy(r->group, fc->name ? fc->name : "?", sizeof r->group - 1);
    r->group[sizeof r->group - 1] = 0;
    atomic_store_explicit(&r->id, id, memory_order_release);
    /* published after the record: a peer that counts this rank as arrived finds it */
    if (!is_p2p(op) && fc->slot >= 0 && fc->slot < DT_FLIGHT_MAX_COMMS)
        atomic_store_explicit(&b->entered[fc->slot], fc->coll_seq, memory_order_release);
    return id;
}

static dt_flight_rec *rec_of(dt_flight_book *b, uint64_t id) {
    if (!id) return NULL;
    dt_flight_rec *r = &b->ring[(id - 1) % DT_FLIGHT_RING];
    return atomic_load_explicit(&r->id, memory_order_acquire) == id ? r : NULL;
}

const dt_flight_rec *dt_flight_find(const dt_flight_book *b, uint64_t id) {
    return rec_of((dt_flight_book *)b, id);
}

const dt_flight_rec *dt_flight_last(const dt_flight_book *b) {
    return dt_flight_find(b, atomic_load_explicit(&b->next, memory_order_acquire));
}

void dt_flight_waiting(dt_flight_book *b, uint64_t id, double now) {
    dt_flight_rec *r = rec_of(b, id);
    if (r && atomic_load_explicit(&r->t_wait, memory_order_relaxed) == 0.0)
        atomic_store_explicit(&r->t_wait, now, memory_order_release);
}

void dt_flight_end(dt_flight_book *b, uint64_t id, int ok, double now) {
    dt_flight_rec *r = rec_of(b, id);
    if (!r) return;
    r->t_end = now;
    atomic_store_explicit(&r->state, ok ? DT_FREC_DONE : DT_FREC_FAILED, memory_order_release);
}

const dt_flight_rec *dt_flight_overdue(const dt_flight_book *b, double now, double timeout, double not_before) {
    const dt_flight_rec *worst = NULL;
    double since = 0.0;
    for (int i = 0; i < DT_FLIGHT_RING; i++) {
        const dt_flight_rec *r = &b->ring[i];
        if (!atomic_load_explicit(&r->id, memory_order_acquire)) continue;
        if (atomic_load_explicit(&r->state, memory_order_acquire) != DT_FREC_STARTED) continue;
        double w = atomic_load_explicit(&r->t_wait, memory_order_acquire);
        if (w > 0.0 && now - (w > not_before ? w : not_before) > timeout && (!worst || w < since)) {
            worst = r;
            since = w;
        }
    }
    return worst;
}

int dt_flight_late(const dt_flight_book *const *books, int n, int slot, uint64_t seq, int *late) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!books[i] || slot < 0 || slot >= DT_FLIGHT_MAX_COMMS) {
            late[i] = -1;
            continue;
        }
        late[i] = atomic_load_explicit(&books[i]->entered[slot], memory_order_acquire) < seq;
        k += late[i];
    }
    return k;
}

static void human_bytes(uint64_t v, char *buf, size_t cap) {
    if (v < 1000) snprintf(buf, cap, "%llu B", (unsigned long long)v);
    else if (v < 1000000) snprintf(buf, cap, "%.1f kB", (double)v / 1e3);
    else if (v < 1000000000) snprintf(buf, cap, "%.1f MB", (double)v / 1e6);
    else snprintf(buf, cap, "%.2f GB", (double)v / 1e9);
}

void dt_flight_describe(const dt_flight_rec *r, char *buf, size_t cap) {
    char bytes[32], peer[32] = "";
    human_bytes(r->bytes, bytes, sizeof bytes);
    if (r->op == DT_FOP_SEND) snprintf(peer, sizeof peer, " to rank %d", (int)r->peer);
    if (r->op == DT_FOP_RECV) snprintf(peer, sizeof peer, " from rank %d", (int)r->peer);
    int n = snprintf(buf, cap, "%s #%llu%s on %s group (%d rank%s, %s)", dt_fop_name((dt_fop)r->op),
                     (unsigned long long)r->seq, peer, r->group, (int)r->comm_size, r->comm_size == 1 ? "" : "s", bytes);
    if (n < 0 || (size_t)n >= cap) return;
    if (r->step > 0 && r->micro >= 0)
        snprintf(buf + n, cap - (size_t)n, " at step %lld micro-step %d", (long long)r->step, (int)r->micro);
    else if (r->step > 0) snprintf(buf + n, cap - (size_t)n, " after step %lld", (long long)r->step);
    else snprintf(buf + n, cap - (size_t)n, " before the first step");
}

static const char *state_name(int s) {
    return s == DT_FREC_STARTED ? "started" : s == DT_FREC_DONE ? "completed" : s == DT_FREC_FAILED ? "failed" : "empty";
}

void dt_flight_dump(FILE *f, const dt_flight_book *b, double now) {
    uint64_t next = atomic_load_explicit(&b->next, memory_order_acquire);
    uint64_t first = next > DT_FLIGHT_RING ? next - DT_FLIGHT_RING + 1 : 1;
    fprintf(f, "# flight recorder of rank %d (pid %d): records %llu..%llu, step %lld micro-step %d\n",
            (int)b->world_rank, (int)b->pid, (unsigned long long)first, (unsigned long long)next,
            (long long)atomic_load(&b->step), (int)atomic_load(&b->micro));
    fprintf(f, "# id\top\tseq\tgroup\tranks\tpeer\tbytes\tstep\tmicro\tstate\tstarted_s_ago\twaited_s\ttook_s\n");
    for (uint64_t id = first; id <= next; id++) {
        const dt_flight_rec *r = dt_flight_find(b, id);
        if (!r) continue;
        int st = atomic_load_explicit(&r->state, memory_order_acquire);
        double w = atomic_load_explicit(&r->t_wait, memory_order_acquire);
        double waited = w > 0.0 ? (st == DT_FREC_STARTED ? now : r->t_end) - w : 0.0;
        fprintf(f, "%llu\t%s\t%llu\t%s\t%d\t%d\t%llu\t%lld\t%d\t%s\t%.3f\t%.3f\t", (unsigned long long)id,
                dt_fop_name((dt_fop)r->op), (unsigned long long)r->seq, r->group, (int)r->comm_size, (int)r->peer,
                (unsigned long long)r->bytes, (long long)r->step, (int)r->micro, state_name(st), now - r->t_start,
                waited);
        if (st == DT_FREC_STARTED) fprintf(f, "-\n");
        else fprintf(f, "%.6f\n", r->t_end - r->t_start);
    }
}
