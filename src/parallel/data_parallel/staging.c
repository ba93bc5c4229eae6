#include "staging.h"

#include <stdint.h>
#include <string.h>

#include "../../core/bf16.h"

/* bf16 values are copied as they are into the upper half of the fp32 buffer, then widened
 * upwards in place (element i lands at bytes [4i, 4i+4), where no element after it is
 * read from), and rounded back downwards likewise; each block goes through a local
 * copy, so the compiler's view of the buffer as two types cannot reorder a read after
 * the write that covers it. */
enum { STAGE_BLOCK = 1024 };

void dt_stage_widen(const dt_ops *ops, float *dst, const void *src, size_t n) {
    if (!ops->bf16) {
        ops->download(dst, src, n * sizeof(float));
        return;
    }
    char *base = (char *)dst;
    ops->download(base + n * sizeof(uint16_t), src, n * sizeof(uint16_t));
    uint16_t in[STAGE_BLOCK];
    float out[STAGE_BLOCK];
    for (size_t i = 0; i < n; i += STAGE_BLOCK) {
        size_t k = n - i < STAGE_BLOCK ? n - i : STAGE_BLOCK;
        memcpy(in, base + (n + i) * sizeof(uint16_t), k * sizeof(uint16_t));
        for (size_t j = 0; j < k; j++) out[j] = dt_bf16_to_f32(in[j]);
        memcpy(base + i * sizeof(float), out, k * sizeof(float));
    }
}

void dt_stage_narrow(const dt_ops *ops, void *dst, float *src, size_t n) {
    if (!ops->bf16) {
        ops->upload(dst, src, n * sizeof(float));
        return;
    }
    char *base = (char *)src;
    float in[STAGE_BLOCK];
    uint16_t out[STAGE_BLOCK];
    for (size_t i = 0; i < n; i += STAGE_BLOCK) {
        size_t k = n - i < STAGE_BLOCK ? n - i : STAGE_BLOCK;
        memcpy(in, base + i * sizeof(float), k * sizeof(float));
        for (size_t j = 0; j < k; j++) out[j] = dt_f32_to_bf16(in[j]);
        memcpy(base + i * sizeof(uint16_t), out, k * sizeof(uint16_t));
    }
    ops->upload(dst, base, n * sizeof(uint16_t));
}
