/* Communicator in a world of one without MPI (a process not started by mpirun): sends to
 * self matched to receives from self by tag in posting order, the errors for a mismatch
 * and for waiting on an unmatched one, gather, the new dtype and reduction as local
 * no-ops/copies, and split with no group. (Multi-rank behaviour: mpi_test_comm.c.) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"

static void test_self_p2p(dt_comm *w) {
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {0}, c[5] = {0};
    dt_request *rs = NULL, *rr = NULL, *rs2 = NULL, *rr2 = NULL;
    int done = -1;
    /* send first, then the receive */
    CHECK(dt_isend(w, a, 5, DT_F32, 0, 3, &rs) == DT_OK && rs, "isend to self");
    CHECK(dt_test(rs, &done) == DT_OK && done == 0, "unmatched send reported done (%d)", done);
    CHECK(dt_irecv(w, b, 5, DT_F32, 0, 3, &rr) == DT_OK && rr, "irecv from self");
    CHECK(dt_test(rs, &done) == DT_OK && done == 1, "matched send not done");
    CHECK(dt_wait(rr) == DT_OK && dt_wait(rs) == DT_OK, "wait");
    CHECK(memcmp(a, b, sizeof a) == 0, "data not delivered");
    /* receives first; matched by tag, and in posting order within a tag */
    memset(b, 0, sizeof b);
    uint16_t h[2] = {0x3f80, 0x4000}, g = 0;
    CHECK(dt_irecv(w, b, 5, DT_F32, 0, 7, &rr) == DT_OK, "irecv tag 7");
    CHECK(dt_irecv(w, &g, 1, DT_BF16, 0, 8, &rr2) == DT_OK, "irecv tag 8");
    CHECK(dt_irecv(w, c, 5, DT_F32, 0, 7, &rs2) == DT_OK, "second irecv tag 7");
    CHECK(dt_isend(w, &h[1], 1, DT_BF16, 0, 8, &rs) == DT_OK, "isend tag 8");
    CHECK(dt_test(rr2, &done) == DT_OK && done == 1 && g == 0x4000, "tag 8: done %d, got %#x", done, g);
    CHECK(dt_test(rr, &done) == DT_OK && done == 0, "tag 7 matched a tag 8 send");
    CHECK(dt_wait(rs) == DT_OK && dt_wait(rr2) == DT_OK, "wait tag 8");
    float a2[5] = {6, 7, 8, 9, 10};
    CHECK(dt_isend(w, a, 5, DT_F32, 0, 7, &rs) == DT_OK, "isend tag 7");
    dt_request *rs3 = NULL;
    CHECK(dt_isend(w, a2, 5, DT_F32, 0, 7, &rs3) == DT_OK, "second isend tag 7");
    CHECK(dt_wait(rs2) == DT_OK && dt_wait(rr) == DT_OK && dt_wait(rs) == DT_OK && dt_wait(rs3) == DT_OK,
          "wait tag 7");
    CHECK(memcmp(b, a, sizeof a) == 0 && memcmp(c, a2, sizeof a2) == 0, "tag 7: out of order (%g, %g)", b[0], c[0]);
    /* zero elements */
    CHECK(dt_isend(w, NULL, 0, DT_F64, 0, 1, &rs) == DT_OK && dt_irecv(w, NULL, 0, DT_F64, 0, 1, &rr) == DT_OK,
          "empty message");
    CHECK(dt_wait(rs) == DT_OK && dt_wait(rr) == DT_OK, "wait empty");
    /* counts differ: the second call fails; the first stays unmatched, and waiting on it fails */
    dt_error_clear();
    CHECK(dt_isend(w, a, 5, DT_F32, 0, 2, &rs) == DT_OK, "isend");
    rr = NULL;
    CHECK(dt_irecv(w, b, 4, DT_F32, 0, 2, &rr) == DT_EINPUT && !rr, "count mismatch accepted");
    CHECK(strstr(dt_error_message(), "5 x f32") && strstr(dt_error_message(), "4 x f32"), "message: %s",
          dt_error_message());
    dt_error_clear();
    CHECK(dt_wait(rs) == DT_ERUNTIME && strstr(dt_error_message(), "no matching receive"), "unmatched wait: %s",
          dt_error_message());
    dt_error_clear();
    /* the unmatched request is gone: a new receive does not match it */
    CHECK(dt_irecv(w, b, 5, DT_F32, 0, 2, &rr) == DT_OK && dt_test(rr, &done) == DT_OK && done == 0,
          "receive matched a send that was waited on");
    CHECK(dt_wait(rr) == DT_ERUNTIME && strstr(dt_error_message(), "no matching send"), "unmatched wait: %s",
          dt_error_message());
    dt_error_clear();
    /* blocking calls and other ranks: refused */
    CHECK(dt_isend(w, a, 1, DT_F32, 1, 0, &rs) == DT_EINPUT, "isend to rank 1 of 1 accepted");
    CHECK(dt_send(w, a, 1, DT_F32, 0, 0) == DT_EINPUT, "blocking send to self accepted");
    dt_error_clear();
}

static void test_local(dt_comm *w) {
    CHECK(dt_dtype_size(DT_BF16) == 2 && !strcmp(dt_dtype_name(DT_BF16), "bf16"), "bf16 size/name");
    double x[3] = {1, -2, 3}, y[3] = {0};
    CHECK(dt_gather(w, x, y, 3, DT_F64, 0) == DT_OK && memcmp(x, y, sizeof x) == 0, "gather of one");
    CHECK(dt_gather(w, y, y, 3, DT_F64, 0) == DT_OK && memcmp(x, y, sizeof x) == 0, "gather in place");
    CHECK(dt_gather(w, x, y, 3, DT_F64, 1) == DT_EINPUT, "gather to root 1 accepted");
    uint16_t h[2] = {0x3f80, 0xc000}, hr[2] = {0};
    CHECK(dt_allreduce(w, h, 2, DT_BF16, DT_MAX) == DT_OK && h[0] == 0x3f80 && h[1] == 0xc000, "max of one");
    CHECK(dt_allreduce(w, h, 2, DT_BF16, DT_AVG) == DT_OK && h[0] == 0x3f80 && h[1] == 0xc000, "mean of one");
    CHECK(dt_reduce_scatter(w, h, hr, 2, DT_BF16, DT_MAX) == DT_OK && !memcmp(h, hr, sizeof h), "reduce-scatter");
    CHECK(dt_reduce_scatter(w, hr, hr, 2, DT_BF16, DT_SUM) == DT_OK && !memcmp(h, hr, sizeof h),
          "reduce-scatter in place");
    dt_request *rq = NULL;
    CHECK(dt_ireduce_scatter(w, hr, hr, 2, DT_BF16, DT_AVG, &rq) == DT_OK && dt_wait(rq) == DT_OK &&
              !memcmp(h, hr, sizeof h),
          "non-blocking reduce-scatter in place");
    CHECK(dt_allreduce(w, h, 2, DT_BF16, (dt_redop)9) == DT_EINPUT, "reduction 9 accepted");
    dt_error_clear();
    dt_comm *s = NULL;
    CHECK(dt_comm_split(w, DT_COMM_NO_GROUP, 0, &s) == DT_OK && s == NULL, "split, no group");
    CHECK(dt_comm_split(w, 5, 0, &s) == DT_OK && s && dt_comm_size(s) == 1, "split");
    if (s) dt_comm_free(s);
}

int main(void) {
    unsetenv("OMPI_COMM_WORLD_SIZE"); /* a world without MPI even under a launcher */
    unsetenv("PMIX_RANK");
    unsetenv("PMI_SIZE");
    dt_comm *w = NULL;
    CHECK(dt_comm_init(&w, NULL, NULL) == DT_OK && w, "init");
    if (!w) return check_finish();
    CHECK(dt_comm_size(w) == 1 && dt_comm_rank(w) == 0, "size %d", dt_comm_size(w));
    test_self_p2p(w);
    test_local(w);
    dt_comm_finalize(w);
    return check_finish();
}
