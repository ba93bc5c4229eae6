/* Launches of the register-resident tensor-core attention (flash_attention.cuh): bf16,
 * head size 32 or 64, C % 8 == 0. attention.cu picks it first where the shape allows. */
#include <stdlib.h>
#include <string.h>

#include "flash_attention.cuh"

int dt_cuda_attention_mma_ok(int C, int NH) {
    int HS = C / NH;
    return HS == 32 || HS == 64; /* then C % 8 == 0: every row starts 16-byte aligned */
}

/* Query rows per warp in the forward: 32 (two 16-row tiles sharing each K/V fragment,
 * the default) or 16 (DT_CUDA_FA_ROWS=16, to compare). */
static int fwd_tiles(void) {
    static int mt;
    if (!mt) {
        const char *e = getenv("DT_CUDA_FA_ROWS");
        mt = e && !strcmp(e, "16") ? 1 : 2;
    }
    return mt;
}

/* above 48 KB of dynamic shared memory a kernel must opt in, once per process */
template <int HS> static void set_smem_limits(void) {
    static int done;
    if (done) return;
    cudaError_t e = cudaFuncSetAttribute(dt_fa::fwd_k<HS, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)dt_fa::fwd_smem<HS, 1>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(dt_fa::fwd_k<HS, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)dt_fa::fwd_smem<HS, 2>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(dt_fa::bwd_kv_k<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)dt_fa::bwd_kv_smem<HS>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(dt_fa::bwd_q_k<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)dt_fa::bwd_q_smem<HS>());
    if (e != cudaSuccess) dt_cuda_record("attention (mma): shared memory limit", cudaGetErrorString(e));
    else done = 1;
}

template <int HS>
static void fwd(bf16 *out, float *lse, const bf16 *qkv, const int *seg, int B, int T, int C, int NH) {
    set_smem_limits<HS>();
    float scale = 1.0f / sqrtf((float)HS);
    if (fwd_tiles() == 2) {
        dim3 grid(B * NH, (T + 2 * dt_fa::BR - 1) / (2 * dt_fa::BR));
        dt_fa::fwd_k<HS, 2><<<grid, dt_fa::THREADS, dt_fa::fwd_smem<HS, 2>(), dt_cuda_stream()>>>(out, lse, qkv, seg, T,
                                                                                                C, NH, scale);
    } else {
        dim3 grid(B * NH, (T + dt_fa::BR - 1) / dt_fa::BR);
        dt_fa::fwd_k<HS, 1><<<grid, dt_fa::THREADS, dt_fa::fwd_smem<HS, 1>(), dt_cuda_stream()>>>(out, lse, qkv, seg, T,
                                                                                                C, NH, scale);
    }
    DT_CUDA_LAUNCHED("attention_fwd (mma)");
}

template <int HS>
static void bwd(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *D, const int *seg, int B,
                int T, int C, int NH) {
    set_smem_limits<HS>();
    dim3 grid(B * NH, (T + dt_fa::BR - 1) / dt_fa::BR);
    float scale = 1.0f / sqrtf((float)HS);
    dt_fa::bwd_kv_k<HS><<<grid, dt_fa::THREADS, dt_fa::bwd_kv_smem<HS>(), dt_cuda_stream()>>>(dqkv, dout, qkv, lse, D,
                                                                                             seg, T, C, NH, scale);
    DT_CUDA_LAUNCHED("attention_bwd_kv (mma)");
    dt_fa::bwd_q_k<HS><<<grid, dt_fa::THREADS, dt_fa::bwd_q_smem<HS>(), dt_cuda_stream()>>>(dqkv, dout, qkv, lse, D,
                                                                                           seg, T, C, NH, scale);
    DT_CUDA_LAUNCHED("attention_bwd_q (mma)");
}

void dt_cuda_attention_mma_fwd(bf16 *out, float *lse, const bf16 *qkv, const int *seg, int B, int T, int C, int NH) {
    if (C / NH == 32) fwd<32>(out, lse, qkv, seg, B, T, C, NH);
    else fwd<64>(out, lse, qkv, seg, B, T, C, NH);
}

void dt_cuda_attention_mma_bwd(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *D,
                               const int *seg, int B, int T, int C, int NH) {
    if (C / NH == 32) bwd<32>(dqkv, dout, qkv, lse, D, seg, B, T, C, NH);
    else bwd<64>(dqkv, dout, qkv, lse, D, seg, B, T, C, NH);
}
