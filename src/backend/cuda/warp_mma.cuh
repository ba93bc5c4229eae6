/* The warp-level primitives the tensor-core kernels are written in: mma.sync m16n8k16
 * (bf16 operands, fp32 accumulation), ldmatrix (plain and transposed), quad shuffles,
 * barriers, bf16 packing and exp2. Kernels use only these (and plain loads and stores),
 * so the same kernel source also compiles as host C++ against tests/warp_sim.h, which
 * runs each CUDA thread as a host thread and gives these primitives the semantics the
 * PTX manual states: the kernels' index arithmetic is tested on a machine without a GPU.
 *
 * Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane = 4·g + t:
 *   A 16×16 (row): reg0 (row g, cols 2t,2t+1), reg1 (row g+8), reg2 (row g, cols 8+2t..),
 *                  reg3 (row g+8, cols 8+2t..); the lower column in the low half.
 *   B 16×8 (col):  reg0 (rows 2t,2t+1, col g), reg1 (rows 8+2t.., col g).
 *   C/D 16×8:      c0,c1 (row g, cols 2t,2t+1), c2,c3 (row g+8, cols 2t,2t+1). */
#ifndef DT_WARP_MMA_CUH
#define DT_WARP_MMA_CUH

#ifndef DT_WARP_SIM
#include <stdint.h>

#include "cuda_internal.h"

#define DT_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

static __device__ __forceinline__ void dt_syncthreads(void) { __syncthreads(); }
static __device__ __forceinline__ void dt_syncwarp(void) { __syncwarp(); }
static __device__ __forceinline__ float dt_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

/* d += a·b (16×16 by 16×8) */
static __device__ __forceinline__ void dt_mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8×8 bf16 matrices from shared memory: lane l gives the address of row l%8 of
 * matrix l/8 (16 bytes, 16-byte aligned); r[j] receives matrix j's (row g, cols 2t,2t+1),
 * or with _t its transpose's: (rows 2t,2t+1, col g). */
static __device__ __forceinline__ void dt_ldsm_x4(uint32_t r[4], const void *p) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
static __device__ __forceinline__ void dt_ldsm_x4_t(uint32_t r[4], const void *p) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* two floats rounded to bf16 (nearest even), lo in the low half */
static __device__ __forceinline__ uint32_t dt_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
static __device__ __forceinline__ float dt_bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float dt_bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

/* Asynchronous 16-byte copy global -> shared (cp.async, Ampere on): `valid` false fills
 * zeros and reads nothing. Copies issued since the last commit form a group; wait<N>
 * returns once at most N of this thread's groups are still in flight. Other threads see
 * the data after a barrier that follows the wait. Both addresses 16-byte aligned. */
static __device__ __forceinline__ void dt_cp_async16(void *dst, const void *src, bool valid) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void dt_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void dt_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* 2^x (the hardware's approximation, relative error about 2^-22; exp2(-inf) = 0) */
static __device__ __forceinline__ float dt_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif /* !DT_WARP_SIM */

/* Fragment loads from row-major shared memory with row stride LD (bf16 elements). */
/* A: the 16×16 block at base */
template <int LD> static __device__ __forceinline__ void dt_frag_a(uint32_t r[4], const bf16 *base, int lane) {
    dt_ldsm_x4(r, base + (lane & 15) * LD + (lane >> 4) * 8);
}
/* B for two n-tiles from storage indexed [n][k] (16 n × 16 k at base): {r0,r1} n 0-7,
 * {r2,r3} n 8-15 */
template <int LD> static __device__ __forceinline__ void dt_frag_b_nk(uint32_t r[4], const bf16 *base, int lane) {
    dt_ldsm_x4(r, base + ((lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8);
}
/* B for two n-tiles from storage indexed [k][n] (16 k × 16 n at base), transposed on load */
template <int LD> static __device__ __forceinline__ void dt_frag_b_kn(uint32_t r[4], const bf16 *base, int lane) {
    dt_ldsm_x4_t(r, base + (((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8);
}

#endif
