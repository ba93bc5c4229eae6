/* Linear layers in Hugging Face's nn.Linear layout (weight [out, in], y = x·wᵀ + b): the
 * Llama family's. GPT-2's Conv1D layout (w[in][out]) is the backend's linear_fwd/bwd;
 * this one is the backend's GEMM with the weight transposed, and the bias added (and its
 * gradient summed) as a product with a column of ones, so no backend needs a kernel of
 * its own for it. */
#include "gpt_internal.h"

void gpt_linear_t_fwd(gpt_model *m, float *y, const float *x, const float *w, const float *bias, int N, int IN,
                      int OUT) {
    const dt_ops *o = m->ops;
    o->gemm(0, 1, N, OUT, IN, 1.0f, x, IN, w, IN, 0.0f, y, OUT);
    if (bias) o->gemm(0, 0, N, OUT, 1, 1.0f, m->acts->ones, 1, bias, OUT, 1.0f, y, OUT);
}

void gpt_linear_t_bwd(gpt_model *m, float *dx, float *dw, float *dbias, const float *dy, const float *x,
                      const float *w, int N, int IN, int OUT, int acc) {
    const dt_ops *o = m->ops;
    if (dx) o->gemm(0, 0, N, IN, OUT, 1.0f, dy, OUT, w, IN, acc ? 1.0f : 0.0f, dx, IN);
    if (dw) o->gemm(1, 0, OUT, IN, N, 1.0f, dy, OUT, x, IN, 1.0f, dw, IN);
    if (dbias) o->gemm(1, 0, OUT, 1, N, 1.0f, dy, OUT, m->acts->ones, 1, 1.0f, dbias, 1);
}
