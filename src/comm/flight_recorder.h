/* Flight recorder (as PyTorch's for NCCL): every collective and point-to-point a rank
 * issues gets a record (operation, communicator, bytes, training step and micro-step,
 * times, state) in a fixed ring of the last DT_FLIGHT_RING records, and each
 * communicator's collectives are numbered (the sequence number every member gives the
 * same call). The ring lives in one block of memory laid out here (dt_flight_book),
 * allocated once: the watchdog (watchdog.h) puts every rank's book in node-shared memory
 * so that a waiting rank can read a stuck peer's book without its help.
 *
 * This file is the pure logic: recording into a book, finding the record that has
 * waited too long, telling which members of a collective have not arrived, and the
 * text of the diagnosis and of the dump. No MPI, no allocation, no global state. */
#ifndef DT_FLIGHT_RECORDER_H
#define DT_FLIGHT_RECORDER_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DT_FLIGHT_RING 512      /* records kept per rank (a power of two) */
#define DT_FLIGHT_MAX_COMMS 64  /* communicators whose collectives other ranks can count */
#define DT_FLIGHT_GROUP_LEN 16

typedef enum {
    DT_FOP_ALLREDUCE,
    DT_FOP_REDUCE_SCATTER,
    DT_FOP_ALLGATHER,
    DT_FOP_BCAST,
    DT_FOP_REDUCE,
    DT_FOP_GATHER,
    DT_FOP_BARRIER,
    DT_FOP_AGREE,
    DT_FOP_SPLIT,
    DT_FOP_ALLOC_SHARED,
    DT_FOP_SEND,
    DT_FOP_RECV,
    DT_FOP_N
} dt_fop;

/* a record's state */
enum { DT_FREC_EMPTY, DT_FREC_STARTED, DT_FREC_DONE, DT_FREC_FAILED };

/* One operation. id is written last (release) and read first (acquire): a reader that
 * sees the id it expects sees the fields written before it. Times are CLOCK_MONOTONIC
 * seconds (one clock for every process of a node). */
typedef struct {
    _Atomic uint64_t id; /* 1-based record number of this rank; 0: empty */
    uint64_t seq;        /* the communicator's collective number (p2p: its own count) */
    uint64_t bytes;      /* of the largest buffer of the call */
    double t_start;      /* issued */
    _Atomic double t_wait; /* the caller began to block on it (0: not yet; blocking calls: t_start) */
    double t_end;
    int64_t step; /* training step (1-based; 0: before the first) */
    int32_t micro, op, comm_slot, comm_size;
    int32_t peer;            /* p2p: the peer's world rank; -1 for collectives */
    _Atomic int32_t state;   /* DT_FREC_* */
    char group[DT_FLIGHT_GROUP_LEN];
} dt_flight_rec;

/* Everything one rank publishes: its ring, the collectives it has entered per
 * communicator slot, where training is, and a sign of life its watchdog refreshes. */
typedef struct {
    int32_t world_rank, pid;
    _Atomic uint64_t next; /* records issued so far */
    _Atomic int64_t step;
    _Atomic int32_t micro;
    _Atomic double alive; /* CLOCK_MONOTONIC seconds of the watchdog's last tick (0: no watchdog) */
    _Atomic uint64_t entered[DT_FLIGHT_MAX_COMMS]; /* collective seq numbers entered, per comm slot */
    dt_flight_rec ring[DT_FLIGHT_RING];
} dt_flight_book;

/* What a record needs to know about its communicator. */
typedef struct {
    int slot; /* agreed by every member (0..DT_FLIGHT_MAX_COMMS-1), or -1: not counted */
    int size;
    const char *name;
    uint64_t coll_seq, p2p_seq; /* numbers given so far */
} dt_flight_comm;

const char *dt_fop_name(dt_fop op); /* "all-reduce", "send", ... */

/* Empties b for world rank `rank`. */
void dt_flight_book_init(dt_flight_book *b, int world_rank, int pid);
/* A new record (state started) for op on comm fc; collectives take the next sequence
 * number of fc and publish it in b->entered. peer: p2p peer (world rank), else -1.
 * waiting: the caller blocks on it from now (blocking calls). Returns its id. */
uint64_t dt_flight_begin(dt_flight_book *b, dt_flight_comm *fc, dt_fop op, size_t bytes, int peer, int waiting,
                         double now);
/* The caller begins to block on record id (dt_wait); ignored if it was overwritten. */
void dt_flight_waiting(dt_flight_book *b, uint64_t id, double now);
void dt_flight_end(dt_flight_book *b, uint64_t id, int ok, double now);
/* The record this rank has been blocking on longest, if that is longer than timeout
 * seconds, counting from not_before at the earliest (when this process was stopped, its
 * own wait does not count); NULL otherwise. */
const dt_flight_rec *dt_flight_overdue(const dt_flight_book *b, double now, double timeout, double not_before);
/* The record of book b with id `id`, or NULL if it has been overwritten. */
const dt_flight_rec *dt_flight_find(const dt_flight_book *b, uint64_t id);
/* b's newest record (NULL: none). */
const dt_flight_rec *dt_flight_last(const dt_flight_book *b);

/* The members of a collective that have not arrived: for each member i (books[i], NULL
 * where it cannot be read, e.g. on another node), late[i] = 1 when its count of entered
 * collectives on slot is below seq, 0 when it has arrived, -1 when unknown. Returns how
 * many are late. */
int dt_flight_late(const dt_flight_book *const *books, int n, int slot, uint64_t seq, int *late);

/* "all-reduce #12 on dp group (2 ranks, 2.1 MB) at step 7 micro-step 0" */
void dt_flight_describe(const dt_flight_rec *r, char *buf, size_t cap);
/* One line per record, oldest first, with times relative to now. */
void dt_flight_dump(FILE *f, const dt_flight_book *b, double now);

#endif
