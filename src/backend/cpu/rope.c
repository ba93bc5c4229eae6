/* Rotary position embeddings and grouped-query heads, between the q/k/v projections and
 * the attention (which reads qkv[N, 3·NH·HS], heads of HS, as GPT-2's does): q and k are
 * rotated in Hugging Face's convention (rotate_half: element d pairs with d + HS/2, angle
 * pos·inv_freq[d mod HS/2]), and each key/value head is copied to the NH/NKV query heads
 * of its group (Hugging Face's repeat_kv). The backward rotates back and sums a group's
 * copies in head order. */
#include <math.h>

#include "cpu.h"

/* y = rotate(x) by the angles of position p (sign -1: the inverse rotation) */
static void rotate(float *y, const float *x, int p, const float *inv_freq, int HS, float sign) {
    int h = HS / 2;
    for (int d = 0; d < h; d++) {
        float a = (float)p * inv_freq[d], c = cosf(a), s = sign * sinf(a);
        float x0 = x[d], x1 = x[d + h];
        y[d] = x0 * c - x1 * s;
        y[d + h] = x1 * c + x0 * s;
    }
}

void cpu_rope_qkv_fwd(float *qkv, const float *q, const float *k, const float *v, const int *pos,
                      const float *inv_freq, int N, int NH, int NKV, int HS) {
    int C = NH * HS, Ckv = NKV * HS, group = NH / NKV;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = qkv + (size_t)i * 3 * C;
        const float *qi = q + (size_t)i * C, *ki = k + (size_t)i * Ckv, *vi = v + (size_t)i * Ckv;
        for (int h = 0; h < NH; h++) {
            int kh = h / group;
            rotate(row + h * HS, qi + h * HS, pos[i], inv_freq, HS, 1.0f);
            rotate(row + C + h * HS, ki + kh * HS, pos[i], inv_freq, HS, 1.0f);
            for (int d = 0; d < HS; d++) row[2 * C + h * HS + d] = vi[kh * HS + d];
        }
    }
}

void cpu_rope_qkv_bwd(float *dq, float *dk, float *dv, const float *dqkv, const int *pos, const float *inv_freq,
                      int N, int NH, int NKV, int HS) {
    int C = NH * HS, Ckv = NKV * HS, group = NH / NKV;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *row = dqkv + (size_t)i * 3 * C;
        float *dqi = dq + (size_t)i * C, *dki = dk + (size_t)i * Ckv, *dvi = dv + (size_t)i * Ckv;
        for (int h = 0; h < NH; h++) rotate(dqi + h * HS, row + h * HS, pos[i], inv_freq, HS, -1.0f);
        for (int kh = 0; kh < NKV; kh++) {
            float *dst = dki + kh * HS, *dvd = dvi + kh * HS;
            for (int d = 0; d < HS; d++) dst[d] = dvd[d] = 0.0f;
            for (int g = 0; g < group; g++) { /* the group's copies, in head order */
                int h = kh * group + g;
                for (int d = 0; d < HS; d++) {
                    dst[d] += row[C + h * HS + d];
                    dvd[d] += row[2 * C + h * HS + d];
                }
            }
            rotate(dst, dst, pos[i], inv_freq, HS, -1.0f); /* in place: each pair is read before it is written */
        }
    }
}
