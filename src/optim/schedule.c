#include <math.h>

#include "optimizer.h"

double dt_lr_at(const dt_adamw_hparams *hp, long long s) {
    if (s < hp->warmup_steps) return hp->lr * (double)(s + 1) / (double)hp->warmup_steps;
    long long decay_steps = hp->total_steps - hp->warmup_steps;
    if (decay_steps <= 0) return hp->lr;
    double progress = (double)(s - hp->warmup_steps) / (double)decay_steps;
    if (progress > 1.0) progress = 1.0;
    return hp->min_lr + 0.5 * (hp->lr - hp->min_lr) * (1.0 + cos(M_PI * progress));
}
