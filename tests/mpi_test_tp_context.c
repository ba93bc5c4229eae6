/* Tensor parallelism's group lives in the model's context (gpt_tp_comm.ctx), not in the
 * process: two models attached to the same group in one process, one fp32 and one bf16,
 * each reduce in their own precision (a process-wide group would reduce the first one's
 * fp32 activations as the last attached model's bf16), each counts only its own
 * collectives' time, and each detaches on its own. A Llama model with fewer key/value
 * heads than ranks gets kv_sum over each head's replicas. A group of one leaves the paired
 * functions identities. Usage: mpirun -np N mpi_test_tp_context [SOURCE_DIR] */
#include <stdio.h>
#include <string.h>

#include "core/bf16.h"
#include "parallel/model_parallel/tensor_parallel.h"

#include "check.h"

enum { N = 5 };

int main(int argc, char **argv) {
    dt_comm *world = NULL;
    if (dt_comm_init(&world, &argc, &argv) != DT_OK) {
        fprintf(stderr, "mpi_test_tp_context: %s\n", dt_error_message());
        return 1;
    }
    g_rank = dt_comm_rank(world);
    int n = dt_comm_size(world);
    /* the paired functions only need the model's storage precision: no tensors here */
    gpt_model f32, bf16;
    memset(&f32, 0, sizeof f32);
    memset(&bf16, 0, sizeof bf16);
    f32.ops = dt_ops_cpu();
    bf16.ops = dt_ops_bf16_storage(dt_ops_cpu());
    CHECK(dt_tp_attach(&f32, world) == DT_OK && dt_tp_attach(&bf16, world) == DT_OK, "attach");
    CHECK(f32.tp_comm.allreduce && bf16.tp_comm.allreduce && f32.tp_comm.ctx != bf16.tp_comm.ctx,
          "each model its own context");
    CHECK(dt_tp_comm_seconds(&f32) == 0.0 && dt_tp_comm_seconds(&bf16) == 0.0, "no collective yet");
    if (f32.tp_comm.allreduce && bf16.tp_comm.allreduce) {
        /* fp32 activations of the model attached first: summed as fp32 */
        float x[N];
        for (int i = 0; i < N; i++) x[i] = (float)(g_rank + 1) * 0.5f + (float)i;
        CHECK(f32.tp_comm.allreduce(f32.tp_comm.ctx, x, N, GPT_TP_SUM) == DT_OK, "fp32 all-reduce");
        for (int i = 0; i < N; i++) {
            float want = 0.0f;
            for (int r = 0; r < n; r++) want += (float)(r + 1) * 0.5f + (float)i;
            CHECK(x[i] == want, "fp32 sum [%d] = %g, want %g", i, (double)x[i], (double)want);
        }
        CHECK(dt_tp_comm_seconds(&f32) > 0.0 && dt_tp_comm_seconds(&bf16) == 0.0,
              "time charged to the model that ran it (fp32 %g s, bf16 %g s)", dt_tp_comm_seconds(&f32),
              dt_tp_comm_seconds(&bf16));
        /* bf16 activations of the other: summed as bf16 (exact for these small integers) */
        uint16_t h[N];
        for (int i = 0; i < N; i++) h[i] = dt_f32_to_bf16((float)(g_rank + i));
        CHECK(bf16.tp_comm.allreduce(bf16.tp_comm.ctx, (float *)h, N, GPT_TP_SUM) == DT_OK, "bf16 all-reduce");
        for (int i = 0; i < N; i++) {
            float want = (float)(n * (n - 1) / 2 + n * i);
            CHECK(dt_bf16_to_f32(h[i]) == want, "bf16 sum [%d] = %g, want %g", i, (double)dt_bf16_to_f32(h[i]),
                  (double)want);
        }
        /* fp32 statistics of the bf16 model stay fp32 */
        float mx[2] = {(float)g_rank + 0.25f, -(float)g_rank};
        CHECK(bf16.tp_comm.allreduce(bf16.tp_comm.ctx, mx, 2, GPT_TP_MAX_F32) == DT_OK, "fp32 max");
        CHECK(mx[0] == (float)(n - 1) + 0.25f && mx[1] == 0.0f, "max %g %g", (double)mx[0], (double)mx[1]);
    }
    dt_tp_detach(&bf16);
    CHECK(!bf16.tp_comm.ctx && !bf16.tp_comm.allreduce && f32.tp_comm.ctx, "detached one model only");
    dt_tp_detach(&f32);
    CHECK(!f32.tp_comm.ctx && dt_tp_comm_seconds(&f32) == 0.0, "detached");
    CHECK(!f32.tp_comm.kv_sum, "no key/value replicas without a Llama shape");
    /* Llama's key/value heads replicated (n_kv_head below the group's size): kv_sum sums
     * over the ranks holding this rank's head, rank t holding head t / replicas */
    gpt_model kv;
    memset(&kv, 0, sizeof kv);
    kv.ops = dt_ops_cpu();
    kv.shape.family = GPT_FAMILY_LLAMA;
    kv.shape.n_kv_head = n % 2 == 0 && n > 2 ? n / 2 : 1;
    int r = n / kv.shape.n_kv_head;
    CHECK(dt_tp_attach(&kv, world) == DT_OK && kv.tp_comm.kv_sum && kv.tp_comm.allreduce, "attach with replicas");
    if (kv.tp_comm.kv_sum) {
        float x[N];
        for (int i = 0; i < N; i++) x[i] = (float)(g_rank + 1) + 10.0f * (float)i;
        CHECK(kv.tp_comm.kv_sum(kv.tp_comm.ctx, x, N) == DT_OK, "kv_sum");
        int first = g_rank / r * r;
        for (int i = 0; i < N; i++) {
            float want = 0.0f;
            for (int q = first; q < first + r; q++) want += (float)(q + 1) + 10.0f * (float)i;
            CHECK(x[i] == want, "kv_sum over %d replicas [%d] = %g, want %g", r, i, (double)x[i], (double)want);
        }
        CHECK(dt_tp_comm_seconds(&kv) > 0.0, "kv_sum's time charged");
    }
    dt_tp_detach(&kv);
    CHECK(!kv.tp_comm.ctx && !kv.tp_comm.kv_sum, "detached with replicas");
    /* a group of one: identities, nothing attached */
    dt_comm *self = NULL;
    CHECK(dt_comm_split(world, g_rank, 0, &self) == DT_OK, "split");
    if (self) {
        CHECK(dt_tp_attach(&f32, self) == DT_OK && !f32.tp_comm.allreduce && !f32.tp_comm.ctx, "group of one");
        dt_tp_detach(&f32);
        dt_comm_free(self);
    }
    double tot[2] = {g_pass, g_fail};
    if (dt_allreduce(world, tot, 2, DT_F64, DT_SUM) != DT_OK) tot[1] += 1;
    if (g_rank == 0) printf("%.0f passed, %.0f failed (%d ranks)\n", tot[0], tot[1], n);
    dt_comm_finalize(world);
    return tot[1] > 0 ? 1 : 0;
}
