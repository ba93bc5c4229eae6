#include "dp_core.h"

#include <string.h>

dt_status dt_dp_inflight_slot(dt_dp *d, dt_request ***slot) {
    if (d->ninflight == MAX_INFLIGHT) { /* bounded: finish the oldest before starting more */
        dt_status s;
        DP_COMM(d, s = dt_wait(d->inflight[0]));
        memmove(d->inflight, d->inflight + 1, (MAX_INFLIGHT - 1) * sizeof(dt_request *));
        d->ninflight--;
        DT_TRY(s);
    }
    *slot = &d->inflight[d->ninflight];
    return DT_OK;
}

dt_status dt_dp_inflight_wait(dt_dp *d) {
    dt_status s = DT_OK;
    double t0 = dt_now();
    for (int i = 0; i < d->ninflight; i++) {
        dt_status w = dt_wait(d->inflight[i]);
        if (s == DT_OK) s = w;
    }
    d->ninflight = 0;
    d->comm_s += dt_now() - t0;
    return s;
}
