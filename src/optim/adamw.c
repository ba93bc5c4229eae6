#include <math.h>
#include <string.h>

#include "../core/mem.h"
#include "optimizer.h"

dt_status dt_adamw_create(dt_adamw *o, const dt_adamw_hparams *hp, size_t n) {
    memset(o, 0, sizeof *o);
    o->hp = *hp;
    o->n = n;
    DT_TRY(dt_alloc((void **)&o->m, n * sizeof(float), "AdamW first moments"));
    DT_TRY(dt_alloc((void **)&o->v, n * sizeof(float), "AdamW second moments"));
    return DT_OK;
}

void dt_adamw_destroy(dt_adamw *o) {
    dt_free(o->m);
    dt_free(o->v);
    memset(o, 0, sizeof *o);
}

void dt_adamw_step(dt_adamw *o, const dt_ops *ops, const gpt_model *m, double lr) {
    o->step++;
    float bc1 = (float)(1.0 - pow(o->hp.beta1, (double)o->step));
    float bc2 = (float)(1.0 - pow(o->hp.beta2, (double)o->step));
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        float wd = t->decay ? (float)o->hp.weight_decay : 0.0f;
        ops->adamw(m->params + t->offset, m->grads + t->offset, o->m + t->offset, o->v + t->offset, t->numel,
                   (float)lr, (float)o->hp.beta1, (float)o->hp.beta2, (float)o->hp.eps, wd, bc1, bc2);
    }
}
