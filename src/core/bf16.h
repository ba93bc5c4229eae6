/* bfloat16 on the host: the top 16 bits of an fp32, rounded to nearest even (NaN kept
 * a quiet NaN). The storage type of `precision: bf16`. */
#ifndef DT_BF16_H
#define DT_BF16_H
#include <stdint.h>
#include <string.h>

static inline uint16_t dt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float dt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
