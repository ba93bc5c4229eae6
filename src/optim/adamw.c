#include <math.h>

#include "optimizer.h"

void dt_adamw_range(const dt_adamw_hparams *hp, const dt_ops *ops, long long step, int decay, double lr, float gscale,
                    float *p, float *p_store, const float *g, float *m, float *v, size_t n) {
    float bc1 = (float)(1.0 - pow(hp->beta1, (double)step)), bc2 = (float)(1.0 - pow(hp->beta2, (double)step));
    ops->adamw(p, p_store, g, m, v, n, (float)lr, (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
               decay ? (float)hp->weight_decay : 0.0f, bc1, bc2, gscale);
}

void dt_adamw_step(dt_adamw *o, const dt_ops *ops, const gpt_model *m, double lr, float gscale) {
    o->step++;
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        if (t->frozen) continue;
        size_t k = t->offset;
        size_t e = dt_elem_bytes(ops);
        float *store = o->master ? (float *)((char *)m->params + k * e) : NULL;
        float *p = o->master ? o->master + k : m->params + k;
        dt_adamw_range(&o->hp, ops, o->step, t->decay, lr, gscale, p, store, (const float *)((const char *)m->grads + k * e),
                       o->m + k, o->v + k, t->numel);
    }
}
