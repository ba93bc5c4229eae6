/* A warp's sum and 16-byte vector loads and stores (8 bf16 or 4 fp32 elements), shared by
 * the elementwise kernels (kernels.cu: LayerNorm) and the Llama family's (llama_kernels.cuh:
 * RMSNorm). Written against warp_mma.cuh's primitives, so it compiles on the device and
 * under tests/warp_sim.h alike. */
#ifndef DT_WARP_VEC_CUH
#define DT_WARP_VEC_CUH
#include "warp_mma.cuh"

static __device__ __forceinline__ float dt_warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += dt_shfl_xor(v, o);
    return v;
}

template <typename T> struct dt_vec { enum { N = 16 / sizeof(T) }; };
template <typename T> static __device__ __forceinline__ void dt_load_vec(const T *p, float (&f)[dt_vec<T>::N]) {
    uint4 u = *(const uint4 *)p;
    const T *e = (const T *)&u;
#pragma unroll
    for (int i = 0; i < dt_vec<T>::N; i++) f[i] = ld(e[i]);
}
template <typename T> static __device__ __forceinline__ void dt_store_vec(T *p, const float (&f)[dt_vec<T>::N]) {
    uint4 u;
    T *e = (T *)&u;
#pragma unroll
    for (int i = 0; i < dt_vec<T>::N; i++) e[i] = st<T>(f[i]);
    *(uint4 *)p = u;
}

#endif
