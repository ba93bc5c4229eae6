/* The element-wise reductions every algorithm applies (sum, mean, maximum over f32, f64
 * and bf16), and the user-defined MPI_Ops that give MPI's own collectives the bf16 ones. */
#include <math.h>

#include "comm_core.h"

/* MPI has no bf16: sums and maxima of bf16 (as MPI_UINT16_T) use these user-defined ops,
 * made by dt_comm_init (MPI_OP_NULL until then). [0]: sum, [1]: max. */
static MPI_Op g_bf16_op[2] = {MPI_OP_NULL, MPI_OP_NULL};

MPI_Op dtc_mpi_op(dt_dtype t, dt_redop op) {
    if (t == DT_BF16) return g_bf16_op[op == DT_MAX];
    return op == DT_MAX ? MPI_MAX : MPI_SUM;
}

/* The f32 and f64 kernels: one definition, the same loops over either element type.
 * restrict lets the sums vectorise without runtime overlap checks; dtc_combine picks the
 * one whose operands do not alias (acc == a is the common in-place case). The maximum's
 * bits do not depend on operand order (the two-rank shm path has each rank compute
 * max(own, peer)): a > b ? a : b would return either zero of max(-0, +0) and either
 * operand when one is NaN. */
#define DTC_KERNELS(T, SUF)                                                                                 \
    static void add_to_##SUF(T *restrict o, const T *restrict y, size_t n, T s, int scaled) {               \
        if (scaled)                                                                                         \
            for (size_t i = 0; i < n; i++) o[i] = (o[i] + y[i]) * s;                                        \
        else                                                                                                \
            for (size_t i = 0; i < n; i++) o[i] = o[i] + y[i];                                              \
    }                                                                                                       \
    static void add3_##SUF(T *restrict o, const T *restrict x, const T *restrict y, size_t n, T s,          \
                           int scaled) {                                                                    \
        if (scaled)                                                                                         \
            for (size_t i = 0; i < n; i++) o[i] = (x[i] + y[i]) * s;                                        \
        else                                                                                                \
            for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];                                              \
    }                                                                                                       \
    static inline T max_##SUF(T a, T b) {                                                                   \
        if (a > b) return a;                                                                                \
        if (b > a) return b;                                                                                \
        if (a == b) return signbit(a) ? b : a; /* equal bits, or -0 and +0: +0 */                           \
        return NAN;                                                                                         \
    }
DTC_KERNELS(float, f32)
DTC_KERNELS(double, f64)

/* bf16: each element converted to fp32, added (and scaled) there, rounded back once.
 * Element-wise read-before-write, so o may equal x or y. */
static void add_bf16(uint16_t *o, const uint16_t *x, const uint16_t *y, size_t n, float s, int scaled) {
    if (scaled)
        for (size_t i = 0; i < n; i++) o[i] = dtc_f32_to_bf16((dtc_bf16_to_f32(x[i]) + dtc_bf16_to_f32(y[i])) * s);
    else
        for (size_t i = 0; i < n; i++) o[i] = dtc_f32_to_bf16(dtc_bf16_to_f32(x[i]) + dtc_bf16_to_f32(y[i]));
}

static void max_any(void *acc, const void *a, const void *b, size_t n, dt_dtype t) {
    if (t == DT_F32) {
        float *o = acc;
        const float *x = a, *y = b;
        for (size_t i = 0; i < n; i++) o[i] = max_f32(x[i], y[i]);
    } else if (t == DT_F64) {
        double *o = acc;
        const double *x = a, *y = b;
        for (size_t i = 0; i < n; i++) o[i] = max_f64(x[i], y[i]);
    } else { /* exact: the larger operand's bits, or the canonical NaN */
        uint16_t *o = acc;
        const uint16_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++) o[i] = dtc_f32_to_bf16(max_f32(dtc_bf16_to_f32(x[i]), dtc_bf16_to_f32(y[i])));
    }
}

void dtc_combine(void *acc, const void *a, const void *b, size_t n, dt_dtype t, dt_redop op, double scale) {
    if (op == DT_MAX) {
        max_any(acc, a, b, n, t);
        return;
    }
    int scaled = scale != 1.0;
    if (t == DT_BF16) {
        add_bf16(acc, a, b, n, (float)scale, scaled);
        return;
    }
    /* x + y == y + x exactly, so swapping operands keeps results bitwise identical */
    if (acc == b) {
        const void *tmp = a;
        a = b;
        b = tmp;
    }
    if (t == DT_F32) {
        if (acc == a) add_to_f32(acc, b, n, (float)scale, scaled);
        else add3_f32(acc, a, b, n, (float)scale, scaled);
    } else {
        if (acc == a) add_to_f64(acc, b, n, scale, scaled);
        else add3_f64(acc, a, b, n, scale, scaled);
    }
}

void dtc_scale(void *buf, size_t n, dt_dtype t, double scale) {
    if (scale == 1.0) return;
    if (t == DT_F32) {
        float *p = buf, s = (float)scale;
        for (size_t i = 0; i < n; i++) p[i] *= s;
    } else if (t == DT_BF16) {
        uint16_t *p = buf;
        float s = (float)scale;
        for (size_t i = 0; i < n; i++) p[i] = dtc_f32_to_bf16(dtc_bf16_to_f32(p[i]) * s);
    } else {
        double *p = buf;
        for (size_t i = 0; i < n; i++) p[i] *= scale;
    }
}

/* The user-defined MPI_Ops for bf16 (inout = in op inout; both commutative). */
static void mpi_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    dtc_combine(inout, inout, in, (size_t)*len, DT_BF16, DT_SUM, 1.0);
}
static void mpi_bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    dtc_combine(inout, inout, in, (size_t)*len, DT_BF16, DT_MAX, 1.0);
}

int dtc_bf16_ops_create(void) {
    if (g_bf16_op[0] != MPI_OP_NULL) return 1;
    return MPI_Op_create(mpi_bf16_sum, 1, &g_bf16_op[0]) == MPI_SUCCESS &&
           MPI_Op_create(mpi_bf16_max, 1, &g_bf16_op[1]) == MPI_SUCCESS;
}

void dtc_bf16_ops_free(void) {
    for (int i = 0; i < 2; i++)
        if (g_bf16_op[i] != MPI_OP_NULL) MPI_Op_free(&g_bf16_op[i]);
}
