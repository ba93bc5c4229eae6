/* The flight recorder's ring (src/comm/flight_recorder.h) and the launcher's per-rank
 * heartbeats (src/launch/heartbeat.h), as pure logic: per-communicator sequence numbers
 * (collectives and point-to-point apart) published for peers, the overdue record (only
 * what the rank blocks on counts, the longest wait first), the ring's wrap (overwritten
 * records are neither found nor changed), which members have not arrived, the texts of
 * the diagnosis and the dump; the beats' files and the launcher's verdict naming the rank
 * that stopped first. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/flight_recorder.h"
#include "launch/heartbeat.h"

static dt_flight_book g_a, g_b, g_c;

int main(void) {
    dt_flight_book *b = &g_a;
    dt_flight_book_init(b, 3, 1234);
    dt_flight_comm dp = {5, 2, "dp", 0, 0}, tp = {6, 2, "tp", 0, 0};
    atomic_store(&b->step, 7);
    atomic_store(&b->micro, 0);
    uint64_t a1 = dt_flight_begin(b, &dp, DT_FOP_ALLREDUCE, 2100000, -1, 1, 10.0);
    uint64_t t1 = dt_flight_begin(b, &tp, DT_FOP_ALLGATHER, 64, -1, 0, 10.5);
    uint64_t s1 = dt_flight_begin(b, &dp, DT_FOP_SEND, 16, 1, 0, 11.0);
    uint64_t a2 = dt_flight_begin(b, &dp, DT_FOP_REDUCE_SCATTER, 8, -1, 0, 12.0);
    CHECK(a1 == 1 && t1 == 2 && s1 == 3 && a2 == 4, "record ids %llu %llu %llu %llu", (unsigned long long)a1,
          (unsigned long long)t1, (unsigned long long)s1, (unsigned long long)a2);
    const dt_flight_rec *r = dt_flight_find(b, a2);
    CHECK(r && r->seq == 2 && dp.coll_seq == 2 && dp.p2p_seq == 1, "dp: collectives #1, #2, p2p #1 apart");
    CHECK(dt_flight_find(b, s1)->seq == 1 && dt_flight_find(b, s1)->peer == 1, "p2p numbered on its own, with its peer");
    CHECK(atomic_load(&b->entered[5]) == 2 && atomic_load(&b->entered[6]) == 1, "entered counts published per slot");

    /* overdue: only what the rank blocks on, from when it began to block */
    CHECK(dt_flight_overdue(b, 15.0, 10.0, 0.0) == NULL, "nothing waited 10 s yet");
    CHECK(dt_flight_overdue(b, 20.5, 10.0, 0.0) == dt_flight_find(b, a1), "the blocking all-reduce waited 10.5 s");
    dt_flight_end(b, a1, 1, 20.6);
    CHECK(dt_flight_overdue(b, 100.0, 10.0, 0.0) == NULL, "issued but not waited on: not overdue");
    dt_flight_waiting(b, a2, 30.0);
    dt_flight_waiting(b, t1, 35.0);
    dt_flight_waiting(b, a2, 39.0); /* the first wait counts */
    CHECK(dt_flight_overdue(b, 41.0, 10.0, 0.0) == dt_flight_find(b, a2), "the longest wait: reduce-scatter since 30 s");
    CHECK(dt_flight_overdue(b, 41.0, 10.0, 35.0) == NULL, "a stopped process's own wait counts from its resumption");
    dt_flight_end(b, a2, 1, 41.0);
    CHECK(dt_flight_overdue(b, 41.0, 10.0, 0.0) == NULL, "t1 waited 6 s only");
    CHECK(dt_flight_overdue(b, 46.0, 10.0, 0.0) == dt_flight_find(b, t1), "then the all-gather");
    dt_flight_end(b, t1, 0, 46.0);
    CHECK(atomic_load(&dt_flight_find(b, t1)->state) == DT_FREC_FAILED, "failed state kept");

    char d[256];
    dt_flight_describe(dt_flight_find(b, a1), d, sizeof d);
    CHECK(!strcmp(d, "all-reduce #1 on dp group (2 ranks, 2.1 MB) at step 7 micro-step 0"), "describe: %s", d);
    dt_flight_describe(dt_flight_find(b, s1), d, sizeof d);
    CHECK(!strcmp(d, "send #1 to rank 1 on dp group (2 ranks, 16 B) at step 7 micro-step 0"), "describe p2p: %s", d);
    atomic_store(&b->micro, -1);
    atomic_store(&b->step, 0);
    uint64_t x = dt_flight_begin(b, &tp, DT_FOP_BARRIER, 0, -1, 1, 50.0);
    dt_flight_describe(dt_flight_find(b, x), d, sizeof d);
    CHECK(!strcmp(d, "barrier #2 on tp group (2 ranks, 0 B) before the first step"), "describe setup: %s", d);
    atomic_store(&b->step, 9);
    x = dt_flight_begin(b, &tp, DT_FOP_ALLREDUCE, 1500, -1, 1, 50.0);
    dt_flight_describe(dt_flight_find(b, x), d, sizeof d);
    CHECK(!strcmp(d, "all-reduce #3 on tp group (2 ranks, 1.5 kB) after step 9"), "describe after a step: %s", d);
    CHECK(dt_flight_last(b) == dt_flight_find(b, x), "last record");

    /* the ring wraps: old records are gone, an end for one of them changes nothing */
    uint64_t first = 0, last = 0;
    for (int i = 0; i < DT_FLIGHT_RING + 10; i++) {
        last = dt_flight_begin(b, &dp, DT_FOP_ALLREDUCE, 4, -1, 0, 60.0);
        if (!first) first = last;
    }
    CHECK(dt_flight_find(b, first) == NULL && dt_flight_find(b, a1) == NULL, "overwritten records are not found");
    CHECK(dt_flight_find(b, last) && dt_flight_find(b, last)->seq == dp.coll_seq, "the newest is");
    const dt_flight_rec *heir = dt_flight_find(b, first + DT_FLIGHT_RING);
    dt_flight_end(b, first, 1, 61.0);
    CHECK(heir && atomic_load(&heir->state) == DT_FREC_STARTED, "ending an overwritten record leaves its slot's new one");
    dt_flight_waiting(b, last, 62.0);
    CHECK(dt_flight_overdue(b, 73.0, 10.0, 0.0) == dt_flight_find(b, last), "a wait after the wrap is found");

    /* who has not arrived: member 2 entered one collective less on slot 5; member 3 unknown */
    dt_flight_book_init(&g_b, 4, 1);
    dt_flight_book_init(&g_c, 5, 2);
    dt_flight_comm dp_b = {5, 3, "dp", 0, 0}, dp_c = {5, 3, "dp", 0, 0};
    for (int i = 0; i < 3; i++) dt_flight_begin(&g_b, &dp_b, DT_FOP_ALLREDUCE, 4, -1, 1, 1.0);
    for (int i = 0; i < 2; i++) dt_flight_begin(&g_c, &dp_c, DT_FOP_ALLREDUCE, 4, -1, 1, 1.0);
    const dt_flight_book *books[4] = {&g_b, &g_b, &g_c, NULL};
    int late[4];
    int k = dt_flight_late(books, 4, 5, 3, late);
    CHECK(k == 1 && late[0] == 0 && late[1] == 0 && late[2] == 1 && late[3] == -1, "late: %d [%d %d %d %d]", k, late[0],
          late[1], late[2], late[3]);
    CHECK(dt_flight_late(books, 4, -1, 3, late) == 0 && late[0] == -1, "an uncounted communicator: unknown");

    /* the dump: a header, a column line, one line per record kept */
    FILE *f = tmpfile();
    dt_flight_dump(f, &g_c, 5.0);
    rewind(f);
    char line[512];
    int lines = 0, hdr = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        if (strstr(line, "# flight recorder of rank 5 (pid 2): records 1..2")) hdr++;
    }
    fclose(f);
    CHECK(lines == 4 && hdr == 1, "dump: %d lines", lines);

    /* heartbeats: each rank's file, read back in rank order; the verdict names the rank
     * that stopped first */
    char dir[] = "/tmp/dtrain-beat-test.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("DTRAIN_HEARTBEAT", dir, 1);
    dt_heartbeat(3, 2);
    dt_heartbeat(4, 2);
    FILE *o = fopen(strcat(strcpy(line, dir), "/rank.0"), "w");
    fprintf(o, "step 5 pid 77\n");
    fclose(o);
    dt_beat beats[8];
    int nb = dt_heartbeat_read(dir, beats, 8);
    CHECK(nb == 2 && beats[0].rank == 0 && beats[0].step == 5 && beats[0].pid == 77 && beats[1].rank == 2 &&
              beats[1].step == 4 && beats[1].pid == (int)getpid() && beats[1].mtime > 0,
          "read %d beats", nb);
    dt_heartbeat_clear(dir);
    CHECK(dt_heartbeat_read(dir, beats, 8) == 0, "cleared");
    rmdir(dir);

    dt_beat v[3] = {{0, 5, 0, 100.0, 0}, {1, 4, 0, 99.0, 0}, {2, 5, 0, 100.2, 0}};
    char msg[512];
    CHECK(!dt_heartbeat_verdict(v, 3, 50.0, 101.5, 3.0, msg, sizeof msg), "every beat fresh: not hung");
    CHECK(!dt_heartbeat_verdict(v, 3, 200.0, 300.0, 3.0, msg, sizeof msg), "no beat since the start: not armed");
    CHECK(dt_heartbeat_verdict(v, 3, 50.0, 102.5, 3.0, msg, sizeof msg) &&
              !strcmp(msg, "no heartbeat for 4 s from rank 1 (last step 4), stopped first; the others: rank 0 at step 5 "
                           "(2 s ago), rank 2 at step 5 (2 s ago)"),
          "verdict: %s", msg);
    CHECK(dt_heartbeat_verdict(v, 3, 50.0, 110.0, 3.0, msg, sizeof msg) && strstr(msg, "from rank 1 (last step 4)"),
          "all stale: still the one behind: %s", msg);
    dt_beat same[2] = {{0, 5, 0, 100.0, 0}, {1, 5, 0, 100.0, 0}};
    CHECK(dt_heartbeat_verdict(same, 2, 50.0, 110.0, 3.0, msg, sizeof msg) &&
              !strcmp(msg, "no heartbeat for 10 s from ranks 0, 1 (last step 5)"),
          "all at one step: %s", msg);
    return check_finish();
}
