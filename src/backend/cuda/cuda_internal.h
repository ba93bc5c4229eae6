/* CUDA backend internals: one stream, one error slot, shared scratch. Every kernel
 * is queued on dt_cuda_stream(); a failed launch or library call is recorded (first
 * failure wins) and returned by the next sync, since ops functions return nothing. */
#ifndef DT_CUDA_INTERNAL_H
#define DT_CUDA_INTERNAL_H
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../ops.h"
}

/* Storage types: kernels are templates over T (float or bf16), load to fp32, compute in
 * fp32, store rounded to T. */
typedef __nv_bfloat16 bf16;
static __device__ __forceinline__ float ld(float x) { return x; }
static __device__ __forceinline__ float ld(bf16 x) { return __bfloat162float(x); }
template <typename T> static __device__ __forceinline__ T st(float x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 st<bf16>(float x) { return __float2bfloat16_rn(x); }

cudaStream_t dt_cuda_stream(void);
/* Records the first failure ("what: detail"); later ones are dropped. */
void dt_cuda_record(const char *what, const char *detail);
/* Records cudaGetLastError() after a launch, naming the kernel. */
void dt_cuda_check_launch(const char *kernel);
#define DT_CUDA_LAUNCHED(name) dt_cuda_check_launch(name)
/* Device scratch of at least `bytes`, valid until the next call (grows, never per step
 * once the largest size has been seen). NULL (and a recorded error) on failure. */
void *dt_cuda_scratch(size_t bytes);
int dt_cuda_sm_count(void);
/* Counts device memory allocated outside the ops table (library workspaces) in the peak. */
void dt_cuda_count_alloc(size_t bytes);

/* gemm.cu: T = float (fp32 arithmetic) or bf16 (bf16 operands, fp32 accumulation) */
int dt_cuda_gemm_init(void);
template <typename T>
void cuda_gemm(int transA, int transB, int M, int N, int K, float alpha, const T *A, int lda, const T *B, int ldb,
               float beta, T *C, int ldc);
template <typename T>
void cuda_linear_fwd(T *out, const T *inp, const T *w, const T *bias, int N, int IC, int OC);
template <typename T>
void cuda_linear_bwd(T *dinp, T *dw, T *dbias, const T *dout, const T *inp, const T *w, int N, int IC, int OC,
                     int acc_dinp);

/* fused GELU epilogues (bf16); 0: cuBLASLt has no algorithm for them here (run the
 * plain GEMM and the GELU kernel instead) */
template <typename T>
int cuda_linear_gelu_fwd(T *out, T *pre, const T *inp, const T *w, const T *bias, int N, int IC, int OC);
template <typename T> int cuda_linear_dgelu_bwd(T *dinp, const T *dout, const T *w, const T *pre, int N, int IC, int OC);

/* reduce.cu: deterministic column sums and whole-buffer sums */
template <typename T> void cuda_colsum_acc(T *dst, const T *src, int N, int C);
template <typename T> double cuda_sumsq(const T *x, size_t n);
double dt_cuda_sum(const float *x, size_t n);

/* kernels.cu */
template <typename T>
void cuda_embed_fwd(T *out, const dt_token *tok, const T *wte, const T *wpe, int B, int Tn, int C, int v0, int rows);
template <typename T>
void cuda_embed_bwd(T *dwte, T *dwpe, const T *dout, const dt_token *tok, int B, int Tn, int C, int v0, int rows);
template <typename T>
void cuda_layernorm_fwd(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N, int C);
template <typename T>
void cuda_layernorm_bwd(T *dinp, T *dw, T *db, const T *dout, const T *inp, const T *w, const float *mean,
                        const float *rstd, int N, int C);
template <typename T> void cuda_gelu_fwd(T *out, const T *inp, size_t n);
template <typename T> void cuda_gelu_bwd(T *dinp, const T *inp, const T *dout, size_t n);
template <typename T> void cuda_add(T *out, const T *a, const T *b, size_t n);
template <typename T>
void cuda_softmax_xent(T *logits, float *losses, const dt_token *targets, int N, int V, int Vp, float scale);
template <typename T>
void cuda_adamw(float *p, T *p_store, const T *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float wd, float bc1, float bc2, float gscale);
template <typename T> void cuda_xent_rowmax(const T *logits, float *mx, int N, int Vl, int real);
template <typename T>
void cuda_xent_rowsum(const T *logits, const float *mx, const dt_token *targets, float *st, int N, int Vl, int real,
                      int v0);
template <typename T>
void cuda_xent_finish(T *logits, float *losses, const float *mx, const float *st, const dt_token *targets, int N,
                      int Vl, int real, int v0, float scale);
void dt_cuda_to_bf16(void *dst, const float *src, size_t n);
void dt_cuda_from_bf16(float *dst, const void *src, size_t n);

/* llama.cu: the Llama family's kernels (llama_kernels.cuh); rstd, pos and inv_freq as ops.h
 * says (fp32, ints, fp32), device memory */
template <typename T>
void cuda_rmsnorm_fwd(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps);
template <typename T>
void cuda_rmsnorm_bwd(T *dinp, T *dw, const T *dout, const T *inp, const T *w, const float *rstd, int N, int C);
template <typename T> void cuda_swiglu_fwd(T *out, const T *gate, const T *up, size_t n);
template <typename T> void cuda_swiglu_bwd(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n);
template <typename T>
void cuda_rope_qkv_fwd(T *qkv, const T *q, const T *k, const T *v, const int *pos, const float *inv_freq, int N,
                       int NH, int NKV, int HS);
template <typename T>
void cuda_rope_qkv_bwd(T *dq, T *dk, T *dv, const T *dqkv, const int *pos, const float *inv_freq, int N, int NH,
                       int NKV, int HS);

/* attention_tc.cu: tensor-core attention for bf16 (head size 32/64/128, C % 8 == 0) */
int dt_cuda_attention_tc_ok(int C, int NH);
void dt_cuda_attention_tc_fwd(bf16 *out, float *lse, const bf16 *qkv, int B, int Tn, int C, int NH);
void dt_cuda_attention_tc_bwd(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *D, int B,
                              int Tn, int C, int NH);

/* attention_mma.cu: register-resident tensor-core attention for bf16 (head size 32/64) */
int dt_cuda_attention_mma_ok(int C, int NH);
/* seg: documents, as for cuda_attention_fwd */
void dt_cuda_attention_mma_fwd(bf16 *out, float *lse, const bf16 *qkv, const int *seg, int B, int Tn, int C, int NH);
void dt_cuda_attention_mma_bwd(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *D,
                               const int *seg, int B, int Tn, int C, int NH);

/* attention.cu; seg: documents (device memory, NULL: none), as ops.h's attention_fwd */
template <typename T>
void cuda_attention_fwd(T *out, float *lse, const T *qkv, const int *seg, int B, int Tn, int C, int NH);
template <typename T>
void cuda_attention_bwd(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, const int *seg, int B,
                        int Tn, int C, int NH);

#endif
