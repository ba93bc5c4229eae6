/* The vectorised exp/tanh helpers: defined for NaN and infinities (NaN passes through;
 * before, NaN reached a float-to-int conversion and a left shift of a negative value), and
 * bitwise what they were for every finite input (sweep of float bit patterns). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/fastmath.h"
#include "check.h"

/* The helper as it was, defined for finite inputs only. */
static float old_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}
static float old_tanhf(float x) { return 1.0f - 2.0f / (old_expf(2.0f * x) + 1.0f); }

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int main(void) {
    /* every 97th bit pattern, both signs, finite only */
    long diff_exp = 0, diff_tanh = 0, n = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 97) {
        float x;
        uint32_t v = (uint32_t)u;
        memcpy(&x, &v, sizeof x);
        if (!isfinite(x)) continue;
        n++;
        diff_exp += bits(dt_expf(x)) != bits(old_expf(x));
        if (fabsf(x) < 1e30f) diff_tanh += bits(dt_tanhf(x)) != bits(old_tanhf(x));
    }
    CHECK(n > 40000000 && diff_exp == 0, "exp: %ld of %ld finite inputs differ from the previous helper", diff_exp, n);
    CHECK(diff_tanh == 0, "tanh: %ld inputs differ from the previous helper", diff_tanh);
    volatile float nan = NAN, inf = INFINITY;
    CHECK(isnan(dt_expf(nan)) && isnan(dt_expf(-nan)), "exp(NaN) = %g", dt_expf(nan));
    CHECK(dt_expf(-inf) >= 0.0f && dt_expf(-inf) < 1e-37f, "exp(-inf) = %g", dt_expf(-inf));
    CHECK(dt_expf(inf) > 1e38f && isfinite(dt_expf(inf)), "exp(+inf) = %g (saturates at e^88)", dt_expf(inf));
    CHECK(isnan(dt_tanhf(nan)), "tanh(NaN) = %g", dt_tanhf(nan));
    CHECK(dt_tanhf(inf) == 1.0f && dt_tanhf(-inf) == -1.0f, "tanh(+-inf) = %g, %g", dt_tanhf(inf), dt_tanhf(-inf));
    CHECK(fabsf(dt_expf(1.0f) - 2.7182817f) < 1e-6f, "exp(1) = %.9g", dt_expf(1.0f));
    /* a vector loop as the kernels have it: NaN in one lane leaves the others alone */
    float in[8] = {0.0f, 1.0f, NAN, -2.0f, INFINITY, -INFINITY, 3.0f, -0.5f}, out[8];
    for (int i = 0; i < 8; i++) out[i] = dt_expf(in[i]);
    CHECK(isnan(out[2]) && out[1] == old_expf(1.0f) && out[6] == old_expf(3.0f) && out[7] == old_expf(-0.5f),
          "lanes: %g %g %g %g", out[1], out[2], out[6], out[7]);
    return check_finish();
}
