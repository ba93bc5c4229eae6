/* The whole model on the GPU: forward, loss and backward against the CPU backend on
 * the same weights and batch (loss within 1e-5, every tensor's gradient within 1e-4
 * relative), padded vocabulary rows get no gradient, and a gradient check of the GPU's
 * gradients against central finite differences of the double-precision reference
 * (ref_gpt.h, as in test_gradcheck; GPT-2 only). GPT-2 and Llama shapes (the Llama
 * kernels: RMSNorm, SwiGLU, rotary embeddings with grouped heads). Skips (77) without a
 * GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/rng.h"
#include "ref_gpt.h"

static int failures;

static void report(int ok, const char *what, double v) {
    printf("%-4s %s %.2e\n", ok ? "ok" : "FAIL", what, v);
    failures += !ok;
}

static void run(const dt_ops *gpu, gpt_shape s, int B, int T, size_t samples) {
    printf("-- %s, %d layers, %d heads (%d key/value), C %d, B %d, T %d, vocab %d\n",
           s.family == GPT_FAMILY_LLAMA ? "llama" : "gpt2", s.n_layer, s.n_head, s.n_kv_head ? s.n_kv_head : s.n_head,
           s.n_embd, B, T, s.vocab_size);
    gpt_model c, g;
    if (gpt_create(&c, &s, dt_ops_cpu(), B, T) != DT_OK || gpt_create(&g, &s, gpu, B, T) != DT_OK) {
        printf("FAIL create: %s\n", dt_error_message());
        failures++;
        return;
    }
    dt_rng rng;
    dt_rng_seed(&rng, 11);
    for (int i = 0; i < c.ntensors; i++) { /* larger than GPT-2's values, to exercise every nonlinearity */
        const gpt_tensor *t = &c.tensors[i];
        int is_ln = strstr(t->name, "ln_") != NULL || strstr(t->name, "norm") != NULL; /* Llama: *norm.weight */
        int is_bias = strstr(t->name, ".bias") != NULL;
        size_t keep = (size_t)t->saved_rows * t->shape[1];
        for (size_t j = 0; j < t->numel; j++) {
            float v = (float)dt_rng_normal(&rng);
            c.params[t->offset + j] = j >= keep ? 0.0f : is_ln && !is_bias ? 1.0f + 0.2f * v : is_bias ? 0.1f * v : 0.3f * v;
        }
    }
    gpu->upload(g.params, c.params, c.nparams * sizeof(float));
    dt_token *tok = malloc(sizeof(dt_token) * B * T), *tgt = malloc(sizeof(dt_token) * B * T);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (dt_token)dt_rng_below(&rng, (uint64_t)s.vocab_size);
        tgt[i] = (dt_token)dt_rng_below(&rng, (uint64_t)s.vocab_size);
    }
    double lc, lg, le;
    gpt_zero_grad(&c);
    gpt_zero_grad(&g);
    int ok = gpt_forward_backward(&c, tok, tgt, B, T, 1.0f / (B * T), &lc) == DT_OK &&
             gpt_forward_backward(&g, tok, tgt, B, T, 1.0f / (B * T), &lg) == DT_OK &&
             gpt_eval_loss(&g, tok, tgt, B, T, &le) == DT_OK && gpu->sync() == DT_OK;
    if (!ok) {
        printf("FAIL forward/backward: %s\n", dt_error_message());
        failures++;
        return;
    }
    report(fabs(lg - lc) <= 1e-5 * fabs(lc), "loss gpu vs cpu: rel", fabs(lg - lc) / fabs(lc));
    report(le == lg, "eval loss equals the training forward's loss: diff", fabs(le - lg));

    float *gg = malloc(c.nparams * sizeof(float));
    gpu->download(gg, g.grads, c.nparams * sizeof(float));
    double worst = 0;
    int pad_ok = 1;
    for (int i = 0; i < c.ntensors; i++) {
        const gpt_tensor *t = &c.tensors[i];
        size_t keep = (size_t)t->saved_rows * t->shape[1];
        double num = 0, den = 0;
        for (size_t j = 0; j < t->numel; j++) {
            double a = gg[t->offset + j], b = c.grads[t->offset + j];
            num += (a - b) * (a - b);
            den += b * b;
            if (j >= keep) pad_ok &= a == 0.0;
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        if (rel > worst) worst = rel;
        if (rel > 1e-4) printf("     %s: rel %.2e\n", t->name, rel);
    }
    report(worst <= 1e-4, "gradients gpu vs cpu: worst tensor rel", worst);
    report(pad_ok, "padded vocabulary rows: zero gradient on the gpu (failures)", !pad_ok);

    /* GPU gradients against finite differences of the double-precision reference (GPT-2's;
     * for Llama the CPU's gradients above stand in: test_reference_parity checks them
     * against PyTorch) */
    if (s.family != GPT_FAMILY_LLAMA) {
        double *p = malloc(c.nparams * sizeof(double));
        for (size_t i = 0; i < c.nparams; i++) p[i] = c.params[i];
        ref_gpt r = {&c, p};
        double worst_fd = 0;
        for (int i = 0; i < c.ntensors; i++) {
            const gpt_tensor *t = &c.tensors[i];
            double maxfd, rel = ref_fd_check(&r, p, t, gg, tok, tgt, B, T, samples, &maxfd);
            if (rel > worst_fd) worst_fd = rel;
            if (rel > 1e-3) printf("     %s: max|g-fd| / max|fd| = %.2e\n", t->name, rel);
        }
        report(worst_fd <= 1e-3, "gradient check (gpu vs finite differences): worst tensor", worst_fd);
        free(p);
    }
    free(gg);
    free(tok);
    free(tgt);
    gpt_destroy(&c);
    gpt_destroy(&g);
}

int main(void) {
    const dt_ops *gpu;
    if (dt_ops_cuda(&gpu, 0) != DT_OK) {
        printf("skip: %s\n", dt_error_message());
        return 77;
    }
    printf("GPU: %s\n", dt_gpu_name());
    run(gpu, (gpt_shape){2, 2, 64, 40, 100, .padded_vocab = 0}, 2, 37, 60);   /* head size 32, vocab padded 100 -> 128 */
    run(gpu, (gpt_shape){1, 2, 128, 150, 64, .padded_vocab = 0}, 1, 150, 12); /* head size 64, several key tiles */
    /* Llama (RMSNorm, SwiGLU, rotary embeddings): grouped-query attention (4 heads over 2
     * key/value heads, head size 32) with q/k/v biases and an untied head; multi-query (one
     * key/value head, head size 64) with a tied one */
    run(gpu, (gpt_shape){2, 4, 128, 40, 100, .padded_vocab = 0, .family = GPT_FAMILY_LLAMA, .n_kv_head = 2,
                         .intermediate = 96, .tie = 0, .qkv_bias = 1, .rope_theta = 500000.0f, .norm_eps = 1e-5f},
        2, 37, 0);
    run(gpu, (gpt_shape){1, 2, 128, 150, 64, .padded_vocab = 0, .family = GPT_FAMILY_LLAMA, .n_kv_head = 1,
                         .intermediate = 160, .tie = 1, .rope_theta = 10000.0f, .norm_eps = 1e-6f},
        1, 150, 0);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
    return failures != 0;
}
