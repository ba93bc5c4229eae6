/* The CUDA backend's Llama kernels (src/backend/cuda/llama_kernels.cuh), their very
 * source, run on host threads by tests/warp_sim.h against the CPU backend (fp32, and its
 * bf16-storage adapter on the same bf16 inputs): RMSNorm forward and backward (the plain
 * and the 16-byte-vector kernels, the weight gradient's ordered partials over several
 * chunks of rows), SwiGLU (dup written over dout, as the contract allows), and the rotary
 * embeddings with grouped heads (head sizes 32 and 64, 1, 2 and 4 query heads per key/value
 * head, positions not starting at 0 and restarting every few rows). Rows that fill no
 * whole block and grids smaller than the work (the grid-stride loops) are included.
 * Outputs are poisoned (NaN) first and must be written; accumulated outputs start from
 * random values. Tolerance: ‖sim − cpu‖ / ‖cpu‖ under 1e-5 in fp32 (only summation order
 * differs), 1e-2 in bf16 (a rounding may fall the other way). */
#include "warp_sim.h"

#include <vector>

#include "../src/backend/cuda/llama_kernels.cuh"

extern "C" {
#include "backend/ops.h"
}

using namespace dt_llama;

static int failures;
static const dt_ops *H; /* the CPU reference: fp32 or bf16 storage */
static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float uniform(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0) - 1.0);
}

template <typename T> static std::vector<T> rnd(size_t n, float scale, float offset = 0.0f) {
    std::vector<T> v(n);
    for (auto &x : v) x = st<T>(offset + scale * uniform());
    return v;
}
template <typename T> static std::vector<T> poisoned(size_t n) { return std::vector<T>(n, st<T>(NAN)); }
template <typename T> static float *F(std::vector<T> &v) { return (float *)v.data(); }
template <typename T> static const float *F(const std::vector<T> &v) { return (const float *)v.data(); }
template <typename T> static const char *prec(void) { return sizeof(T) == 2 ? "bf16" : "fp32"; }

template <typename T, typename R>
static void check(const char *what, const std::vector<T> &got, const std::vector<R> &ref, double tol) {
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double g = ld(got[i]), r = ld(ref[i]);
        if (!std::isfinite(g)) bad++;
        num += (g - r) * (g - r);
        den += r * r;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    bool ok = bad == 0 && rel <= tol;
    printf("%-4s %s %-52s rel %.2e%s\n", ok ? "ok" : "FAIL", prec<T>(), what, rel,
           bad ? " (unwritten or not finite)" : "");
    failures += !ok;
}
template <typename T> static double tol(void) { return sizeof(T) == 2 ? 1e-2 : 1e-5; }

static sim_dim3 grid1(size_t x) { return sim_dim3{(unsigned)x, 1, 1}; }
/* a grid-stride loop's grid: at most `cap` blocks of 256 (fewer than the work) */
static sim_dim3 stride_grid(size_t n, size_t cap) { return grid1(n / 256 + 1 < cap ? n / 256 + 1 : cap); }

template <typename T> static void test_rmsnorm(int N, int C, bool vectorised) {
    if (vectorised && C % (32 * dt_vec<T>::N) != 0) return;
    const float eps = 1e-5f;
    size_t NC = (size_t)N * C;
    auto x = rnd<T>(NC, 2.0f), w = rnd<T>(C, 0.2f, 1.0f), dy = rnd<T>(NC, 1.0f);
    auto dx0 = rnd<T>(NC, 1.0f), dw0 = rnd<T>(C, 1.0f);
    /* the CPU */
    std::vector<T> y(NC), dx = dx0, dw = dw0;
    std::vector<float> r(N);
    H->rmsnorm_fwd(F(y), r.data(), F(x), F(w), N, C, eps);
    H->rmsnorm_bwd(F(dx), F(dw), F(dy), F(x), F(w), r.data(), N, C);
    /* the kernels */
    auto gy = poisoned<T>(NC);
    std::vector<float> gr(N, NAN);
    std::vector<T> gdx = dx0, gdw = dw0;
    sim_launch(grid1((N + WARPS - 1) / WARPS), THREADS, 0, [&] {
        if (vectorised) rms_fwd_vec_k<T>(gy.data(), gr.data(), x.data(), w.data(), N, C, eps);
        else rms_fwd_k<T>(gy.data(), gr.data(), x.data(), w.data(), N, C, eps);
    });
    /* the backward from the CPU's rstd, as test_cuda_ops feeds the GPU's own */
    sim_launch(grid1((N + WARPS - 1) / WARPS), THREADS, 0, [&] {
        if (vectorised) rms_bwd_dx_vec_k<T>(gdx.data(), dy.data(), x.data(), w.data(), r.data(), N, C);
        else rms_bwd_dx_k<T>(gdx.data(), dy.data(), x.data(), w.data(), r.data(), N, C);
    });
    int rows = dw_rows_per_chunk(N), chunks = dw_chunks(N), tiles = (C + COL_TILE - 1) / COL_TILE;
    std::vector<float> pw((size_t)chunks * C, NAN);
    sim_launch(sim_dim3{(unsigned)tiles, (unsigned)chunks, 1}, THREADS, DW_SMEM,
               [&] { rms_dw_partial_k<T>(pw.data(), dy.data(), x.data(), r.data(), N, C, rows); });
    sim_launch(grid1(tiles), THREADS, DW_SMEM, [&] { rms_dw_finish_k<T>(gdw.data(), pw.data(), chunks, C); });
    char name[96];
    snprintf(name, sizeof name, "rmsnorm N%d C%d%s (%d chunks): out", N, C, vectorised ? " vectorised" : "", chunks);
    check(name, gy, y, tol<T>());
    check("rmsnorm: rstd (fp32)", gr, r, 1e-6);
    check("rmsnorm: dinp (+=)", gdx, dx, tol<T>());
    check("rmsnorm: dw (+=)", gdw, dw, tol<T>());
}

template <typename T> static void test_swiglu(size_t n, size_t blocks) {
    auto g = rnd<T>(n, 4.0f), u = rnd<T>(n, 1.0f), d = rnd<T>(n, 1.0f);
    std::vector<T> y(n), dg(n), du(n);
    H->swiglu_fwd(F(y), F(g), F(u), n);
    H->swiglu_bwd(F(dg), F(du), F(d), F(g), F(u), n);
    auto gy = poisoned<T>(n), gdg = poisoned<T>(n);
    std::vector<T> gdu = d; /* dup written over dout */
    sim_launch(stride_grid(n, blocks), 256, 0, [&] { swiglu_fwd_k<T>(gy.data(), g.data(), u.data(), n); });
    sim_launch(stride_grid(n, blocks), 256, 0,
               [&] { swiglu_bwd_k<T>(gdg.data(), gdu.data(), gdu.data(), g.data(), u.data(), n); });
    char name[96];
    snprintf(name, sizeof name, "swiglu n%zu: out", n);
    check(name, gy, y, tol<T>());
    check("swiglu: dgate", gdg, dg, tol<T>());
    check("swiglu: dup (over dout)", gdu, du, tol<T>());
}

/* rows of T tokens: positions p0 .. p0 + T - 1, restarting every T rows */
template <typename T> static void test_rope(int N, int NH, int NKV, int HS, int T_, int p0, float theta) {
    int C = NH * HS, Ckv = NKV * HS;
    size_t nq = (size_t)N * C, nk = (size_t)N * Ckv;
    std::vector<int> pos(N);
    for (int i = 0; i < N; i++) pos[i] = p0 + i % T_;
    std::vector<float> f(HS / 2);
    for (int d = 0; d < HS / 2; d++) f[d] = (float)(1.0 / pow((double)theta, (double)(2 * d) / HS));
    auto q = rnd<T>(nq, 1.0f), k = rnd<T>(nk, 1.0f), v = rnd<T>(nk, 1.0f), dqkv = rnd<T>(3 * nq, 1.0f);
    std::vector<T> qkv(3 * nq), dq(nq), dk(nk), dv(nk);
    H->rope_qkv_fwd(F(qkv), F(q), F(k), F(v), pos.data(), f.data(), N, NH, NKV, HS);
    H->rope_qkv_bwd(F(dq), F(dk), F(dv), F(dqkv), pos.data(), f.data(), N, NH, NKV, HS);
    auto gqkv = poisoned<T>(3 * nq), gdq = poisoned<T>(nq), gdk = poisoned<T>(nk), gdv = poisoned<T>(nk);
    size_t nf = (size_t)N * 3 * NH * (HS / 2), nb = (size_t)N * (NH + NKV) * (HS / 2);
    sim_launch(stride_grid(nf, 7), 256, 0, [&] {
        rope_fwd_k<T>(gqkv.data(), q.data(), k.data(), v.data(), pos.data(), f.data(), N, NH, NKV, HS);
    });
    sim_launch(stride_grid(nb, 5), 256, 0, [&] {
        rope_bwd_k<T>(gdq.data(), gdk.data(), gdv.data(), dqkv.data(), pos.data(), f.data(), N, NH, NKV, HS);
    });
    char name[112];
    snprintf(name, sizeof name, "rope_qkv N%d NH%d NKV%d HS%d pos %d..: qkv", N, NH, NKV, HS, p0);
    check(name, gqkv, qkv, tol<T>());
    check("rope_qkv: dq", gdq, dq, tol<T>());
    check("rope_qkv: dk (group summed)", gdk, dk, tol<T>());
    check("rope_qkv: dv (group summed)", gdv, dv, tol<T>());
}

template <typename T> static void all(void) {
    static const int norms[][2] = {{1, 7}, {37, 32}, {150, 64}, {45, 96}, {520, 32}, {21, 128}, {13, 256}};
    for (auto &s : norms) {
        test_rmsnorm<T>(s[0], s[1], false);
        test_rmsnorm<T>(s[0], s[1], true);
    }
    test_swiglu<T>(1, 1);
    test_swiglu<T>(4099, 3);
    /* N, NH, NKV, HS, rows per sequence, first position, theta */
    static const int ropes[][6] = {{37, 4, 4, 32, 16, 5},     {50, 4, 2, 64, 20, 1000}, {29, 8, 2, 32, 29, 123},
                                   {40, 4, 1, 64, 8, 30000}, {3, 2, 1, 32, 3, 1},      {65, 8, 4, 64, 64, 7}};
    for (auto &s : ropes) test_rope<T>(s[0], s[1], s[2], s[3], s[4], s[5], s[0] % 2 ? 10000.0f : 500000.0f);
}

int main(void) {
    H = dt_ops_cpu();
    all<float>();
    H = dt_ops_bf16_storage(dt_ops_cpu());
    all<bf16>();
    if (H->sync() != DT_OK) {
        printf("FAIL %s\n", dt_error_message());
        failures++;
    }
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
