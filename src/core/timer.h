#ifndef DT_TIMER_H
#define DT_TIMER_H
#include <time.h>
/* monotonic seconds */
static inline double dt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif
