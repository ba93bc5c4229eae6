/* The norm building block of both families: GPT-2's LayerNorm (weight and bias, mean
 * and 1/std kept) or Llama's RMSNorm (weight only, 1/rms kept; its eps from the shape).
 * A block's two norms and the final one all come through here. */
#include "gpt_internal.h"

void gpt_norm_fwd(gpt_model *m, float *out, float *mean, float *rstd, const float *in, const float *w, const float *b,
                  int N) {
    int C = m->shape.n_embd;
    if (llama(m)) m->ops->rmsnorm_fwd(out, rstd, in, w, N, C, m->shape.norm_eps);
    else m->ops->layernorm_fwd(out, mean, rstd, in, w, b, N, C);
}

void gpt_norm_bwd(gpt_model *m, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                  const float *mean, const float *rstd, int N) {
    int C = m->shape.n_embd;
    if (llama(m)) m->ops->rmsnorm_bwd(din, dw, dout, in, w, rstd, N, C);
    else m->ops->layernorm_bwd(din, dw, db, dout, in, w, mean, rstd, N, C);
}
