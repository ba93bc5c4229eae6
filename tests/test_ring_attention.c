/* Ring attention (context parallelism) against full causal attention: the sequence cut
 * into 2·cp chunks, rank i holding chunks i and 2·cp−1−i; each rank's queries meet every
 * rank's keys and values block by block (the ring, simulated in one process), merged by
 * the online-softmax rule; backward adds each block's dq locally and its dk, dv to the
 * block's owner (what travels back around the ring). Output, log-sum-exp and input
 * gradients within 1e-6 relative of full attention for cp 2 and 4 at several lengths,
 * across the kernel's 64-row query blocks; the per-rank attention work is equal; a
 * length that 2·cp does not divide is refused. With documents (rows of packed documents
 * of random lengths: each query sees its own document only), the same for ring attention
 * against full attention, and full attention against each document run alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "check.h"
#include "core/rng.h"
#include "parallel/model_parallel/context_parallel.h"

enum { B = 2, C = 16, NH = 2, C3 = 3 * C };

/* seg[b·T + t]: the start of row b's document holding t, documents of 1 to 2·mean tokens */
static int *random_documents(int T, int mean, uint64_t seed) {
    int *seg = malloc((size_t)B * T * sizeof(int));
    dt_rng rng;
    dt_rng_seed(&rng, seed);
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0, left = 0; t < T; t++) {
            if (left == 0) {
                start = t;
                left = 1 + (int)dt_rng_below(&rng, (uint64_t)(2 * mean));
            }
            seg[(size_t)b * T + t] = start;
            left--;
        }
    return seg;
}

/* Full attention over documents against each document alone (plain causal attention on
 * its rows only): outputs, lse and input gradients. */
static void documents_alone(int T, int mean) {
    size_t n3 = (size_t)B * T * C3, n1 = (size_t)B * T * C;
    int *seg = random_documents(T, mean, (uint64_t)T * 7 + (uint64_t)mean);
    float *qkv = malloc(n3 * sizeof(float)), *out = malloc(n1 * sizeof(float)), *dout = malloc(n1 * sizeof(float));
    float *lse = malloc((size_t)B * NH * T * sizeof(float)), *dqkv = malloc(n3 * sizeof(float));
    float *o1 = malloc(n1 * sizeof(float)), *l1 = malloc((size_t)NH * T * sizeof(float)), *d1 = malloc(n3 * sizeof(float));
    dt_rng rng;
    dt_rng_seed(&rng, (uint64_t)T);
    for (size_t i = 0; i < n3; i++) qkv[i] = (float)dt_rng_normal(&rng);
    for (size_t i = 0; i < n1; i++) dout[i] = (float)dt_rng_normal(&rng);
    cpu_attention_fwd(out, lse, qkv, seg, B, T, C, NH);
    cpu_attention_bwd(dqkv, dout, qkv, out, lse, seg, B, T, C, NH);
    double eo = 0, el = 0, ed = 0;
    int docs = 0;
    for (int b = 0; b < B; b++)
        for (int t0 = 0, t1; t0 < T; t0 = t1, docs++) {
            for (t1 = t0 + 1; t1 < T && seg[(size_t)b * T + t1] == t0;) t1++;
            int L = t1 - t0;
            size_t r = (size_t)b * T + t0;
            cpu_attention_fwd(o1, l1, qkv + r * C3, NULL, 1, L, C, NH);
            cpu_attention_bwd(d1, dout + r * C, qkv + r * C3, o1, l1, NULL, 1, L, C, NH);
            eo = fmax(eo, check_rel_diff(o1, out + r * C, (size_t)L * C));
            ed = fmax(ed, check_rel_diff(d1, dqkv + r * C3, (size_t)L * C3));
            for (int h = 0; h < NH; h++) /* against the largest lse anywhere: a 1-token document's is near 0 */
                for (int t = 0; t < L; t++) el = fmax(el, fabs((double)l1[(size_t)h * L + t] - lse[((size_t)b * NH + h) * T + t0 + t]));
        }
    double lmax = 0;
    for (size_t i = 0; i < (size_t)B * NH * T; i++) lmax = fmax(lmax, fabs((double)lse[i]));
    el /= lmax;
    CHECK(eo <= 1e-6 && el <= 1e-6 && ed <= 1e-6, "documents (T %d, mean %d): out %.2e, lse %.2e, dqkv %.2e", T, mean,
          eo, el, ed);
    printf("documents alone, T %4d, %d documents: out %.1e, lse %.1e, dqkv %.1e\n", T, docs, eo, el, ed);
    free(seg), free(qkv), free(out), free(dout), free(lse), free(dqkv), free(o1), free(l1), free(d1);
}

static void ring_case(int T, int cp, const int *seg) {
    size_t n3 = (size_t)B * T * C3, n1 = (size_t)B * T * C;
    float *qkv = malloc(n3 * sizeof(float)), *out = malloc(n1 * sizeof(float)), *dout = malloc(n1 * sizeof(float));
    float *lse = malloc((size_t)B * NH * T * sizeof(float)), *dqkv = malloc(n3 * sizeof(float));
    dt_rng rng;
    dt_rng_seed(&rng, (uint64_t)(T * 31 + cp));
    for (size_t i = 0; i < n3; i++) qkv[i] = (float)dt_rng_normal(&rng);
    for (size_t i = 0; i < n1; i++) dout[i] = (float)dt_rng_normal(&rng);
    cpu_attention_fwd(out, lse, qkv, seg, B, T, C, NH);
    cpu_attention_bwd(dqkv, dout, qkv, out, lse, seg, B, T, C, NH);

    int Tq = T / cp;
    int *pos = malloc((size_t)cp * Tq * sizeof(int)), *rseg = seg ? malloc((size_t)cp * B * Tq * sizeof(int)) : NULL;
    float *rq = malloc((size_t)cp * B * Tq * C3 * sizeof(float)), *ro = calloc((size_t)cp * B * Tq * C, sizeof(float));
    float *rl = malloc((size_t)cp * B * NH * Tq * sizeof(float)), *rdo = malloc((size_t)cp * B * Tq * C * sizeof(float));
    float *rdq = calloc((size_t)cp * B * Tq * C3, sizeof(float)), *rdkv = calloc((size_t)cp * B * Tq * C3, sizeof(float));
    for (int r = 0; r < cp; r++) { /* each rank's rows of q, k, v and dout */
        dt_cp_positions(T, cp, r, pos + (size_t)r * Tq);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                int p = pos[r * Tq + i];
                memcpy(rq + (((size_t)r * B + b) * Tq + i) * C3, qkv + ((size_t)b * T + p) * C3, C3 * sizeof(float));
                memcpy(rdo + (((size_t)r * B + b) * Tq + i) * C, dout + ((size_t)b * T + p) * C, C * sizeof(float));
                if (seg) rseg[((size_t)r * B + b) * Tq + i] = seg[(size_t)b * T + p];
            }
        for (size_t i = 0; i < (size_t)B * NH * Tq; i++) rl[(size_t)r * B * NH * Tq + i] = -INFINITY;
    }
    size_t S3 = (size_t)B * Tq * C3, S1 = (size_t)B * Tq * C, SL = (size_t)B * NH * Tq;
    for (int s = 0; s < cp; s++) /* step s: rank r holds the block of rank r - s */
        for (int r = 0; r < cp; r++) {
            int src = (r - s + cp) % cp;
            cpu_attention_part_fwd(ro + r * S1, rl + r * SL, rq + r * S3, rq + src * S3, pos + r * Tq,
                                   seg ? rseg + (size_t)r * B * Tq : NULL, pos + src * Tq, B, Tq, Tq, C, NH);
        }
    for (int s = 0; s < cp; s++)
        for (int r = 0; r < cp; r++) {
            int src = (r - s + cp) % cp;
            cpu_attention_part_bwd(rdq + r * S3, rdkv + src * S3, rdo + r * S1, rq + r * S3, rq + src * S3,
                                   ro + r * S1, rl + r * SL, pos + r * Tq, seg ? rseg + (size_t)r * B * Tq : NULL,
                                   pos + src * Tq, B, Tq, Tq, C, NH);
        }
    /* back to global order: out, lse, and dqkv = each rank's dq with its block's dk, dv */
    float *go = malloc(n1 * sizeof(float)), *gl = malloc((size_t)B * NH * T * sizeof(float));
    float *gd = malloc(n3 * sizeof(float));
    for (int r = 0; r < cp; r++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                int p = pos[r * Tq + i];
                size_t at = ((size_t)b * Tq + i);
                memcpy(go + ((size_t)b * T + p) * C, ro + r * S1 + at * C, C * sizeof(float));
                for (int h = 0; h < NH; h++) gl[((size_t)b * NH + h) * T + p] = rl[r * SL + ((size_t)b * NH + h) * Tq + i];
                memcpy(gd + ((size_t)b * T + p) * C3, rdq + r * S3 + at * C3, C * sizeof(float));
                memcpy(gd + ((size_t)b * T + p) * C3 + C, rdkv + r * S3 + at * C3 + C, 2 * C * sizeof(float));
            }
    double eo = check_rel_diff(out, go, n1), el = check_rel_diff(lse, gl, (size_t)B * NH * T);
    double ed = check_rel_diff(dqkv, gd, n3);
    CHECK(eo <= 1e-6 && el <= 1e-6 && ed <= 1e-6, "cp %d, T %d%s: out %.2e, lse %.2e, dqkv %.2e", cp, T,
          seg ? " (documents)" : "", eo, el, ed);
    printf("cp %d, T %4d%s: out %.1e, lse %.1e, dqkv %.1e\n", cp, T, seg ? " (documents)" : "", eo, el, ed);
    free(rseg);
    int64_t w0 = dt_cp_attention_pairs(T, cp, 0), total = 0, worst = 0;
    for (int r = 0; r < cp; r++) {
        int64_t w = dt_cp_attention_pairs(T, cp, r);
        total += w;
        if (llabs(w - w0) > worst) worst = llabs(w - w0);
    }
    CHECK(total == (int64_t)T * (T + 1) / 2 && worst == 0, "cp %d T %d: attention work per rank equal (%lld off)", cp,
          T, (long long)worst);
    free(qkv), free(out), free(dout), free(lse), free(dqkv), free(pos), free(rq), free(ro), free(rl), free(rdo);
    free(rdq), free(rdkv), free(go), free(gl), free(gd);
}

int main(void) {
    int lengths[2][4] = {{4, 12, 64, 200}, {8, 24, 64, 264}}; /* 200, 264: query blocks past 64 rows */
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++) {
            ring_case(lengths[c][k], 2 << c, NULL);
            int *seg = random_documents(lengths[c][k], 1 + lengths[c][k] / 8, (uint64_t)(c * 4 + k));
            ring_case(lengths[c][k], 2 << c, seg);
            free(seg);
        }
    documents_alone(256, 32); /* documents of T/8 on average, across query blocks */
    documents_alone(200, 3);
    documents_alone(130, 100);
    CHECK(dt_cp_check(64, 2) == DT_OK && dt_cp_check(30, 4) == DT_EINPUT && dt_cp_check(6, 2) == DT_EINPUT,
          "lengths 2·cp does not divide are refused");
    int pos[8];
    dt_cp_positions(16, 2, 1, pos);
    CHECK(pos[0] == 4 && pos[3] == 7 && pos[4] == 8 && pos[7] == 11, "rank 1 of cp 2 holds chunks 1 and 2");
    return check_finish();
}
