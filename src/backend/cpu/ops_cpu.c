#include "../ops.h"
#include "cpu.h"

static const dt_ops CPU_OPS = {
    .name = "cpu",
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
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .softmax_xent = cpu_softmax_xent,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
};

const dt_ops *dt_ops_cpu(void) { return &CPU_OPS; }
