/* Every kernel the model and optimizer need, behind one table so the model does not
 * know which backend runs it (CPU today; CUDA implements the same table later).
 * Kernels know shapes, never ranks. Row-major throughout. Linear weights use the
 * Hugging Face GPT-2 (Conv1D) layout: w[in][out], y = x·w + b.
 * Shapes: N rows (tokens), C channels. "acc" arguments add into the output.
 *
 * Storage precision (bf16 below): activations, the model's parameters and gradients
 * are fp32, or bf16 with `precision: bf16`. Pointers are float* either way; with bf16
 * storage they point at bf16 data (offsets in elements of dt_elem_bytes). What stays
 * fp32 in both: LayerNorm mean/rstd, attention lse, per-token losses, the optimizer's
 * master weights and moments. Kernels compute in fp32. */
#ifndef DT_OPS_H
#define DT_OPS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../core/status.h"
#include "../core/token.h"

typedef struct dt_ops {
    const char *name;
    /* Memory the kernels run on: host memory for cpu, device memory for cuda (on_device).
     * Kernels and transfers run in order; on a device they may run after the call
     * returns, and a failure among them is reported by the next sync. */
    int on_device;
    int bf16; /* storage precision of activations, parameters, gradients (see above) */
    dt_status (*alloc)(void **p, size_t bytes, const char *what); /* zero-filled */
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes); /* complete on return */
    /* The same without waiting: complete after the next sync (NULL: download). A device
     * copies on a stream of its own once what is queued so far has run, so the copy
     * overlaps the compute queued after it. */
    void (*download_async)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);          /* within the backend's memory */
    dt_status (*sync)(void);
    /* Page-locked host memory (zero-filled, page-aligned) for buffers that cross to and from
     * the device often (offload.pin_memory: the offloaded state's buffers and staging), so
     * transfers run at the bus's rate without a bounce through a pinned driver buffer;
     * NULL where host memory needs nothing (the CPU). */
    dt_status (*host_alloc)(void **p, size_t bytes, const char *what);
    void (*host_free)(void *p);
    /* fp32 <-> bf16, n elements in the backend's memory (round to nearest even), in
     * every table whatever its storage precision */
    void (*to_bf16)(void *dst, const float *src, size_t n);
    void (*from_bf16)(float *dst, const void *src, size_t n);
    /* C[M,N] = alpha·op(A)·op(B) + beta·C, op = transpose when trans* != 0 */
    void (*gemm)(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);
    /* count GEMMs of one shape, C[i] = alpha·op(A[i])·op(B[i]) + beta·C[i]: the blocks of one
     * product that bitwise mode cuts into `canon` blocks in every layout (a layout's rank
     * runs some of them). Run at once, each block's bits set by its shape and canon alone.
     * NULL: gemm per block (dt_gemm_blocks). */
    void (*gemm_blocks)(int transA, int transB, int M, int N, int K, float alpha, const float *const *A, int lda,
                        const float *const *B, int ldb, float beta, float *const *C, int ldc, int count, int canon);
    /* out[N,OC] = inp[N,IC]·w[IC,OC] + bias (bias may be NULL) */
    void (*linear_fwd)(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC);
    /* dinp (= or += when acc_dinp), dw +=, dbias += (any of the three may be NULL: not computed; a
     * zero-bubble schedule takes the input gradient and the weight gradient at different times) */
    void (*linear_bwd)(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                       const float *w, int N, int IC, int OC, int acc_dinp);
    /* out[b,t,:] = wte[tok[b,t] - v0,:] + wpe[t,:]. wte holds the vocabulary rows [v0, v0 + rows)
     * (all of them, or a vocabulary-parallel rank's slice): other tokens add nothing; a
     * NULL wpe adds nothing. Backward: dwte += for tokens in range, dwpe += (NULL: skipped). */
    void (*embed_fwd)(float *out, const dt_token *tok, const float *wte, const float *wpe, int B, int T, int C,
                      int v0, int rows);
    void (*embed_bwd)(float *dwte, float *dwpe, const float *dout, const dt_token *tok, int B, int T, int C, int v0,
                      int rows);
    void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                          int N, int C);
    /* dinp +=, dw +=, db += (dinp NULL: the weight gradients only; dw and db NULL: dinp only) */
    void (*layernorm_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                          const float *mean, const float *rstd, int N, int C);
    void (*gelu_fwd)(float *out, const float *inp, size_t n);
    /* dinp = gelu'(inp)·dout */
    void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    void (*add)(float *out, const float *a, const float *b, size_t n);
    /* out[i·ldo + j] = a[i·lda + j] + b[i·ldb + j] for i < rows, j < n (b NULL: a's copy):
     * column slices of row-major matrices (bitwise mode's key/value group sums, one tree
     * node a call); out may be a. NULL in backends without it. */
    void (*add_rows)(float *out, int ldo, const float *a, int lda, const float *b, int ldb, int rows, int n);
    /* Causal multi-head attention over qkv[B,T,3C] (q|k|v, heads of C/NH): out[B,T,C],
     * lse[B,NH,T] (log-sum-exp per query row, kept for backward instead of the TxT matrix).
     * Documents: seg[B,T] (the backend's memory; NULL: none) gives each query the first key
     * it sees (its document's start in the row; non-decreasing along a row), so query t
     * sees keys seg[t]..t, and the keys of earlier documents are skipped, not computed. */
    void (*attention_fwd)(float *out, float *lse, const float *qkv, const int *seg, int B, int T, int C, int NH);
    /* dqkv (=) from dout, recomputing probabilities from lse */
    void (*attention_bwd)(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                          const int *seg, int B, int T, int C, int NH);
    /* Ring attention's blocks (context parallelism): a rank's Tq query rows (the q part of
     * qkv[B,Tq,3C]) against one block of Tk keys (the k and v parts of kv[B,Tk,3C], its
     * owner's qkv rows), causal by global position: query i sees key j iff
     * kpos[j] <= qpos[i] (kpos ascending), and with documents (qseg[B,Tq], host memory;
     * NULL: none: the global position of each query's document start) iff also
     * kpos[j] >= qseg[i]. attention_part_fwd merges the block into the
     * running (out[B,Tq,C], lse[B,NH,Tq]) by the online-softmax rule (start: out 0, lse
     * -inf; a row that sees no key of the block is unchanged). attention_part_bwd, given
     * the final out and lse, adds the block's share: dq to the q part of dqkv[B,Tq,3C],
     * dk and dv to the k and v parts of dkv[B,Tk,3C]. NULL: not on this backend. */
    void (*attention_part_fwd)(float *out, float *lse, const float *qkv, const float *kv, const int *qpos,
                               const int *qseg, const int *kpos, int B, int Tq, int Tk, int C, int NH);
    void (*attention_part_bwd)(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *kv,
                               const float *out, const float *lse, const int *qpos, const int *qseg, const int *kpos,
                               int B, int Tq, int Tk, int C, int NH);
    /* Canonical query chunks (bitwise mode with context parallelism): the query rows of
     * nchunks chunks of Tc positions (chunk c from position p0[c]) of the whole sequence
     * (qkv[B,T,3C], every position), causal, in blocks that never cross a chunk's end, so a
     * row's arithmetic is the same whichever rank computes its chunk; with documents (qseg:
     * the chunks' rows' document starts, [B,nchunks·Tc], host memory; NULL: none) a row sees
     * its document's keys and blocks end with documents too. out, lse: the chunks' rows in
     * list order ([B,nchunks·Tc,C], [B,NH,nchunks·Tc]). The backward writes dq to the q part
     * of those rows of dqkv and chunk c's share of dk | dv to leaf[c] ([B,T,2C], keys [0,
     * p0[c] + Tc); the caller sums the leaves). NULL: not here. */
    void (*attention_chunks_fwd)(float *out, float *lse, const float *qkv, const int *qseg, int B, int T, int C,
                                 int NH, const int *p0, int nchunks, int Tc);
    void (*attention_chunks_bwd)(float *dqkv, float *const *leaf, const float *dout, const float *qkv,
                                 const float *out, const float *lse, const int *qseg, int B, int T, int C, int NH,
                                 const int *p0, int nchunks, int Tc);
    /* Softmax cross-entropy over rows of logits[N, Vp] (columns >= V are padding and excluded).
     * Writes loss per row; if scale != 0, overwrites logits with dloss/dlogits · scale. */
    void (*softmax_xent)(float *logits, float *losses, const dt_token *targets, int N, int V, int Vp, float scale);
    /* Vocabulary-parallel cross-entropy: each rank holds columns [v0, v0 + Vl) of every row
     * of the logits (real of them real vocabulary), so the row statistics are completed
     * by the caller's all-reduces between the steps: row max (then MAX over ranks), then
     * sum of exp(x - max) and the target's logit (target outside the slice: 0) into
     * st[2i], st[2i+1] (then SUM), then the loss per row and, if scale != 0, dlogits·scale
     * in place (padding columns zero). fp32 statistics; NULL in backends without them. */
    void (*xent_rowmax)(const float *logits, float *mx, int N, int Vl, int real);
    void (*xent_rowsum)(const float *logits, const float *mx, const dt_token *targets, float *st, int N, int Vl,
                        int real, int v0);
    void (*xent_finish)(float *logits, float *losses, const float *mx, const float *st, const dt_token *targets,
                        int N, int Vl, int real, int v0, float scale);
    /* sum of squares in double (fixed order for a fixed thread count); x in storage precision */
    double (*sumsq)(const float *x, size_t n);
    /* sum in double of fp32 values (per-token losses: in index order on cpu) */
    double (*sum)(const float *x, size_t n);
    /* AdamW on n elements of gradient g·gscale (gscale: the clipping factor, fused here so
     * clipping costs no pass of its own): m, v updated; p -= lr·(m̂/(sqrt(v̂)+eps) + wd·p).
     * p, m, v fp32; g in storage precision; p_store (NULL: none) receives p rounded to
     * storage precision (the model's bf16 copy of its fp32 master weights). */
    void (*adamw)(float *p, float *p_store, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float bc1, float bc2, float gscale);
    /* The Llama family's kernels (NULL in a backend without them: the model refuses the
     * family). RMSNorm: out = x·rstd·w, rstd[N] = 1/sqrt(mean(x²) + eps) (fp32, kept for
     * the backward); backward dinp +=, dw += (either may be NULL). */
    void (*rmsnorm_fwd)(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
    void (*rmsnorm_bwd)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                        const float *rstd, int N, int C);
    /* SwiGLU over n elements: out = silu(gate)·up; backward: dgate, dup from dout */
    void (*swiglu_fwd)(float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_bwd)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
    /* Rotary embeddings and grouped heads into the attention's qkv[N, 3·NH·HS] from q[N,
     * NH·HS], k and v [N, NKV·HS]: q and k rotated in Hugging Face's convention (pairs d,
     * d + HS/2; angle pos[i]·inv_freq[d], inv_freq HS/2 fp32 and pos N ints in the
     * backend's memory), each key/value head repeated for the NH/NKV query heads of its
     * group. Backward: dq, dk rotated back, dk and dv summed over a group's copies. */
    void (*rope_qkv_fwd)(float *qkv, const float *q, const float *k, const float *v, const int *pos,
                         const float *inv_freq, int N, int NH, int NKV, int HS);
    void (*rope_qkv_bwd)(float *dq, float *dk, float *dv, const float *dqkv, const int *pos, const float *inv_freq,
                         int N, int NH, int NKV, int HS);
    /* Optional fusions of the MLP's GELU into its GEMMs (NULL: dt_linear_gelu_fwd and
     * dt_linear_dgelu_bwd below run the plain ops they stand for). Forward: pre[N,OC] =
     * inp·w + bias, out = gelu(pre). Backward through the second layer's input: dinp[N,IC]
     * = gelu'(pre)·(dout[N,OC]·wᵀ), pre [N,IC]. */
    void (*linear_gelu_fwd)(float *out, float *pre, const float *inp, const float *w, const float *bias, int N,
                            int IC, int OC);
    void (*linear_dgelu_bwd)(float *dinp, const float *dout, const float *w, const float *pre, int N, int IC, int OC);
} dt_ops;

static inline void dt_linear_gelu_fwd(const dt_ops *o, float *out, float *pre, const float *inp, const float *w,
                                      const float *bias, int N, int IC, int OC) {
    if (o->linear_gelu_fwd) {
        o->linear_gelu_fwd(out, pre, inp, w, bias, N, IC, OC);
        return;
    }
    o->linear_fwd(pre, inp, w, bias, N, IC, OC);
    o->gelu_fwd(out, pre, (size_t)N * OC);
}
static inline void dt_linear_dgelu_bwd(const dt_ops *o, float *dinp, const float *dout, const float *w,
                                       const float *pre, int N, int IC, int OC) {
    if (o->linear_dgelu_bwd) {
        o->linear_dgelu_bwd(dinp, dout, w, pre, N, IC, OC);
        return;
    }
    o->linear_bwd(dinp, NULL, NULL, dout, NULL, w, N, IC, OC, 0);
    o->gelu_bwd(dinp, pre, dinp, (size_t)N * IC); /* in place: elementwise */
}

/* ops->gemm_blocks, or gemm over each block where the backend has none */
static inline void dt_gemm_blocks(const dt_ops *o, int tA, int tB, int M, int N, int K, float alpha,
                                  const float *const *A, int lda, const float *const *B, int ldb, float beta,
                                  float *const *C, int ldc, int count, int canon) {
    if (o->gemm_blocks) {
        o->gemm_blocks(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, count, canon);
        return;
    }
    for (int i = 0; i < count; i++) o->gemm(tA, tB, M, N, K, alpha, A[i], lda, B[i], ldb, beta, C[i], ldc);
}

const dt_ops *dt_ops_cpu(void);
/* The CPU table whose results do not depend on the thread count (parallel.determinism
 * bitwise: an elastic restart on other cores keeps the bits): its GEMMs run over fixed
 * tiles, one single-threaded BLAS call each (cpu/gemm_tiles.c); its other kernels are
 * dt_ops_cpu()'s, which already sum in an order set by the shapes alone. */
const dt_ops *dt_ops_cpu_fixed(void);
/* bf16 storage around an fp32 table: each kernel converts its bf16 arguments to fp32
 * scratch (the inner backend's memory, grown once, reused), runs the fp32 kernel and
 * rounds what it wrote back to bf16. The CPU backend's bf16 mode (bf16 storage, fp32
 * compute); one table per process. */
const dt_ops *dt_ops_bf16_storage(const dt_ops *f32);
static inline size_t dt_elem_bytes(const dt_ops *o) { return o->bf16 ? 2 : 4; }
/* `backend: emulated`: host's kernels behind a device boundary (ops_emulated.c): its
 * memory faults when the host touches it other than through upload and download, so the
 * GPU paths' host staging is tested on machines without a GPU. One table per process. */
const dt_ops *dt_ops_emulated(const dt_ops *host);
/* The emulated device's page-locked host memory is page-aligned host memory, counted:
 * the bytes its host_alloc has live (tests check who asks for it). */
size_t dt_emulated_pinned_bytes(void);
/* The host address behind an emulated device address (the emulated device communicator's
 * collectives run there). */
void *dt_emulated_host(const void *dev);
/* The CUDA backend on this process's GPU; a one-line error when the build has no CUDA
 * or the machine no GPU. */
dt_status dt_ops_cuda(const dt_ops **out, int bf16);
/* The GPU dt_ops_cuda will start on: local_rank modulo the node's GPUs (called before it;
 * without it the launcher's OMPI_COMM_WORLD_LOCAL_RANK or LOCAL_RANK, else GPU 0). */
void dt_gpu_select(int local_rank);
/* This process's GPU ("none" without CUDA). */
const char *dt_gpu_name(void);
/* Most device memory dtrain has held at once (buffers, scratch, library workspace). */
size_t dt_gpu_peak_bytes(void);
/* The CUDA backend's compute stream (a cudaStream_t; NULL before it starts or without
 * CUDA): what device communicators order their work against. */
void *dt_gpu_stream(void);
/* Dense bf16 peak of this GPU in FLOP/s from a table of known devices (0: unknown):
 * the denominator of MFU. */
double dt_gpu_bf16_peak(void);
/* The fused GELU GEMMs (linear_gelu_fwd, linear_dgelu_bwd) this process ran fused and
 * those that fell back to the plain GEMM and kernel (cuBLASLt had no algorithm); zeros
 * without CUDA. */
void dt_gpu_fusion_counts(long *fused, long *fell_back);
/* Wraps ops so every call is timed (one wrapper per process); report prints the totals. */
const dt_ops *dt_ops_profiled(const dt_ops *ops);
void dt_ops_profile_report(FILE *out);
/* Forgets the totals so far (the trainer calls it after the first step: one-time costs
 * such as library planning and lazy kernel loading would otherwise skew the profile). */
void dt_ops_profile_reset(void);
/* Human-readable description of the CPU BLAS and the kernel it runs. */
const char *dt_cpu_blas_info(void);
/* Sets OpenMP and BLAS thread counts (0: leave the library default). */
void dt_cpu_set_threads(int n);
/* This process's SGEMM rate in FLOP/s with its current threads: the best of repeated
 * 512^3 products over about `seconds` (the CPU's MFU denominator; 0 if memory is short). */
double dt_cpu_sgemm_peak(double seconds);

#endif
