/* GEMMs through cuBLASLt, fp32 (fp32 arithmetic, no TF32: the parity mode) or bf16
 * (bf16 operands and output, fp32 accumulation). ops.h is row-major; cuBLASLt is column-major, and a
 * row-major matrix is its column-major transpose, so C = op(A)·op(B) is computed as
 * Cᵀ = op(B)ᵀ·op(A)ᵀ with the operands swapped. The linear layer's bias rides in the
 * matmul epilogue. Plans (descriptors + the heuristic's algorithm) are cached per
 * shape, so a step does no planning and no allocation after the first.
 * cuBLASLt is opened when the CUDA backend starts rather than linked: loading it costs
 * every process about 0.4 s of CPU (relocating a very large library), CPU runs and each
 * rank of a multi-rank run included. */
#include <cublasLt.h>
#include <stdio.h>
#include <string.h>

#include "../../core/library.h"
#include "cuda_internal.h"

/* The cuBLASLt functions used here, named once: the table's fields and their lookup. */
#define DT_LT_FUNCS(X)                                                                                        \
    X(Create) X(GetStatusString) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate) X(MatmulDescDestroy) \
    X(MatmulDescSetAttribute) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy)                           \
    X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate) X(MatrixLayoutDestroy)
#define DT_LT_FIELD(name) decltype(&cublasLt##name) name;
static struct {
    DT_LT_FUNCS(DT_LT_FIELD)
} lt;
static cublasLtHandle_t g_lt;
static void *g_workspace;
static const size_t WORKSPACE = 32u << 20;

/* the epilogue beyond the bias: none, GELU keeping the pre-activation (aux), or the
 * GELU's derivative at aux times the product */
enum { EPI_NONE, EPI_GELU_AUX, EPI_DGELU };

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, bias, beta0, align, bf, epi;
    int unusable; /* a fused epilogue cuBLASLt has no algorithm for at this shape: fall back */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

enum { MAX_PLANS = 256 };
static plan g_plans[MAX_PLANS];
static int g_nplans;

#define DT_STR2(x) #x
#define DT_STR(x) DT_STR2(x)
/* The soname of the toolkit compiled against (never another major version: the
 * descriptors' layouts differ), from the loader's path, then from the toolkit's own
 * directory (a machine with CUDA outside the loader's path). */
static int load_cublaslt(void) {
    static const char *names[] = {"libcublasLt.so." DT_STR(CUBLAS_VER_MAJOR),
#ifdef DT_CUBLASLT_DIR
                                  DT_CUBLASLT_DIR "/libcublasLt.so." DT_STR(CUBLAS_VER_MAJOR),
#endif
    };
#define DT_LT_SYM(name) {"cublasLt" #name, (void **)&lt.name},
    static const dt_symbol syms[] = {DT_LT_FUNCS(DT_LT_SYM)};
    char why[512];
    if (dt_library_open(names, sizeof names / sizeof *names, syms, sizeof syms / sizeof *syms, why, sizeof why))
        return 1;
    dt_cuda_record("cuBLASLt", why);
    return 0;
}

int dt_cuda_gemm_init(void) {
    if (!load_cublaslt()) return 0;
    if (lt.Create(&g_lt) != CUBLAS_STATUS_SUCCESS) {
        dt_cuda_record("cublasLtCreate", "failed");
        return 0;
    }
    if (cudaMalloc(&g_workspace, WORKSPACE) != cudaSuccess) {
        dt_cuda_record("cuBLASLt workspace", "out of GPU memory");
        return 0;
    }
    dt_cuda_count_alloc(WORKSPACE);
    return 1;
}

static int alignment(const void *p) { /* the largest of 16, 8, 4 bytes dividing the address */
    uintptr_t a = (uintptr_t)p;
    return a % 16 == 0 ? 16 : a % 8 == 0 ? 8 : 4;
}

/* A fused epilogue the heuristic offers no algorithm for (or the matmul refuses) at a
 * shape is remembered as an unusable plan, so it is not asked for again: the callers run
 * the plain GEMM and the separate kernel instead. The bias and aux pointers of the first
 * call are set before the heuristic (it reads their alignment); later calls of the same
 * plan share the alignment class (part of the key). */
static plan *find_plan(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc, const void *bias, int beta0,
                       int align, int bf, int epi, const void *aux) {
    for (int i = 0; i < g_nplans; i++) {
        plan *p = &g_plans[i];
        if (p->ta == ta && p->tb == tb && p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
            p->ldc == ldc && p->bias == (bias != NULL) && p->beta0 == beta0 && p->align == align && p->bf == bf &&
            p->epi == epi)
            return p;
    }
    if (g_nplans == MAX_PLANS) { /* shapes are few in training; evict the oldest if not */
        plan *p = &g_plans[0];
        if (p->op) lt.MatmulDescDestroy(p->op); /* (an unusable plan holds none) */
        if (p->la) lt.MatrixLayoutDestroy(p->la);
        if (p->lb) lt.MatrixLayoutDestroy(p->lb);
        if (p->lc) lt.MatrixLayoutDestroy(p->lc);
        memmove(g_plans, g_plans + 1, sizeof(plan) * (MAX_PLANS - 1));
        g_nplans--;
    }
    plan *p = &g_plans[g_nplans];
    memset(p, 0, sizeof *p);
    *p = (plan){ta, tb, m, n, k, lda, ldb, ldc, bias != NULL, beta0, align, bf, epi, 0, NULL, NULL, NULL, NULL, {}};
    cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st = lt.MatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (st == CUBLAS_STATUS_SUCCESS && (bias || epi)) {
        cublasLtEpilogue_t ep = epi == EPI_GELU_AUX ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                : epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
                                                   : CUBLASLT_EPILOGUE_BIAS;
        st = lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
    }
    if (st == CUBLAS_STATUS_SUCCESS && epi) { /* aux has D's shape (m x n, column-major) */
        int64_t aux_ld = m;
        st = lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    }
    if (st == CUBLAS_STATUS_SUCCESS && bias)
        st = lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatrixLayoutCreate(&p->la, dt, ta ? k : m, ta ? m : k, lda);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatrixLayoutCreate(&p->lb, dt, tb ? n : k, tb ? k : n, ldb);
    if (st == CUBLAS_STATUS_SUCCESS) st = lt.MatrixLayoutCreate(&p->lc, dt, m, n, ldc);
    cublasLtMatmulPreference_t pref = NULL;
    if (st == CUBLAS_STATUS_SUCCESS) st = lt.MatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WORKSPACE,
                                                  sizeof WORKSPACE);
    uint32_t al = (uint32_t)align;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = lt.MatmulAlgoGetHeuristic(g_lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
    if (pref) lt.MatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) { /* no descriptors kept either way */
        if (p->op) lt.MatmulDescDestroy(p->op);
        if (p->la) lt.MatrixLayoutDestroy(p->la);
        if (p->lb) lt.MatrixLayoutDestroy(p->lb);
        if (p->lc) lt.MatrixLayoutDestroy(p->lc);
        p->op = NULL, p->la = p->lb = p->lc = NULL;
    }
    if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && epi) { /* not an error: the caller has a fallback */
        p->unusable = 1;
        g_nplans++;
        return p;
    }
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "no algorithm for %s%s m=%d n=%d k=%d (%s)", ta ? "T" : "N", tb ? "T" : "N", m, n,
                 k, lt.GetStatusString(st));
        dt_cuda_record("cuBLASLt", msg);
        return NULL;
    }
    p->algo = res.algo;
    g_nplans++;
    return p;
}

/* Column-major D = alpha·op(A)·op(B) + beta·D (+ bias[m] broadcast over columns), then
 * the epilogue epi with its aux matrix (D's shape). Returns 0 only when a fused epilogue
 * has no algorithm (nothing queued, nothing recorded); failures are recorded. */
template <typename T>
static int lt_matmul(int ta, int tb, int m, int n, int k, float alpha, const T *A, int lda, const T *B, int ldb,
                     float beta, T *C, int ldc, const T *bias, int epi = EPI_NONE, const T *aux = NULL) {
    if (m == 0 || n == 0) return 1;
    if (epi && (m % 8 || alignment(aux) < 16)) return 0; /* cuBLASLt: aux's leading dimension a multiple of 8 */
    int align = alignment(A);
    int a2 = alignment(B), a3 = alignment(C);
    if (a2 < align) align = a2;
    if (a3 < align) align = a3;
    plan *p = find_plan(ta, tb, m, n, k, lda, ldb, ldc, bias, beta == 0.0f, align, sizeof(T) == 2, epi, aux);
    if (!p) return 1; /* recorded */
    if (p->unusable) return 0;
    if (bias &&
        lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) !=
            CUBLAS_STATUS_SUCCESS) {
        dt_cuda_record("cuBLASLt", "bias pointer");
        return 1;
    }
    if (epi && lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) !=
                   CUBLAS_STATUS_SUCCESS) {
        dt_cuda_record("cuBLASLt", "epilogue aux pointer");
        return 1;
    }
    cublasStatus_t st = lt.Matmul(g_lt, p->op, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc, &p->algo,
                                       g_workspace, WORKSPACE, dt_cuda_stream());
    if (epi && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
        p->unusable = 1; /* refused before anything was queued: the caller's fallback runs */
        return 0;
    }
    if (st != CUBLAS_STATUS_SUCCESS) dt_cuda_record("cublasLtMatmul", lt.GetStatusString(st));
    return 1;
}

template <typename T>
void cuda_gemm(int transA, int transB, int M, int N, int K, float alpha, const T *A, int lda, const T *B, int ldb,
               float beta, T *C, int ldc) {
    lt_matmul<T>(transB, transA, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc, NULL);
}

template <typename T>
void cuda_linear_fwd(T *out, const T *inp, const T *w, const T *bias, int N, int IC, int OC) {
    lt_matmul<T>(0, 0, OC, N, IC, 1.0f, w, OC, inp, IC, 0.0f, out, OC, bias);
}

template <typename T>
void cuda_linear_bwd(T *dinp, T *dw, T *dbias, const T *dout, const T *inp, const T *w, int N, int IC, int OC,
                     int acc_dinp) {
    if (dinp) lt_matmul<T>(1, 0, IC, N, OC, 1.0f, w, OC, dout, OC, acc_dinp ? 1.0f : 0.0f, dinp, IC, NULL); /* dout·wᵀ */
    if (dw) lt_matmul<T>(0, 1, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, OC, NULL); /* += inpᵀ·dout */
    if (dbias) cuda_colsum_acc<T>(dbias, dout, N, OC);
}

static long g_fused, g_fell_back;
extern "C" void dt_gpu_fusion_counts(long *fused, long *fell_back) { *fused = g_fused, *fell_back = g_fell_back; }
static int counted(int ran) {
    ++*(ran ? &g_fused : &g_fell_back);
    return ran;
}

/* out = gelu(pre), pre = inp·w + bias, in one GEMM (cuBLASLt's GELU_AUX_BIAS epilogue:
 * GPT-2's tanh GELU, the pre-activation written as aux); 0: no such algorithm here */
template <typename T>
int cuda_linear_gelu_fwd(T *out, T *pre, const T *inp, const T *w, const T *bias, int N, int IC, int OC) {
    return counted(lt_matmul<T>(0, 0, OC, N, IC, 1.0f, w, OC, inp, IC, 0.0f, out, OC, bias, EPI_GELU_AUX, pre));
}

/* dinp = gelu'(pre)·(dout·wᵀ) in one GEMM (the DGELU epilogue reading pre as aux) */
template <typename T> int cuda_linear_dgelu_bwd(T *dinp, const T *dout, const T *w, const T *pre, int N, int IC, int OC) {
    return counted(lt_matmul<T>(1, 0, IC, N, OC, 1.0f, w, OC, dout, OC, 0.0f, dinp, IC, NULL, EPI_DGELU, pre));
}

template int cuda_linear_gelu_fwd<float>(float *, float *, const float *, const float *, const float *, int, int, int);
template int cuda_linear_gelu_fwd<bf16>(bf16 *, bf16 *, const bf16 *, const bf16 *, const bf16 *, int, int, int);
template int cuda_linear_dgelu_bwd<float>(float *, const float *, const float *, const float *, int, int, int);
template int cuda_linear_dgelu_bwd<bf16>(bf16 *, const bf16 *, const bf16 *, const bf16 *, int, int, int);
template void cuda_gemm<float>(int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                               int);
template void cuda_gemm<bf16>(int, int, int, int, int, float, const bf16 *, int, const bf16 *, int, float, bf16 *, int);
template void cuda_linear_fwd<float>(float *, const float *, const float *, const float *, int, int, int);
template void cuda_linear_fwd<bf16>(bf16 *, const bf16 *, const bf16 *, const bf16 *, int, int, int);
template void cuda_linear_bwd<float>(float *, float *, float *, const float *, const float *, const float *, int, int,
                                     int, int);
template void cuda_linear_bwd<bf16>(bf16 *, bf16 *, bf16 *, const bf16 *, const bf16 *, const bf16 *, int, int, int,
                                    int);
