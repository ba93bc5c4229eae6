/* CPU backend internals: the functions behind dt_ops_cpu(). */
#ifndef DT_CPU_H
#define DT_CPU_H
#include <stddef.h>
#include <stdint.h>

#include "../../core/token.h"

typedef void cpu_gemm_fn(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);
cpu_gemm_fn cpu_gemm;
/* The same product over fixed tiles of C, one single-threaded BLAS call each (gemm_tiles.c):
 * its bits do not depend on the thread count. */
cpu_gemm_fn cpu_gemm_tiled;
/* count products of one shape (the blocks of one of canon blocks), all their tiles in one
 * parallel region; a block's tiles are set by its shape and canon alone (gemm_tiles.c) */
void cpu_gemm_blocks_tiled(int transA, int transB, int M, int N, int K, float alpha, const float *const *A, int lda,
                           const float *const *B, int ldb, float beta, float *const *C, int ldc, int count, int canon);
/* The linear layers over either GEMM */
void cpu_linear_fwd_by(cpu_gemm_fn *gemm, float *out, const float *inp, const float *w, const float *bias, int N,
                       int IC, int OC);
void cpu_linear_bwd_by(cpu_gemm_fn *gemm, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                       const float *w, int N, int IC, int OC, int acc_dinp);
void cpu_linear_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC);
void cpu_linear_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N,
                    int IC, int OC, int acc_dinp);
void cpu_colsum_acc(float *dst, const float *src, int N, int C);
void cpu_embed_fwd(float *out, const dt_token *tok, const float *wte, const float *wpe, int B, int T, int C, int v0,
                   int rows);
void cpu_embed_bwd(float *dwte, float *dwpe, const float *dout, const dt_token *tok, int B, int T, int C, int v0,
                   int rows);
void cpu_xent_rowmax(const float *logits, float *mx, int N, int Vl, int real);
void cpu_xent_rowsum(const float *logits, const float *mx, const dt_token *targets, float *st, int N, int Vl, int real,
                     int v0);
void cpu_xent_finish(float *logits, float *losses, const float *mx, const float *st, const dt_token *targets, int N,
                     int Vl, int real, int v0, float scale);
void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                       int C);
void cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                       const float *mean, const float *rstd, int N, int C);
void cpu_gelu_fwd(float *out, const float *inp, size_t n);
void cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
void cpu_add(float *out, const float *a, const float *b, size_t n);
void cpu_add_rows(float *out, int ldo, const float *a, int lda, const float *b, int ldb, int rows, int n);
void cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void cpu_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                     int N, int C);
void cpu_swiglu_fwd(float *out, const float *gate, const float *up, size_t n);
void cpu_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
void cpu_rope_qkv_fwd(float *qkv, const float *q, const float *k, const float *v, const int *pos,
                      const float *inv_freq, int N, int NH, int NKV, int HS);
void cpu_rope_qkv_bwd(float *dq, float *dk, float *dv, const float *dqkv, const int *pos, const float *inv_freq,
                      int N, int NH, int NKV, int HS);
void cpu_attention_fwd(float *out, float *lse, const float *qkv, const int *seg, int B, int T, int C, int NH);
void cpu_attention_part_fwd(float *out, float *lse, const float *qkv, const float *kv, const int *qpos, const int *qseg,
                            const int *kpos, int B, int Tq, int Tk, int C, int NH);
void cpu_attention_part_bwd(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *kv,
                            const float *out, const float *lse, const int *qpos, const int *qseg, const int *kpos, int B,
                            int Tq, int Tk, int C, int NH);
void cpu_attention_chunks_fwd(float *out, float *lse, const float *qkv, const int *qseg, int B, int T, int C, int NH,
                              const int *p0, int nchunks, int Tc);
void cpu_attention_chunks_bwd(float *dqkv, float *const *leaf, const float *dout, const float *qkv, const float *out,
                              const float *lse, const int *qseg, int B, int T, int C, int NH, const int *p0, int nchunks,
                              int Tc);
void cpu_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                       const int *seg, int B, int T, int C, int NH);
void cpu_softmax_xent(float *logits, float *losses, const dt_token *targets, int N, int V, int Vp, float scale);
double cpu_sumsq(const float *x, size_t n);
double cpu_sum(const float *x, size_t n);
void cpu_adamw(float *p, float *p_store, const float *g, float *m, float *v, size_t n, float lr, float beta1,
               float beta2, float eps, float wd, float bc1, float bc2, float gscale);

#endif
