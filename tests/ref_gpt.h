/* Independent double-precision GPT-2 forward (naive loops, no shared kernels), used by
 * tests as the ground truth for the loss and for finite-difference gradients. It reads
 * parameters through the model's tensor table by name only. */
#ifndef DT_TEST_REF_GPT_H
#define DT_TEST_REF_GPT_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"

typedef struct {
    const gpt_model *m;
    const double *p; /* parameters in the model's layout, as doubles */
} ref_gpt;

static const double *ref_t(const ref_gpt *r, const char *name) {
    const gpt_tensor *t = gpt_find(r->m, name);
    return t ? r->p + t->offset : NULL;
}

static void ref_ln(double *out, const double *x, const double *w, const double *b, int C) {
    double mean = 0, var = 0;
    for (int c = 0; c < C; c++) mean += x[c];
    mean /= C;
    for (int c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
    var /= C;
    double rs = 1.0 / sqrt(var + 1e-5);
    for (int c = 0; c < C; c++) out[c] = (x[c] - mean) * rs * w[c] + b[c];
}

/* y[OC] = x[IC]·W[IC][OC] + b */
static void ref_lin(double *y, const double *x, const double *W, const double *b, int IC, int OC) {
    for (int o = 0; o < OC; o++) {
        double s = b[o];
        for (int i = 0; i < IC; i++) s += x[i] * W[(size_t)i * OC + o];
        y[o] = s;
    }
}

/* Mean cross-entropy over B x T tokens. */
static double ref_loss(const ref_gpt *r, const dt_token *tok, const dt_token *tgt, int B, int T) {
    const gpt_shape *s = &r->m->shape;
    int C = s->n_embd, NH = s->n_head, hs = C / NH, V = s->vocab_size, L = s->n_layer;
    double *x = calloc((size_t)T * C, sizeof(double)), *h = calloc((size_t)T * C, sizeof(double));
    double *qkv = calloc((size_t)T * 3 * C, sizeof(double)), *y = calloc((size_t)T * C, sizeof(double));
    double *f = calloc((size_t)4 * C, sizeof(double)), *tmp = calloc((size_t)C, sizeof(double));
    double *att = calloc((size_t)T, sizeof(double));
    double total = 0;
    char nm[64];
    for (int b = 0; b < B; b++) {
        const dt_token *tk = tok + (size_t)b * T;
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                x[t * C + c] = ref_t(r, "wte.weight")[(size_t)tk[t] * C + c] + ref_t(r, "wpe.weight")[t * C + c];
        for (int l = 0; l < L; l++) {
#define W(sfx) (snprintf(nm, sizeof nm, "h.%d.%s", l, sfx), ref_t(r, nm))
            for (int t = 0; t < T; t++) {
                ref_ln(h + t * C, x + t * C, W("ln_1.weight"), W("ln_1.bias"), C);
                ref_lin(qkv + (size_t)t * 3 * C, h + t * C, W("attn.c_attn.weight"), W("attn.c_attn.bias"), C, 3 * C);
            }
            for (int t = 0; t < T; t++)
                for (int hd = 0; hd < NH; hd++) {
                    const double *q = qkv + (size_t)t * 3 * C + hd * hs;
                    double mx = -1e300, sum = 0;
                    for (int u = 0; u <= t; u++) {
                        const double *k = qkv + (size_t)u * 3 * C + C + hd * hs;
                        double d = 0;
                        for (int i = 0; i < hs; i++) d += q[i] * k[i];
                        att[u] = d / sqrt((double)hs);
                        if (att[u] > mx) mx = att[u];
                    }
                    for (int u = 0; u <= t; u++) sum += (att[u] = exp(att[u] - mx));
                    for (int i = 0; i < hs; i++) {
                        double acc = 0;
                        for (int u = 0; u <= t; u++) acc += att[u] / sum * qkv[(size_t)u * 3 * C + 2 * C + hd * hs + i];
                        y[t * C + hd * hs + i] = acc;
                    }
                }
            for (int t = 0; t < T; t++) {
                ref_lin(tmp, y + t * C, W("attn.c_proj.weight"), W("attn.c_proj.bias"), C, C);
                for (int c = 0; c < C; c++) x[t * C + c] += tmp[c];
                ref_ln(h + t * C, x + t * C, W("ln_2.weight"), W("ln_2.bias"), C);
                ref_lin(f, h + t * C, W("mlp.c_fc.weight"), W("mlp.c_fc.bias"), C, 4 * C);
                for (int i = 0; i < 4 * C; i++) {
                    double v = f[i];
                    f[i] = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
                }
                ref_lin(tmp, f, W("mlp.c_proj.weight"), W("mlp.c_proj.bias"), 4 * C, C);
                for (int c = 0; c < C; c++) x[t * C + c] += tmp[c];
            }
#undef W
        }
        for (int t = 0; t < T; t++) {
            ref_ln(h + t * C, x + t * C, ref_t(r, "ln_f.weight"), ref_t(r, "ln_f.bias"), C);
            double mx = -1e300, sum = 0, lt = 0;
            const double *wte = ref_t(r, "wte.weight");
            for (int v = 0; v < V; v++) {
                double d = 0;
                for (int c = 0; c < C; c++) d += h[t * C + c] * wte[(size_t)v * C + c];
                if (d > mx) mx = d;
                if (v == tgt[(size_t)b * T + t]) lt = d;
            }
            for (int v = 0; v < V; v++) {
                double d = 0;
                for (int c = 0; c < C; c++) d += h[t * C + c] * wte[(size_t)v * C + c];
                sum += exp(d - mx);
            }
            total += log(sum) + mx - lt;
        }
    }
    free(x), free(h), free(qkv), free(y), free(f), free(tmp), free(att);
    return total / ((double)B * T);
}

/* Gradient check of one tensor: central differences (step 1e-5) of the double loss at up to
 * `samples` evenly spaced real elements against the analytic grads[] (the model's layout).
 * p is r's parameter array, perturbed and restored in place. Returns max|g - fd| / max|fd|;
 * *maxfd gets max|fd|. */
static double ref_fd_check(ref_gpt *r, double *p, const gpt_tensor *t, const float *grads, const dt_token *tok,
                           const dt_token *tgt, int B, int T, size_t samples, double *maxfd) {
    const double h = 1e-5;
    size_t keep = (size_t)t->saved_rows * t->shape[1];
    size_t stride = keep > samples ? keep / samples : 1;
    double maxdiff = 0;
    *maxfd = 0;
    for (size_t j = 0; j < keep; j += stride) {
        double *x = &p[t->offset + j], x0 = *x;
        *x = x0 + h;
        double lp = ref_loss(r, tok, tgt, B, T);
        *x = x0 - h;
        double lm = ref_loss(r, tok, tgt, B, T);
        *x = x0;
        double fd = (lp - lm) / (2 * h), an = grads[t->offset + j];
        if (fabs(fd - an) > maxdiff) maxdiff = fabs(fd - an);
        if (fabs(fd) > *maxfd) *maxfd = fabs(fd);
    }
    return maxdiff / (*maxfd > 1e-12 ? *maxfd : 1e-12);
}

#endif
