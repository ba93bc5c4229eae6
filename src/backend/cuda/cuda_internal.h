/* CUDA backend internals: one stream, one error slot, shared scratch. Every kernel
 * is queued on dt_cuda_stream(); a failed launch or library call is recorded (first
 * failure wins) and returned by the next sync, since ops functions return nothing. */
#ifndef DT_CUDA_INTERNAL_H
#define DT_CUDA_INTERNAL_H
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../ops.h"
}

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

/* gemm.cu */
int dt_cuda_gemm_init(void);
void dt_cuda_gemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc);
void dt_cuda_linear_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC);
void dt_cuda_linear_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                        int N, int IC, int OC, int acc_dinp);

/* reduce.cu: deterministic column sums and whole-buffer sums */
void dt_cuda_colsum_acc(float *dst, const float *src, int N, int C);
double dt_cuda_sumsq(const float *x, size_t n);
double dt_cuda_sum(const float *x, size_t n);

/* kernels.cu */
void dt_cuda_embed_fwd(float *out, const uint16_t *tok, const float *wte, const float *wpe, int B, int T, int C);
void dt_cuda_embed_bwd(float *dwte, float *dwpe, const float *dout, const uint16_t *tok, int B, int T, int C);
void dt_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                           int N, int C);
void dt_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C);
void dt_cuda_gelu_fwd(float *out, const float *inp, size_t n);
void dt_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
void dt_cuda_add(float *out, const float *a, const float *b, size_t n);
void dt_cuda_softmax_xent(float *logits, float *losses, const uint16_t *targets, int N, int V, int Vp, float scale);
void dt_cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                   float eps, float wd, float bc1, float bc2, float gscale);

/* attention.cu */
void dt_cuda_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void dt_cuda_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                           int B, int T, int C, int NH);

#endif
