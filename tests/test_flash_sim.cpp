/* The tensor-core attention kernels (src/backend/cuda/flash_attention.cuh), their very
 * source, run on host threads by tests/warp_sim.h: forward (out, lse) and backward (dq,
 * dk, dv) against a double-precision causal attention on the same bf16 inputs, for head
 * sizes 32 and 64 and lengths that do and do not fill the 64-row tiles. Every output
 * element is poisoned first (NaN) and must be written. A fragment-layout or masking
 * mistake gives errors of order one; the bf16 rounding of P and dS about 1e-3. Each case
 * runs twice, cp.async copies landing at their wait, then at once, and the two must agree
 * bit for bit: reading a tile before waiting for it fails the first way (NaN or stale
 * data), refilling a buffer another warp still reads the second, and a missing barrier
 * races under the simulator. Document cases (packed rows: each query sees keys from its
 * document's start on) check the tile skipping and masking against the same reference
 * restricted to the document. */
#include "warp_sim.h"

#include <vector>

#include "../src/backend/cuda/flash_attention.cuh"

static int failures;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0) - 1.0);
}

static float bf(bf16 x) { return sim_bf16_float(x.bits); }
static bf16 to_bf(float f) { return bf16{sim_bf16_bits(f)}; }

/* max |got - ref| over max |ref|; NaN or an unwritten element fails */
static void check(const char *what, int B, int T, int NH, int HS, const std::vector<float> &got,
                  const std::vector<double> &ref, double tol) {
    double err = 0, mag = 1e-30;
    bool finite = true;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i])) finite = false;
        err = fmax(err, fabs(got[i] - ref[i]));
        mag = fmax(mag, fabs(ref[i]));
    }
    bool ok = finite && err / mag <= tol;
    printf("%-4s B%d T%d NH%d HS%d %-4s max error %.2e of max %.2e (tolerance %.0e relative)%s\n", ok ? "ok" : "FAIL",
           B, T, NH, HS, what, err, mag, tol, finite ? "" : ", not finite");
    if (!ok) failures++;
}

/* doc_len > 0: rows packed with documents of 1 .. doc_len tokens (a fixed pseudo-random
 * sequence); 0: none */
template <int HS> static void run_case(int B, int T, int NH, int doc_len = 0) {
    const int C = NH * HS, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    const bf16 poison{0xffff};
    std::vector<bf16> qkv((size_t)B * T * C3), dout((size_t)B * T * C);
    for (auto &x : qkv) x = to_bf(2.0f * uniform());
    for (auto &x : dout) x = to_bf(uniform());
    std::vector<int> seg((size_t)B * T, 0); /* each query's first visible key */
    for (int b = 0; doc_len && b < B; b++)
        for (int t = 0, start = 0, left = 0; t < T; t++) {
            if (!left) start = t, left = 1 + (int)((uniform() + 1.0f) * 0.5f * (float)doc_len) % doc_len;
            seg[(size_t)b * T + t] = start, left--;
        }
    const int *sg = doc_len ? seg.data() : nullptr;

    /* the reference: double precision on the bf16 values */
    std::vector<double> ro((size_t)B * T * C), rl((size_t)B * NH * T), rdqkv((size_t)B * T * C3, 0.0);
    std::vector<double> P((size_t)T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto q = [&](int i, int d) { return (double)bf(qkv[((size_t)b * T + i) * C3 + h * HS + d]); };
            auto k = [&](int i, int d) { return (double)bf(qkv[((size_t)b * T + i) * C3 + C + h * HS + d]); };
            auto v = [&](int i, int d) { return (double)bf(qkv[((size_t)b * T + i) * C3 + 2 * C + h * HS + d]); };
            auto dO = [&](int i, int d) { return (double)bf(dout[((size_t)b * T + i) * C + h * HS + d]); };
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0;
                const int j0 = seg[(size_t)b * T + i];
                for (int j = j0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += q(i, d) * k(j, d);
                    P[(size_t)i * T + j] = s * scale;
                    mx = fmax(mx, s * scale);
                }
                for (int j = j0; j <= i; j++) sum += exp(P[(size_t)i * T + j] - mx);
                double l = mx + log(sum);
                rl[((size_t)b * NH + h) * T + i] = l;
                for (int j = j0; j <= i; j++) P[(size_t)i * T + j] = exp(P[(size_t)i * T + j] - l);
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = j0; j <= i; j++) o += P[(size_t)i * T + j] * v(j, d);
                    ro[((size_t)b * T + i) * C + h * HS + d] = o;
                }
            }
            for (int i = 0; i < T; i++) {
                double Di = 0;
                for (int d = 0; d < HS; d++) Di += dO(i, d) * ro[((size_t)b * T + i) * C + h * HS + d];
                for (int j = seg[(size_t)b * T + i]; j <= i; j++) {
                    double dp = 0;
                    for (int d = 0; d < HS; d++) dp += dO(i, d) * v(j, d);
                    double p = P[(size_t)i * T + j], ds = p * (dp - Di) * scale;
                    for (int d = 0; d < HS; d++) {
                        rdqkv[((size_t)b * T + i) * C3 + h * HS + d] += ds * k(j, d);
                        rdqkv[((size_t)b * T + j) * C3 + C + h * HS + d] += ds * q(i, d);
                        rdqkv[((size_t)b * T + j) * C3 + 2 * C + h * HS + d] += p * dO(i, d);
                    }
                }
            }
        }

    /* the kernels: cp.async copies landing at their wait, then at once */
    std::vector<float> got_o, got_l, got_d;
    std::vector<bf16> first_out, first_dqkv;
    std::vector<float> first_lse;
    bool same = true, same_rows = true;
    for (int eager = 0; eager < 2; eager++) {
        sim_cp_async_eager = eager;
        std::vector<bf16> out((size_t)B * T * C, poison), dqkv((size_t)B * T * C3, poison);
        std::vector<float> lse((size_t)B * NH * T, NAN), D((size_t)B * NH * T);
        sim_dim3 grid{(unsigned)(B * NH), (unsigned)((T + dt_fa::BR - 1) / dt_fa::BR), 1};
        sim_dim3 grid2{(unsigned)(B * NH), (unsigned)((T + 2 * dt_fa::BR - 1) / (2 * dt_fa::BR)), 1};
        sim_launch(grid2, dt_fa::THREADS, dt_fa::fwd_smem<HS, 2>(),
                   [&] { dt_fa::fwd_k<HS, 2>(out.data(), lse.data(), qkv.data(), sg, T, C, NH, scale); });
        /* 16 rows per warp instead of 32: the same arithmetic row by row, so the same bits */
        std::vector<bf16> out1((size_t)B * T * C, poison);
        std::vector<float> lse1((size_t)B * NH * T, NAN);
        sim_launch(grid, dt_fa::THREADS, dt_fa::fwd_smem<HS, 1>(),
                   [&] { dt_fa::fwd_k<HS, 1>(out1.data(), lse1.data(), qkv.data(), sg, T, C, NH, scale); });
        if (memcmp(out1.data(), out.data(), out.size() * 2) || memcmp(lse1.data(), lse.data(), lse.size() * 4))
            same_rows = false;
        for (int b = 0; b < B; b++) /* D = rowsum(dO∘O) over the kernel's own output, as attention.cu does */
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < T; i++) {
                    float s = 0;
                    for (int d = 0; d < HS; d++)
                        s += bf(dout[((size_t)b * T + i) * C + h * HS + d]) * bf(out[((size_t)b * T + i) * C + h * HS + d]);
                    D[((size_t)b * NH + h) * T + i] = s;
                }
        sim_launch(grid, dt_fa::THREADS, dt_fa::bwd_kv_smem<HS>(), [&] {
            dt_fa::bwd_kv_k<HS>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), sg, T, C, NH, scale);
        });
        sim_launch(grid, dt_fa::THREADS, dt_fa::bwd_q_smem<HS>(), [&] {
            dt_fa::bwd_q_k<HS>(dqkv.data(), dout.data(), qkv.data(), lse.data(), D.data(), sg, T, C, NH, scale);
        });
        if (!eager) {
            first_out = out, first_dqkv = dqkv, first_lse = lse;
            for (auto x : out) got_o.push_back(bf(x));
            got_l = lse;
            for (auto x : dqkv) got_d.push_back(bf(x));
        } else {
            same = !memcmp(out.data(), first_out.data(), out.size() * 2) &&
                   !memcmp(dqkv.data(), first_dqkv.data(), dqkv.size() * 2) &&
                   !memcmp(lse.data(), first_lse.data(), lse.size() * 4);
        }
    }
    check("out", B, T, NH, HS, got_o, ro, 1e-2);
    check("lse", B, T, NH, HS, got_l, rl, 2e-3); /* relative to the largest lse */
    /* dq, dk, dv separately: their scales differ */
    for (int part = 0; part < 3; part++) {
        std::vector<float> g;
        std::vector<double> r;
        for (size_t row = 0; row < (size_t)B * T; row++)
            for (int c = 0; c < C; c++) {
                g.push_back(got_d[row * C3 + part * C + c]);
                r.push_back(rdqkv[row * C3 + part * C + c]);
            }
        check(part == 0 ? "dq" : part == 1 ? "dk" : "dv", B, T, NH, HS, g, r, 2e-2);
    }
    printf("%-4s B%d T%d NH%d HS%d copies landing late or early: the same bits\n", same ? "ok" : "FAIL", B, T, NH, HS);
    if (!same) failures++;
    printf("%-4s B%d T%d NH%d HS%d forward with 16 or 32 rows per warp: the same bits\n", same_rows ? "ok" : "FAIL", B,
           T, NH, HS);
    if (!same_rows) failures++;
}

int main(void) {
    /* the ASan pass (make test-asan) runs the case with the most structure only */
    bool asan = getenv("DT_TEST_TIER") && !strcmp(getenv("DT_TEST_TIER"), "asan");
    if (!asan) run_case<64>(1, 17, 1); /* a tile mostly past the end */
    if (!asan) run_case<64>(1, 64, 1); /* one tile: the diagonal alone */
    run_case<32>(2, 100, 2);           /* a partial second tile, two heads, two sequences */
    if (!asan) run_case<64>(1, 136, 1); /* three tiles, the last partial */
    /* documents: short ones (most tiles skipped, masks inside tiles), then ones longer
     * than a tile (dK/dV's early stop, warps skipping within a block) */
    run_case<32>(2, 150, 2, 12);
    if (!asan) run_case<64>(1, 260, 1, 90);
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
