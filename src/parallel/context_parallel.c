#include "context_parallel.h"

dt_status dt_cp_check(int T, int cp) {
    if (cp < 1 || T < 1 || T % (2 * cp) != 0)
        return dt_fail(DT_EINPUT, "parallel.cp %d: the sequence length %d must split into 2 x cp = %d equal chunks "
                       "(causal load balance)", cp, T, 2 * cp);
    return DT_OK;
}

void dt_cp_positions(int T, int cp, int rank, int *pos) {
    int Tc = T / (2 * cp), chunks[2] = {rank, 2 * cp - 1 - rank};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < Tc; i++) pos[k * Tc + i] = chunks[k] * Tc + i;
}

int64_t dt_cp_attention_pairs(int T, int cp, int rank) {
    int Tc = T / (2 * cp), chunks[2] = {rank, 2 * cp - 1 - rank};
    int64_t n = 0;
    for (int k = 0; k < 2; k++) /* position p sees p + 1 keys */
        n += (int64_t)Tc * chunks[k] * Tc + (int64_t)Tc * (Tc + 1) / 2;
    return n;
}
