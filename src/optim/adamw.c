#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optimizer.h"

void dt_adamw_range(const dt_adamw_hparams *hp, const dt_ops *ops, long long step, int decay, double lr, float gscale,
                    float *p, float *p_store, const float *g, float *m, float *v, size_t n) {
    float bc1 = (float)(1.0 - pow(hp->beta1, (double)step)), bc2 = (float)(1.0 - pow(hp->beta2, (double)step));
    ops->adamw(p, p_store, g, m, v, n, (float)lr, (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
               decay ? (float)hp->weight_decay : 0.0f, bc1, bc2, gscale);
}

dt_status dt_optimizer_create(dt_optimizer *o, const dt_ops *ops, const dt_adamw_hparams *hp, size_t n, int moments,
                              const char *what) {
    memset(o, 0, sizeof *o);
    o->hp = *hp;
    o->ops = ops;
    o->n = n;
    char name[96];
    if (moments) {
        snprintf(name, sizeof name, "AdamW first moments%s", what);
        DT_TRY(ops->alloc((void **)&o->m, n * sizeof(float), name));
        snprintf(name, sizeof name, "AdamW second moments%s", what);
        DT_TRY(ops->alloc((void **)&o->v, n * sizeof(float), name));
    }
    if (ops->bf16) {
        snprintf(name, sizeof name, "fp32 master weights%s", what);
        DT_TRY(ops->alloc((void **)&o->master, n * sizeof(float), name));
    }
    return DT_OK;
}

void dt_optimizer_free(dt_optimizer *o) {
    if (!o->ops) return;
    o->ops->free(o->m);
    o->ops->free(o->v);
    o->ops->free(o->master);
    o->m = o->v = o->master = NULL;
}

void dt_optimizer_step_range(const dt_optimizer *o, long long step, int decay, double lr, float gscale, size_t k,
                             float *param, const float *g, size_t n) {
    float *p = o->master ? o->master + k : param, *store = o->master ? param : NULL;
    dt_adamw_range(&o->hp, o->ops, step, decay, lr, gscale, p, store, g, o->m + k, o->v + k, n);
}

void dt_optimizer_step_model(const dt_optimizer *o, long long step, const gpt_model *m, double lr, float gscale) {
    size_t e = dt_elem_bytes(o->ops);
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        if (t->frozen) continue;
        size_t k = t->offset;
        dt_optimizer_step_range(o, step, t->decay, lr, gscale, k, (float *)((char *)m->params + k * e),
                                (const float *)((const char *)m->grads + k * e), t->numel);
    }
}
