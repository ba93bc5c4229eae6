#include <string.h>

#include "../../core/bf16.h"
#include "../../core/mem.h"
#include "../ops.h"
#include "cpu.h"

/* Host memory: kernels run synchronously, so transfers are copies and sync has nothing to wait for. */
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
}
static dt_status cpu_sync(void) { return DT_OK; }
static void cpu_to_bf16(void *dst, const float *src, size_t n) {
    uint16_t *d = dst;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) d[i] = dt_f32_to_bf16(src[i]);
}
static void cpu_from_bf16(float *dst, const void *src, size_t n) {
    const uint16_t *s = src;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(s[i]);
}

static const dt_ops CPU_OPS = {
    .name = "cpu",
    .on_device = 0,
    .alloc = dt_alloc,
    .free = dt_free,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .copy = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .gemm = cpu_gemm,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd = cpu_linear_bwd,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .add = cpu_add,
    .add_rows = cpu_add_rows,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .attention_part_fwd = cpu_attention_part_fwd,
    .attention_part_bwd = cpu_attention_part_bwd,
    .attention_chunks_fwd = cpu_attention_chunks_fwd,
    .attention_chunks_bwd = cpu_attention_chunks_bwd,
    .softmax_xent = cpu_softmax_xent,
    .xent_rowmax = cpu_xent_rowmax,
    .xent_rowsum = cpu_xent_rowsum,
    .xent_finish = cpu_xent_finish,
    .sumsq = cpu_sumsq,
    .sum = cpu_sum,
    .adamw = cpu_adamw,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .rope_qkv_fwd = cpu_rope_qkv_fwd,
    .rope_qkv_bwd = cpu_rope_qkv_bwd,
};

const dt_ops *dt_ops_cpu(void) { return &CPU_OPS; }

/* The GEMMs over fixed tiles; every other kernel already sums in an order set by the
 * shapes (rows on one thread each, column blocks, fixed chunks), whatever the threads. */
static void fixed_linear_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC) {
    cpu_linear_fwd_by(cpu_gemm_tiled, out, inp, w, bias, N, IC, OC);
}
static void fixed_linear_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                             int N, int IC, int OC, int acc_dinp) {
    cpu_linear_bwd_by(cpu_gemm_tiled, dinp, dw, dbias, dout, inp, w, N, IC, OC, acc_dinp);
}

const dt_ops *dt_ops_cpu_fixed(void) {
    static dt_ops fixed;
    if (!fixed.gemm) { /* built on the first call, from the trainer's thread */
        dt_ops t = CPU_OPS;
        t.gemm = cpu_gemm_tiled;
        t.gemm_blocks = cpu_gemm_blocks_tiled;
        t.linear_fwd = fixed_linear_fwd;
        t.linear_bwd = fixed_linear_bwd;
        fixed = t;
    }
    return &fixed;
}
