/* Vectorisable exp for the softmax, GELU and attention hot loops: libm's expf does
 * not vectorise without -ffast-math. Cephes polynomial, relative error < 2e-7. */
#ifndef DT_FASTMATH_H
#define DT_FASTMATH_H
#include <math.h>
#include <stdint.h>

/* Defined for every input: the clamps are written so that NaN lands on -87 (the integer
 * conversion below must never see NaN), and NaN is passed through at the end; -inf gives
 * e^-87 ~ 1.6e-38 and +inf saturates at e^88. Finite inputs: unchanged results. */
static inline float dt_expf(float x) {
    float x0 = x;
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n through the exponent bits; a union (not memcpy) keeps the loop vectorisable */
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    float y = p * scale.f;
    return x0 == x0 ? y : x0;
}

static inline float dt_tanhf(float x) {
    /* tanh(x) = 1 - 2/(exp(2x)+1); exact enough and saturates correctly at both ends */
    return 1.0f - 2.0f / (dt_expf(2.0f * x) + 1.0f);
}

#endif
