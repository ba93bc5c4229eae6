/* Host staging (src/parallel/data_parallel/staging.c): bf16 storage widened to fp32 in place and
 * rounded back in place, across block boundaries, on the emulated device's memory (so
 * the helpers touch it only through download and upload) and on the CPU. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/ops.h"
#include "check.h"
#include "core/bf16.h"
#include "parallel/data_parallel/staging.h"

/* n values covering signs, magnitudes, ties and NaN */
static float value(size_t i) {
    switch (i % 7) {
    case 0: return (float)i * 0.001f;
    case 1: return -(float)i * 3.7f;
    case 2: return 1.0f + (float)(i % 256) / 65536.0f; /* between bf16 neighbours: rounding */
    case 3: return ldexpf(1.0f, (int)(i % 60) - 30);
    case 4: return 1.00390625f; /* 1 + 2^-8: a tie, rounds to even (1.0) */
    case 5: return NAN;
    default: return -0.0f;
    }
}

static int same_bits(float a, float b) { return isnan(a) ? isnan(b) : memcmp(&a, &b, sizeof a) == 0; }

static void check_backend(const dt_ops *ops, const char *name) {
    enum { N = 2500 }; /* spans three of staging.c's 1024-element blocks */
    float *host = malloc(N * sizeof(float)), *want = malloc(N * sizeof(float));
    uint16_t *b16 = malloc(N * sizeof(uint16_t));
    void *dev = NULL;
    CHECK(host && want && b16 && ops->alloc(&dev, N * dt_elem_bytes(ops), "staging test") == DT_OK, "%s alloc", name);
    if (!host || !want || !b16 || !dev) goto out;
    for (size_t i = 0; i < N; i++) {
        b16[i] = dt_f32_to_bf16(value(i));
        want[i] = ops->bf16 ? dt_bf16_to_f32(b16[i]) : value(i);
        host[i] = value(i);
    }
    /* storage in the backend: bf16 values, or the fp32 values as they are */
    ops->upload(dev, ops->bf16 ? (void *)b16 : (void *)host, N * dt_elem_bytes(ops));
    for (size_t i = 0; i < N; i++) host[i] = 12345.0f; /* widen must overwrite all of it */
    dt_stage_widen(ops, host, dev, N);
    size_t bad = N;
    for (size_t i = 0; i < N && bad == N; i++)
        if (!same_bits(host[i], want[i])) bad = i;
    CHECK(bad == N, "%s widen: element %zu is %g, want %g", name, bad, bad < N ? host[bad] : 0.0, bad < N ? want[bad] : 0.0);
    /* narrowing unrounded values: each element rounds to nearest even, in place */
    for (size_t i = 0; i < N; i++) host[i] = value(i);
    ops->zero(dev, N * dt_elem_bytes(ops));
    dt_stage_narrow(ops, dev, host, N);
    float *back = malloc(N * sizeof(float));
    if (back) {
        dt_stage_widen(ops, back, dev, N);
        bad = N;
        for (size_t i = 0; i < N && bad == N; i++)
            if (!same_bits(back[i], want[i])) bad = i;
        CHECK(bad == N, "%s narrow: element %zu is %g, want %g", name, bad, bad < N ? back[bad] : 0.0,
              bad < N ? want[bad] : 0.0);
        free(back);
    }
out:
    if (dev) ops->free(dev);
    free(host);
    free(want);
    free(b16);
}

int main(void) {
    check_backend(dt_ops_cpu(), "cpu fp32");
    check_backend(dt_ops_bf16_storage(dt_ops_cpu()), "cpu bf16");
    check_backend(dt_ops_emulated(dt_ops_bf16_storage(dt_ops_cpu())), "emulated bf16");
    return check_finish();
}
