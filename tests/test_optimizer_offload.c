/* The optimizer with its state offloaded (optim/optimizer.h, offload/store.h) against the
 * same optimizer in the backend's memory: for fp32 and bf16 storage, on the CPU and the
 * emulated device, with the state in host memory and in a file (small blocks, so a pass
 * crosses many), and with the parameters themselves on the host (ZeRO-3's offloaded
 * shard): after three steps over ranges larger than a chunk of the host pass (2^18
 * elements), with a gap (a frozen tensor) and both decay settings, the parameters, the
 * fp32 weights and both moments are the same bits. The delayed update (delayed_update.c)
 * against the exact one on gradients that do not depend on the weights: after a delayed
 * step the parameters are the exact run's of the step before, after a step not delayed
 * its own, and the state is the exact run's once settled. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ops.h"
#include "check.h"
#include "core/bf16.h"
#include "optim/optimizer.h"

enum { N = 600000, GAP0 = 280000, GAP1 = 290000 }; /* [GAP0, GAP1) is never updated */

static float uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0) - 0.5f;
}

/* host fp32 values into the backend's memory in storage precision */
static void put(const dt_ops *ops, void *dst, const float *src, size_t n) {
    if (!ops->bf16) {
        ops->upload(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = dt_f32_to_bf16(src[i]);
    ops->upload(dst, h, n * sizeof *h);
    free(h);
}

static const dt_adamw_hparams HP = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

/* An offload store of the kind in the working directory: 64 KiB blocks, 3 buffers. */
static dt_store_opts store_of(dt_store_kind kind, const char *tag) {
    return (dt_store_opts){.kind = kind, .dir = ".", .tag = tag, .block_bytes = 64 << 10, .buffers = 3};
}

/* The same random weights (from *seed) into a's parameters pa and b's pb. */
static void set_both(dt_optimizer *a, dt_optimizer *b, float *pa, float *pb, float *host, uint64_t *seed,
                     const char *label) {
    for (size_t i = 0; i < N; i++) host[i] = uniform(seed);
    CHECK(dt_optimizer_set_weights(a, 0, N, host, pa) == DT_OK && dt_optimizer_set_weights(b, 0, N, host, pb) == DT_OK,
          "%s: set", label);
}

static void step(dt_optimizer *o, long long s, float *param, const float *g, size_t e) {
    CHECK(dt_optimizer_begin(o) == DT_OK, "begin");
    CHECK(dt_optimizer_step_range(o, s, 1, 1e-3, 0.7f, 0, param, g, GAP0) == DT_OK, "step [0, GAP0)");
    CHECK(dt_optimizer_step_range(o, s, 0, 1e-3, 0.7f, GAP1, (float *)((char *)param + GAP1 * e),
                                  (const float *)((const char *)g + GAP1 * e), N - GAP1) == DT_OK,
          "step [GAP1, N)");
    CHECK(dt_optimizer_end(o) == DT_OK, "end");
}

/* kind 0: in memory; params_host: B's parameters are host memory (only with a store) */
static void compare(const dt_ops *ops, const char *label, dt_store_kind kind, int params_host) {
    size_t e = dt_elem_bytes(ops), bytes = N * e;
    dt_optimizer a, b;
    dt_optimizer_offload off = {.store = store_of(kind, "test-optimizer")};
    off.params_host = params_host;
    CHECK(dt_optimizer_create(&a, ops, &HP, N, 1, "", NULL, NULL, 0) == DT_OK, "%s: in memory", label);
    CHECK(dt_optimizer_create(&b, ops, &HP, N, 1, " (offloaded)", &off, NULL, 0) == DT_OK, "%s: offloaded", label);
    float *pa = NULL, *pb = NULL, *g = NULL, *host = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float)),
          *y = malloc(N * sizeof(float));
    CHECK(ops->alloc((void **)&pa, bytes, "params a") == DT_OK && ops->alloc((void **)&g, bytes, "grads") == DT_OK,
          "alloc");
    if (params_host) pb = calloc(1, bytes);
    else CHECK(ops->alloc((void **)&pb, bytes, "params b") == DT_OK, "alloc");
    uint64_t seed = 7;
    for (size_t i = 0; i < N; i++) host[i] = uniform(&seed);
    CHECK(dt_optimizer_set_weights(&a, 0, N, host, pa) == DT_OK, "%s: set a", label);
    if (params_host) { /* the strategy writes the host copy itself (zero_shard.c's put_slice) */
        CHECK(dt_optimizer_set_weights(&b, 0, N, host, NULL) == DT_OK, "%s: set b", label);
        CHECK(dt_optimizer_put_params(&b, pb, host, N) == DT_OK, "%s: b's host parameters", label);
    } else {
        CHECK(dt_optimizer_set_weights(&b, 0, N, host, pb) == DT_OK, "%s: set b", label);
    }
    for (long long s = 1; s <= 3; s++) {
        for (size_t i = 0; i < N; i++) host[i] = 0.1f * uniform(&seed);
        put(ops, g, host, N);
        step(&a, s, pa, g, e);
        step(&b, s, pb, g, e);
    }
    /* the parameters in storage precision */
    unsigned char *ba = malloc(bytes), *bb = malloc(bytes);
    ops->download(ba, pa, bytes);
    if (params_host) memcpy(bb, pb, bytes);
    else ops->download(bb, pb, bytes);
    CHECK(!memcmp(ba, bb, bytes), "%s: the same parameters", label);
    /* the fp32 weights and the moments */
    CHECK(dt_optimizer_get_weights(&a, 0, N, pa, x) == DT_OK && dt_optimizer_get_weights(&b, 0, N, pb, y) == DT_OK &&
              !memcmp(x, y, N * sizeof(float)),
          "%s: the same fp32 weights", label);
    for (int w = 0; w < 2; w++) {
        CHECK(dt_optimizer_get_moments(&a, w, 0, N, x) == DT_OK && dt_optimizer_get_moments(&b, w, 0, N, y) == DT_OK &&
                  !memcmp(x, y, N * sizeof(float)),
              "%s: the same moment %d", label, w + 1);
        int gap_zero = 1; /* never updated, never written */
        for (size_t i = GAP0; i < GAP1; i++) gap_zero &= y[i] == 0.0f;
        CHECK(gap_zero, "%s: the gap's moment %d untouched", label, w + 1);
    }
    size_t dev = b.m || b.v || b.master, hst, file; /* nothing in the backend's memory */
    dt_optimizer_offload_bytes(&b, &hst, &file);
    CHECK(dev == 0 && hst > 0 && (kind == DT_STORE_NVME) == (file > 0), "%s: bytes backend %zu host %zu file %zu",
          label, dev, hst, file);
    dt_optimizer_free(&a);
    dt_optimizer_free(&b);
    ops->free(pa);
    ops->free(g);
    if (params_host) free(pb);
    else ops->free(pb);
    free(host);
    free(x);
    free(y);
    free(ba);
    free(bb);
}

/* Steps 1-2 exact (warmup), 3-4 delayed, 5 not delayed (a checkpoint follows), 6 delayed. */
static void delayed(const dt_ops *ops, const char *label, dt_store_kind kind) {
    enum { STEPS = 6 };
    static const int delay[STEPS + 1] = {0, 0, 0, 1, 1, 0, 1};
    size_t e = dt_elem_bytes(ops), bytes = N * e;
    dt_optimizer a, b;
    dt_optimizer_offload off = {.store = store_of(kind, "test-delayed")};
    off.delayed = 1;
    CHECK(dt_optimizer_create(&a, ops, &HP, N, 1, "", NULL, NULL, 0) == DT_OK, "%s: in memory", label);
    CHECK(dt_optimizer_create(&b, ops, &HP, N, 1, " (delayed)", &off, NULL, 0) == DT_OK && b.delayed, "%s: delayed", label);
    float *pa = NULL, *pb = NULL, *g = NULL, *host = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float)),
          *y = malloc(N * sizeof(float));
    CHECK(ops->alloc((void **)&pa, bytes, "params a") == DT_OK && ops->alloc((void **)&pb, bytes, "params b") == DT_OK &&
              ops->alloc((void **)&g, bytes, "grads") == DT_OK,
          "alloc");
    uint64_t seed = 11;
    set_both(&a, &b, pa, pb, host, &seed, label);
    unsigned char *hist[STEPS + 1], *now = malloc(bytes);
    for (int s = 0; s <= STEPS; s++) hist[s] = malloc(bytes);
    ops->download(hist[0], pa, bytes);
    for (int s = 1; s <= STEPS; s++) {
        for (size_t i = 0; i < N; i++) host[i] = 0.1f * uniform(&seed);
        put(ops, g, host, N);
        step(&a, s, pa, g, e);
        ops->download(hist[s], pa, bytes);
        dt_optimizer_delay_next(&b, delay[s]);
        step(&b, s, pb, g, e); /* b's copy of g is taken during the step: a's next g may overwrite it */
        ops->download(now, pb, bytes);
        int want = delay[s] ? s - 1 : s; /* delayed: the weights before this step's update */
        CHECK(!memcmp(now, hist[want], bytes), "%s: after step %d the parameters of exact step %d", label, s, want);
        if (delay[s]) CHECK(memcmp(now, hist[s], bytes), "%s: step %d's update not yet applied", label, s);
    }
    /* reading the state settles the update in flight: the exact run's weights and moments */
    CHECK(dt_optimizer_get_weights(&a, 0, N, pa, x) == DT_OK && dt_optimizer_get_weights(&b, 0, N, pb, y) == DT_OK &&
              !memcmp(x, y, N * sizeof(float)),
          "%s: settled, the same fp32 weights", label);
    ops->download(now, pb, bytes);
    CHECK(!memcmp(now, hist[STEPS], bytes), "%s: settled, the same parameters", label);
    for (int w = 0; w < 2; w++)
        CHECK(dt_optimizer_get_moments(&a, w, 0, N, x) == DT_OK && dt_optimizer_get_moments(&b, w, 0, N, y) == DT_OK &&
                  !memcmp(x, y, N * sizeof(float)),
              "%s: settled, the same moment %d", label, w + 1);
    size_t hst, file, hst0;
    dt_optimizer_offload_bytes(&b, &hst, &file);
    off.delayed = 0;
    off.store.tag = "test-not-delayed"; /* b's file is still open */
    dt_optimizer c;
    CHECK(dt_optimizer_create(&c, ops, &HP, N, 1, " (not delayed)", &off, NULL, 0) == DT_OK, "%s: not delayed", label);
    dt_optimizer_offload_bytes(&c, &hst0, &file);
    CHECK(hst == hst0 + 2 * N * sizeof(float), "%s: the delayed update's copies counted (%zu = %zu + 8N)", label, hst,
          hst0);
    dt_optimizer_free(&c);
    dt_optimizer_free(&a);
    dt_optimizer_free(&b);
    ops->free(pa);
    ops->free(pb);
    ops->free(g);
    for (int s = 0; s <= STEPS; s++) free(hist[s]);
    free(now);
    free(host);
    free(x);
    free(y);
}

/* Gradients handed over during backward (grads_early, a device's or bf16's): the pass reads
 * the host copy taken at dt_optimizer_grads_ready, so gradients changed on the device after
 * that (here: zeroed) do not reach the update; the parameters and state are the in-memory
 * optimizer's with the gradients as handed over. Handed over in two pieces, in descending
 * order as backward does, the first during backward (counted so), the second after it,
 * once from a host copy; a step where not all are handed over downloads them instead. */
static void early(const dt_ops *ops, const char *label, dt_store_kind kind) {
    size_t e = dt_elem_bytes(ops), bytes = N * e;
    dt_optimizer a, b;
    dt_optimizer_offload off = {.store = store_of(kind, "test-early")};
    off.grads_early = 1;
    CHECK(dt_optimizer_create(&a, ops, &HP, N, 1, "", NULL, NULL, 0) == DT_OK, "%s: in memory", label);
    CHECK(dt_optimizer_create(&b, ops, &HP, N, 1, " (early)", &off, NULL, 0) == DT_OK && b.ghost, "%s: early", label);
    float *pa = NULL, *pb = NULL, *g = NULL, *host = malloc(N * sizeof(float)), *zero = calloc(N, sizeof(float));
    void *gh = malloc(bytes);
    CHECK(ops->alloc((void **)&pa, bytes, "a") == DT_OK && ops->alloc((void **)&pb, bytes, "b") == DT_OK &&
              ops->alloc((void **)&g, bytes, "g") == DT_OK,
          "alloc");
    uint64_t seed = 5;
    set_both(&a, &b, pa, pb, host, &seed, label);
    for (long long s = 1; s <= 3; s++) {
        for (size_t i = 0; i < N; i++) host[i] = 0.1f * uniform(&seed);
        put(ops, g, host, N);
        step(&a, s, pa, g, e);
        double back0 = dt_optimizer_grads_backward_bytes();
        if (s != 2) { /* step 2: nothing handed over, the pass downloads */
            dt_optimizer_grads_ready(&b, GAP1, (const float *)((const char *)g + GAP1 * e), N - GAP1);
            dt_optimizer_backward_done(&b); /* the rest after backward */
            if (s == 3) { /* from a host copy the reduction left (storage precision) */
                ops->download(gh, g, GAP1 * e);
                put(ops, g, zero, N);
                dt_optimizer_grads_ready_host(&b, 0, gh, GAP1);
            } else {
                dt_optimizer_grads_ready(&b, 0, g, GAP1);
            }
            put(ops, g, zero, N); /* the device's gradients change after the handover */
        }
        step(&b, s, pb, g, e);
        CHECK(b.ghost_n == 0, "%s: step %lld: the handover is per step", label, s);
        double back = dt_optimizer_grads_backward_bytes() - back0;
        CHECK(back == (s == 2 ? 0.0 : (double)((N - GAP1) * e)), "%s: step %lld: %.0f bytes during backward", label, s,
              back);
    }
    unsigned char *ba = malloc(bytes), *bb = malloc(bytes);
    ops->download(ba, pa, bytes);
    ops->download(bb, pb, bytes);
    CHECK(!memcmp(ba, bb, bytes), "%s: the parameters of the gradients handed over", label);
    size_t hst, file, hst0;
    dt_optimizer_offload_bytes(&b, &hst, &file);
    off.grads_early = 0;
    off.store.tag = "test-late";
    dt_optimizer c;
    CHECK(dt_optimizer_create(&c, ops, &HP, N, 1, " (late)", &off, NULL, 0) == DT_OK && !c.ghost, "%s: late", label);
    dt_optimizer_offload_bytes(&c, &hst0, &file);
    CHECK(hst == hst0 + bytes, "%s: the host copy counted (%zu = %zu + %zu)", label, hst, hst0, bytes);
    dt_optimizer_free(&c);
    dt_optimizer_free(&a);
    dt_optimizer_free(&b);
    ops->free(pa);
    ops->free(pb);
    ops->free(g);
    free(host);
    free(zero);
    free(gh);
    free(ba);
    free(bb);
}

/* offload.pin_memory: with the device's page-locked allocator in the store's options,
 * every host buffer of the offloaded optimizer comes from it (the emulated device counts
 * its pinned bytes): the store's, the staging chunks, the delayed update's copies; and
 * all of it is given back. */
static void pinned(const dt_ops *ops, const char *label, dt_store_kind kind) {
    dt_optimizer_offload off = {.store = store_of(kind, "test-pinned"), .delayed = 1};
    off.store.host_alloc = ops->host_alloc, off.store.host_free = ops->host_free;
    size_t before = dt_emulated_pinned_bytes(), host, file;
    dt_optimizer o;
    CHECK(dt_optimizer_create(&o, ops, &HP, N, 1, " (pinned)", &off, NULL, 0) == DT_OK, "%s: create", label);
    dt_optimizer_offload_bytes(&o, &host, &file);
    size_t pinned = dt_emulated_pinned_bytes() - before;
    CHECK(host > 0 && pinned == host, "%s: every host byte page-locked (%zu of %zu)", label, pinned, host);
    dt_optimizer_free(&o);
    CHECK(dt_emulated_pinned_bytes() == before, "%s: all of it given back", label);
}

static void all_kinds(const dt_ops *ops, const char *name) {
    char label[96];
    snprintf(label, sizeof label, "%s, cpu", name);
    compare(ops, label, DT_STORE_CPU, 0);
    snprintf(label, sizeof label, "%s, nvme", name);
    compare(ops, label, DT_STORE_NVME, 0);
    snprintf(label, sizeof label, "%s, nvme, parameters on the host", name);
    compare(ops, label, DT_STORE_NVME, 1);
    snprintf(label, sizeof label, "%s, cpu, parameters on the host", name);
    compare(ops, label, DT_STORE_CPU, 1);
    snprintf(label, sizeof label, "%s, cpu, delayed update", name);
    delayed(ops, label, DT_STORE_CPU);
    snprintf(label, sizeof label, "%s, nvme, delayed update", name);
    delayed(ops, label, DT_STORE_NVME);
    if (ops->on_device || ops->bf16) {
        snprintf(label, sizeof label, "%s, nvme, gradients handed over early", name);
        early(ops, label, DT_STORE_NVME);
        snprintf(label, sizeof label, "%s, cpu, gradients handed over early", name);
        early(ops, label, DT_STORE_CPU);
    }
    if (ops->host_alloc) {
        snprintf(label, sizeof label, "%s, cpu, pinned", name);
        pinned(ops, label, DT_STORE_CPU);
        snprintf(label, sizeof label, "%s, nvme, pinned", name);
        pinned(ops, label, DT_STORE_NVME);
    }
}

int main(void) {
    const dt_ops *cpu = dt_ops_cpu();
    all_kinds(cpu, "cpu fp32");
    all_kinds(dt_ops_bf16_storage(cpu), "cpu bf16"); /* one table of each kind at a time */
    all_kinds(dt_ops_emulated(cpu), "emulated fp32");
    all_kinds(dt_ops_emulated(dt_ops_bf16_storage(cpu)), "emulated bf16");
    return check_finish();
}
