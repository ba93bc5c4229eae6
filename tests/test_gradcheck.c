/* Analytic gradients of every parameter tensor (fp32 kernels) against central finite
 * differences of an independent double-precision forward; also checks the fp32 loss
 * against it. Padded vocabulary rows must get exactly zero gradient. Once more with the
 * optional fused MLP ops (linear_gelu_fwd, linear_dgelu_bwd) present, written here as
 * plain loops: the model's use of them (which buffer is which) is checked on the CPU,
 * where no backend has them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/rng.h"
#include "ref_gpt.h"

static int passed, failed;

/* samples: finite differences per tensor (all elements of small tensors) */
static float gelu(float x, float *deriv) { /* GPT-2's tanh approximation */
    const float k = 0.7978845608028654f;
    float u = k * (x + 0.044715f * x * x * x), th = tanhf(u);
    if (deriv) *deriv = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * x * (1.0f + th);
}
static void naive_linear_gelu_fwd(float *out, float *pre, const float *inp, const float *w, const float *bias, int N,
                                  int IC, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < IC; i++) acc += (double)inp[(size_t)n * IC + i] * w[(size_t)i * OC + o];
            pre[(size_t)n * OC + o] = (float)acc;
            out[(size_t)n * OC + o] = gelu((float)acc, NULL);
        }
}
static void naive_linear_dgelu_bwd(float *dinp, const float *dout, const float *w, const float *pre, int N, int IC,
                                   int OC) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double acc = 0.0;
            for (int o = 0; o < OC; o++) acc += (double)dout[(size_t)n * OC + o] * w[(size_t)i * OC + o];
            float d;
            gelu(pre[(size_t)n * IC + i], &d);
            dinp[(size_t)n * IC + i] = d * (float)acc;
        }
}

static void check(gpt_shape s, int B, int T, size_t samples, const dt_ops *ops) {
    gpt_model m;
    printf("-- %d layers, %d heads, C %d, B %d, T %d, vocab %d%s\n", s.n_layer, s.n_head, s.n_embd, B, T, s.vocab_size,
           ops->linear_gelu_fwd ? ", fused MLP ops" : "");
    if (gpt_create(&m, &s, ops, B, T) != DT_OK) {
        fprintf(stderr, "create: %s\n", dt_error_message());
        failed++;
        return;
    }
    /* Larger-than-GPT-2 random values so every nonlinearity is exercised. */
    dt_rng rng;
    dt_rng_seed(&rng, 7);
    for (int i = 0; i < m.ntensors; i++) {
        const gpt_tensor *t = &m.tensors[i];
        int is_ln = strstr(t->name, "ln_") != NULL, is_bias = strstr(t->name, ".bias") != NULL;
        size_t keep = (size_t)t->saved_rows * t->shape[1];
        for (size_t j = 0; j < t->numel; j++) {
            float v = (float)dt_rng_normal(&rng);
            m.params[t->offset + j] = j >= keep ? 0.0f : is_ln && !is_bias ? 1.0f + 0.2f * v : is_bias ? 0.1f * v
                                                                                                      : 0.3f * v;
        }
    }
    dt_token *tok = malloc(sizeof(dt_token) * B * T), *tgt = malloc(sizeof(dt_token) * B * T);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (dt_token)dt_rng_below(&rng, (uint64_t)s.vocab_size);
        tgt[i] = (dt_token)dt_rng_below(&rng, (uint64_t)s.vocab_size);
    }
    gpt_zero_grad(&m);
    double loss32 = 0.0;
    if (gpt_forward_backward(&m, tok, tgt, B, T, 1.0f / (B * T), &loss32) != DT_OK) failed++;
    loss32 /= (B * T);

    double *p = malloc(m.nparams * sizeof(double));
    for (size_t i = 0; i < m.nparams; i++) p[i] = m.params[i];
    ref_gpt r = {&m, p};
    double loss64 = ref_loss(&r, tok, tgt, B, T);
    double lrel = fabs(loss32 - loss64) / fabs(loss64);
    printf("loss fp32 %.8f vs double reference %.8f (rel %.2e)\n", loss32, loss64, lrel);
    if (lrel > 1e-5) failed++;
    else passed++;

    for (int i = 0; i < m.ntensors; i++) {
        const gpt_tensor *t = &m.tensors[i];
        size_t keep = (size_t)t->saved_rows * t->shape[1];
        double maxfd, rel = ref_fd_check(&r, p, t, m.grads, tok, tgt, B, T, samples, &maxfd);
        int pad_ok = 1;
        for (size_t j = keep; j < t->numel; j++) pad_ok &= m.grads[t->offset + j] == 0.0f;
        int ok = rel <= 1e-3 && pad_ok;
        printf("%-26s max|g-fd| / max|fd| = %.2e (max|fd| %.2e)%s %s\n", t->name, rel, maxfd,
               pad_ok ? "" : " padded rows have gradient", ok ? "ok" : "FAIL");
        if (ok) passed++;
        else failed++;
    }
    free(p);
    free(tok);
    free(tgt);
    gpt_destroy(&m);
}

int main(void) {
    check((gpt_shape){2, 2, 16, 8, 70, .padded_vocab = 0}, 2, 8, 200, dt_ops_cpu()); /* vocab 70 is padded to 128 */
    check((gpt_shape){1, 2, 8, 150, 64, .padded_vocab = 0}, 1, 150, 12, dt_ops_cpu()); /* several attention query blocks, one partial */
    dt_ops fused = *dt_ops_cpu();
    fused.linear_gelu_fwd = naive_linear_gelu_fwd;
    fused.linear_dgelu_bwd = naive_linear_dgelu_bwd;
    check((gpt_shape){2, 2, 16, 8, 70, .padded_vocab = 0}, 2, 8, 200, &fused);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
