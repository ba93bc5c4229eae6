/* Causal multi-head attention, blocked like FlashAttention: for each block of QB
 * query rows, S = Q·Kᵀ over the keys it may see, a softmax, then P·V. Only the
 * log-sum-exp of each row is kept; backward recomputes P from it, so memory is
 * O(T) per head instead of O(T²). GEMMs go to BLAS (single-threaded inside the
 * OpenMP loop over (batch, head) pairs, which write disjoint outputs). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "fastmath.h"

enum { QB = 64 };

/* Per-thread scratch, grown outside parallel regions and kept for the process. */
static float *g_scratch;
static size_t g_scratch_floats;

static float *scratch_for(int T, int nthreads) {
    size_t need = (size_t)nthreads * 2 * QB * (size_t)T;
    if (need > g_scratch_floats) {
        free(g_scratch);
        g_scratch = malloc(need * sizeof(float));
        g_scratch_floats = g_scratch ? need : 0;
    }
    return g_scratch;
}

/* What a call sets up once: the head size, the qkv row stride, the softmax scale, and the
 * per-thread scratch of 2·QB rows of `width` floats. */
typedef struct {
    int hs, C3;
    float scale;
    float *scratch;
    size_t per_thread;
} attn_call;

static attn_call attn_begin(int C, int NH, int width) {
    attn_call a = {.hs = C / NH, .C3 = 3 * C, .per_thread = (size_t)2 * QB * (size_t)width};
    a.scale = 1.0f / sqrtf((float)a.hs);
    a.scratch = scratch_for(width, omp_get_max_threads());
    return a;
}

/* The calling thread's part of the scratch (inside the parallel loop over heads). */
static float *thread_scratch(const attn_call *a) { return a->scratch + (size_t)omp_get_thread_num() * a->per_thread; }

/* s[0..nk) = the softmax of the row's scores lo..len-1 (unscaled; the rest are keys it may
 * not see: 0); returns its log-sum-exp (-inf when lo >= len: the row sees no key). */
static float softmax_row(float *s, int lo, int len, int nk, float scale) {
    float mx = -INFINITY;
    for (int j = lo; j < len; j++) mx = s[j] > mx ? s[j] : mx;
    mx *= scale;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j < len; j++) {
        float e = dt_expf(s[j] * scale - mx);
        s[j] = e;
        sum += e;
    }
    float inv = len > lo ? 1.0f / sum : 0.0f;
    for (int j = lo; j < len; j++) s[j] *= inv;
    for (int j = 0; j < lo && j < nk; j++) s[j] = 0.0f;
    for (int j = len; j < nk; j++) s[j] = 0.0f;
    return len > lo ? mx + logf(sum) : -INFINITY;
}

/* The backward of one query row: p holds its scores against nk keys (unscaled) and dp
 * dO·vᵀ; with the row's log-sum-exp li and its output oi, gradient doi (hs wide), p
 * becomes the probabilities and dp the scores' gradient (scaled), over the first len keys. */
static void softmax_grad_row(float *p, float *dp, int lo, int len, int nk, const float *oi, const float *doi, int hs,
                             float li, float scale) {
    float D = 0.0f; /* rowsum(dO * O) */
    for (int d = 0; d < hs; d++) D += oi[d] * doi[d];
#pragma omp simd
    for (int j = lo; j < len; j++) {
        float pj = dt_expf(p[j] * scale - li);
        p[j] = pj;
        dp[j] = pj * (dp[j] - D) * scale;
    }
    for (int j = 0; j < lo && j < nk; j++) p[j] = dp[j] = 0.0f;
    for (int j = len; j < nk; j++) p[j] = dp[j] = 0.0f;
}

/* Documents (seg: each query's first visible key, row-relative, non-decreasing along the
 * row; NULL: 0): a block of queries from t0 needs keys from its first row's document start
 * on, so the keys of earlier documents are skipped, not computed and masked. */
static int first_key(const int *seg, int t0) { return seg ? seg[t0] : 0; }

/* Query rows of the block from t0: QB at most, and with documents none past the end of
 * t0's document, so every row of the block starts at the same key (nothing computed for
 * an earlier document, and a block never pays for its longest row's keys in the others). */
static int block_rows(const int *seg, int t0, int T) {
    int nq = T - t0 < QB ? T - t0 : QB;
    if (seg)
        for (int i = 1; i < nq; i++)
            if (seg[t0 + i] != seg[t0]) return i;
    return nq;
}

/* P[i, 0..nk) = softmax rows of S over keys k0.. : row t0 + i sees keys seg..t0 + i. */
static void softmax_rows(float *S, float *lse, const int *seg, int t0, int k0, int nq, int nk, float scale) {
    for (int i = 0; i < nq; i++)
        lse[i] = softmax_row(S + (size_t)i * nk, first_key(seg, t0 + i) - k0, t0 + i + 1 - k0, nk, scale);
}

void cpu_attention_fwd(float *out, float *lse, const float *qkv, const int *seg, int B, int T, int C, int NH) {
    attn_call a = attn_begin(C, NH, T);
    int hs = a.hs, C3 = a.C3;
    float scale = a.scale;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *S = thread_scratch(&a);
        const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        float *o = out + (size_t)b * T * C + h * hs;
        float *l = lse + (size_t)bh * T;
        const int *sg = seg ? seg + (size_t)b * T : NULL;
        for (int t0 = 0, nq; t0 < T; t0 += nq) {
            nq = block_rows(sg, t0, T);
            int k0 = first_key(sg, t0), nk = t0 + nq - k0;
            const float *kk = k + (size_t)k0 * C3, *vv = v + (size_t)k0 * C3;
            cpu_gemm(0, 1, nq, nk, hs, 1.0f, q + (size_t)t0 * C3, C3, kk, C3, 0.0f, S, nk);
            softmax_rows(S, l + t0, sg, t0, k0, nq, nk, scale);
            cpu_gemm(0, 0, nq, hs, nk, 1.0f, S, nk, vv, C3, 0.0f, o + (size_t)t0 * C, C);
        }
    }
}

void cpu_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                       const int *seg, int B, int T, int C, int NH) {
    attn_call a = attn_begin(C, NH, T);
    int hs = a.hs, C3 = a.C3;
    float scale = a.scale;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *P = thread_scratch(&a);
        float *dP = P + (size_t)QB * T;
        size_t base = (size_t)b * T * C3 + h * hs;
        const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
        const float *o = out + (size_t)b * T * C + h * hs, *dO = dout + (size_t)b * T * C + h * hs;
        const float *l = lse + (size_t)bh * T;
        for (int t = 0; t < T; t++) {
            memset(dk + (size_t)t * C3, 0, hs * sizeof(float));
            memset(dv + (size_t)t * C3, 0, hs * sizeof(float));
        }
        const int *sg = seg ? seg + (size_t)b * T : NULL;
        for (int t0 = 0, nq; t0 < T; t0 += nq) {
            nq = block_rows(sg, t0, T);
            int k0 = first_key(sg, t0), nk = t0 + nq - k0;
            size_t ko = (size_t)k0 * C3;
            cpu_gemm(0, 1, nq, nk, hs, 1.0f, q + (size_t)t0 * C3, C3, k + ko, C3, 0.0f, P, nk);
            cpu_gemm(0, 1, nq, nk, hs, 1.0f, dO + (size_t)t0 * C, C, v + ko, C3, 0.0f, dP, nk);
            for (int i = 0, t = t0; i < nq; i++, t++)
                softmax_grad_row(P + (size_t)i * nk, dP + (size_t)i * nk, first_key(sg, t) - k0, t + 1 - k0, nk,
                                 o + (size_t)t * C, dO + (size_t)t * C, hs, l[t], scale);
            cpu_gemm(0, 0, nq, hs, nk, 1.0f, dP, nk, k + ko, C3, 0.0f, dq + (size_t)t0 * C3, C3);
            cpu_gemm(1, 0, nk, hs, nq, 1.0f, dP, nk, q + (size_t)t0 * C3, C3, 1.0f, dk + ko, C3);
            cpu_gemm(1, 0, nk, hs, nq, 1.0f, P, nk, dO + (size_t)t0 * C, C, 1.0f, dv + ko, C3);
        }
    }
}

/* ---- ring attention's blocks (context parallelism) ---- */

/* Keys of the block query position p sees: a prefix, kpos being ascending. */
static int visible(const int *kpos, int Tk, int p) {
    int lo = 0, hi = Tk;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (kpos[mid] <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Documents: the first key of the block a query whose document starts at position s sees
 * (qseg NULL: 0). */
static int seen_from(const int *kpos, int Tk, const int *qseg, int i) { return qseg ? visible(kpos, Tk, qseg[i] - 1) : 0; }

/* Row i of a block from key k0: its visible keys [*lo, *len), empty when it sees none. */
static void row_range(const int *kpos, int Tk, const int *qpos, const int *qseg, int i, int k0, int *lo, int *len) {
    *lo = seen_from(kpos, Tk, qseg, i) - k0;
    *len = visible(kpos, Tk, qpos[i]) - k0;
    if (*len < *lo) *len = *lo;
}

/* Keys a block of nq query rows (positions qpos[0..nq)) needs: the most any row sees. */
static int block_keys(const int *kpos, int Tk, const int *qpos, int nq) {
    int nk = 0;
    for (int i = 0; i < nq; i++) {
        int n = visible(kpos, Tk, qpos[i]);
        nk = n > nk ? n : nk;
    }
    return nk;
}

void cpu_attention_part_fwd(float *out, float *lse, const float *qkv, const float *kv, const int *qpos, const int *qseg,
                            const int *kpos, int B, int Tq, int Tk, int C, int NH) {
    attn_call a = attn_begin(C, NH, Tk + C / NH); /* per thread: S (QB x Tk), the block's output (QB x hs) */
    int hs = a.hs, C3 = a.C3;
    float scale = a.scale;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *S = thread_scratch(&a), *Ob = S + (size_t)QB * Tk;
        const float *q = qkv + (size_t)b * Tq * C3 + h * hs;
        const float *k = kv + (size_t)b * Tk * C3 + C + h * hs, *v = k + C;
        float *o = out + (size_t)b * Tq * C + h * hs, *l = lse + (size_t)bh * Tq;
        const int *qs = qseg ? qseg + (size_t)b * Tq : NULL;
        for (int t0 = 0; t0 < Tq; t0 += QB) {
            int nq = Tq - t0 < QB ? Tq - t0 : QB, k0 = seen_from(kpos, Tk, qs, t0);
            int nk = block_keys(kpos, Tk, qpos + t0, nq) - k0;
            if (nk <= 0) continue;
            size_t ko = (size_t)k0 * C3;
            cpu_gemm(0, 1, nq, nk, hs, 1.0f, q + (size_t)t0 * C3, C3, k + ko, C3, 0.0f, S, nk);
            float lb[QB]; /* the block's softmax over the keys each row sees */
            for (int i = 0; i < nq; i++) {
                int lo, len;
                row_range(kpos, Tk, qpos, qs, t0 + i, k0, &lo, &len);
                lb[i] = softmax_row(S + (size_t)i * nk, lo, len, nk, scale);
            }
            cpu_gemm(0, 0, nq, hs, nk, 1.0f, S, nk, v + ko, C3, 0.0f, Ob, hs);
            for (int i = 0; i < nq; i++) { /* online softmax: weigh the old and the block's output by their mass */
                if (lb[i] == -INFINITY) continue;
                float *oi = o + (size_t)(t0 + i) * C, *bi = Ob + (size_t)i * hs, lo = l[t0 + i];
                float mx = lo > lb[i] ? lo : lb[i];
                float lnew = mx + logf(expf(lo - mx) + expf(lb[i] - mx));
                float wo = expf(lo - lnew), wb = expf(lb[i] - lnew);
                for (int d = 0; d < hs; d++) oi[d] = oi[d] * wo + bi[d] * wb;
                l[t0 + i] = lnew;
            }
        }
    }
}

void cpu_attention_part_bwd(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *kv,
                            const float *out, const float *lse, const int *qpos, const int *qseg, const int *kpos, int B,
                            int Tq, int Tk, int C, int NH) {
    attn_call a = attn_begin(C, NH, Tk); /* per thread: P and dP (QB x Tk each) */
    int hs = a.hs, C3 = a.C3;
    float scale = a.scale;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *P = thread_scratch(&a), *dP = P + (size_t)QB * Tk;
        size_t qb = (size_t)b * Tq * C3 + h * hs, kb = (size_t)b * Tk * C3 + C + h * hs;
        const float *q = qkv + qb, *k = kv + kb, *v = k + C;
        float *dq = dqkv + qb, *dk = dkv + kb, *dv = dk + C;
        const float *o = out + (size_t)b * Tq * C + h * hs, *dO = dout + (size_t)b * Tq * C + h * hs;
        const float *l = lse + (size_t)bh * Tq;
        const int *qs = qseg ? qseg + (size_t)b * Tq : NULL;
        for (int t0 = 0; t0 < Tq; t0 += QB) {
            int nq = Tq - t0 < QB ? Tq - t0 : QB, k0 = seen_from(kpos, Tk, qs, t0);
            int nk = block_keys(kpos, Tk, qpos + t0, nq) - k0;
            if (nk <= 0) continue;
            size_t ko = (size_t)k0 * C3;
            cpu_gemm(0, 1, nq, nk, hs, 1.0f, q + (size_t)t0 * C3, C3, k + ko, C3, 0.0f, P, nk);
            cpu_gemm(0, 1, nq, nk, hs, 1.0f, dO + (size_t)t0 * C, C, v + ko, C3, 0.0f, dP, nk);
            for (int i = 0, t = t0; i < nq; i++, t++) { /* with the merged output's lse and rowsum(dO * O) */
                int lo, len;
                row_range(kpos, Tk, qpos, qs, t, k0, &lo, &len);
                softmax_grad_row(P + (size_t)i * nk, dP + (size_t)i * nk, lo, len, nk, o + (size_t)t * C,
                                 dO + (size_t)t * C, hs, l[t], scale);
            }
            cpu_gemm(0, 0, nq, hs, nk, 1.0f, dP, nk, k + ko, C3, 1.0f, dq + (size_t)t0 * C3, C3);
            cpu_gemm(1, 0, nk, hs, nq, 1.0f, dP, nk, q + (size_t)t0 * C3, C3, 1.0f, dk + ko, C3);
            cpu_gemm(1, 0, nk, hs, nq, 1.0f, P, nk, dO + (size_t)t0 * C, C, 1.0f, dv + ko, C3);
        }
    }
}

/* ---- canonical query chunks (bitwise mode with context parallelism) ---- */

/* Chunk k's query rows [p0[k], p0[k] + Tc) against every key before them in their
 * document (qkv: the whole sequence; qseg: the local rows' document starts, positions of
 * the sequence; NULL: none), in blocks of at most QB rows that never cross the chunk's end
 * or a document's: a row's GEMMs are the same whichever rank's list holds its chunk. out,
 * lse: the listed chunks' rows in list order ([B, nchunks·Tc, C], [B, NH, nchunks·Tc]). */
void cpu_attention_chunks_fwd(float *out, float *lse, const float *qkv, const int *qseg, int B, int T, int C, int NH,
                              const int *p0, int nchunks, int Tc) {
    attn_call a = attn_begin(C, NH, T);
    int hs = a.hs, C3 = a.C3, Tq = nchunks * Tc;
    float scale = a.scale;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *S = thread_scratch(&a);
        const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        const int *sg = qseg ? qseg + (size_t)b * Tq : NULL; /* the local rows' document starts */
        for (int c = 0; c < nchunks; c++)
            for (int t0 = p0[c], nq; t0 < p0[c] + Tc; t0 += nq) {
                int r = c * Tc + (t0 - p0[c]); /* the block's first local row */
                nq = block_rows(sg, r, r + p0[c] + Tc - t0); /* local rows r.. to the chunk's end */
                int k0 = sg ? sg[r] : 0, nk = t0 + nq - k0;
                cpu_gemm(0, 1, nq, nk, hs, 1.0f, q + (size_t)t0 * C3, C3, k + (size_t)k0 * C3, C3, 0.0f, S, nk);
                for (int i = 0; i < nq; i++) /* row t0 + i sees keys k0 .. t0 + i (its document's) */
                    lse[(size_t)bh * Tq + r + i] = softmax_row(S + (size_t)i * nk, 0, t0 + i + 1 - k0, nk, scale);
                cpu_gemm(0, 0, nq, hs, nk, 1.0f, S, nk, v + (size_t)k0 * C3, C3, 0.0f,
                         out + ((size_t)b * Tq + r) * C + h * hs, C);
            }
    }
}

/* The backward of the same rows: dq into the q columns of dqkv's local rows ([B, Tq, 3C]),
 * and each listed chunk's share of dk and dv, summed over its blocks in order, into
 * leaf[c] ([B, T, 2C]: dk | dv; keys [0, p0[c] + Tc) written, the rest untouched). */
void cpu_attention_chunks_bwd(float *dqkv, float *const *leaf, const float *dout, const float *qkv, const float *out,
                              const float *lse, const int *qseg, int B, int T, int C, int NH, const int *p0, int nchunks,
                              int Tc) {
    attn_call a = attn_begin(C, NH, T);
    int hs = a.hs, C3 = a.C3, Tq = nchunks * Tc, C2 = 2 * C;
    float scale = a.scale;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *P = thread_scratch(&a), *dP = P + (size_t)QB * T;
        const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        const float *o = out + (size_t)b * Tq * C + h * hs, *dO = dout + (size_t)b * Tq * C + h * hs;
        const float *l = lse + (size_t)bh * Tq;
        const int *sg = qseg ? qseg + (size_t)b * Tq : NULL;
        float *dq = dqkv + (size_t)b * Tq * C3 + h * hs;
        for (int c = 0; c < nchunks; c++) {
            float *dk = leaf[c] + (size_t)b * T * C2 + h * hs, *dv = dk + C;
            for (int t = 0; t < p0[c] + Tc; t++) {
                memset(dk + (size_t)t * C2, 0, hs * sizeof(float));
                memset(dv + (size_t)t * C2, 0, hs * sizeof(float));
            }
            for (int t0 = p0[c], nq; t0 < p0[c] + Tc; t0 += nq) {
                int r = c * Tc + (t0 - p0[c]);
                nq = block_rows(sg, r, r + p0[c] + Tc - t0); /* local rows r.. to the chunk's end */
                int k0 = sg ? sg[r] : 0, nk = t0 + nq - k0;
                size_t ko = (size_t)k0 * C3;
                const float *qb = q + (size_t)t0 * C3, *dOb = dO + (size_t)r * C;
                cpu_gemm(0, 1, nq, nk, hs, 1.0f, qb, C3, k + ko, C3, 0.0f, P, nk);
                cpu_gemm(0, 1, nq, nk, hs, 1.0f, dOb, C, v + ko, C3, 0.0f, dP, nk);
                for (int i = 0; i < nq; i++)
                    softmax_grad_row(P + (size_t)i * nk, dP + (size_t)i * nk, 0, t0 + i + 1 - k0, nk,
                                     o + (size_t)(r + i) * C, dOb + (size_t)i * C, hs, l[r + i], scale);
                cpu_gemm(0, 0, nq, hs, nk, 1.0f, dP, nk, k + ko, C3, 0.0f, dq + (size_t)r * C3, C3);
                cpu_gemm(1, 0, nk, hs, nq, 1.0f, dP, nk, qb, C3, 1.0f, dk + (size_t)k0 * C2, C2);
                cpu_gemm(1, 0, nk, hs, nq, 1.0f, P, nk, dOb, C, 1.0f, dv + (size_t)k0 * C2, C2);
            }
        }
    }
}
