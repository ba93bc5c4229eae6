#include "shard.h"

dt_shard dt_shard_full(int64_t rows, int64_t cols, int64_t real_rows) {
    return (dt_shard){rows, cols, real_rows, -1, 1, 0, 1, 1, 0};
}

dt_status dt_shard_split(dt_shard *s, int dim, int pieces, int index, int parts, const char *what) {
    if (pieces < 1 || index < 0 || index >= pieces || parts < 1 || (dim != 0 && dim != 1))
        return dt_fail(DT_EINPUT, "%s: bad split (dim %d, piece %d of %d, %d parts)", what, dim, index, pieces, parts);
    int64_t extent = dim == 0 ? s->rows : s->cols;
    if (extent % parts || (extent / parts) % pieces)
        return dt_fail(DT_EINPUT, "%s: %lld %s (%d part%s) do not split into %d equal pieces", what, (long long)extent,
                       dim == 0 ? "rows" : "columns", parts, parts == 1 ? "" : "s", pieces);
    if (dim == 0 && parts != 1) return dt_fail(DT_EINPUT, "%s: fused parts are split along columns only", what);
    s->dim = pieces == 1 ? -1 : dim;
    s->pieces = pieces;
    s->index = pieces == 1 ? 0 : index;
    s->parts = pieces == 1 ? 1 : parts;
    s->replicas = 1;
    s->replica = 0;
    return DT_OK;
}

dt_status dt_shard_split_replicated(dt_shard *s, int dim, int ranks, int rank, int replicas, int parts,
                                    const char *what) {
    if (replicas < 1 || ranks < 1 || ranks % replicas || rank < 0 || rank >= ranks)
        return dt_fail(DT_EINPUT, "%s: bad split (rank %d of %d, %d replicas)", what, rank, ranks, replicas);
    DT_TRY(dt_shard_split(s, dim, ranks / replicas, rank / replicas, parts, what));
    if (s->pieces > 1) { /* one piece: every rank holds it whole, as any replicated tensor */
        s->replicas = replicas;
        s->replica = rank % replicas;
    }
    return DT_OK;
}

void dt_shard_local_shape(const dt_shard *s, int64_t *rows, int64_t *cols) {
    *rows = s->dim == 0 ? s->rows / s->pieces : s->rows;
    *cols = s->dim == 1 ? s->cols / s->pieces : s->cols;
}

int64_t dt_shard_local_numel(const dt_shard *s) {
    int64_t r, c;
    dt_shard_local_shape(s, &r, &c);
    return r * c;
}

int64_t dt_shard_global_index(const dt_shard *s, int64_t r, int64_t c) {
    if (s->dim == 0) return (s->index * (s->rows / s->pieces) + r) * s->cols + c;
    if (s->dim == 1) {
        int64_t part_w = s->cols / s->parts, w = part_w / s->pieces; /* local columns per part */
        int64_t part = c / w, off = c % w;
        return r * s->cols + part * part_w + s->index * w + off;
    }
    return r * s->cols + c;
}

int dt_shard_row_is_real(const dt_shard *s, int64_t r) {
    int64_t g = s->dim == 0 ? s->index * (s->rows / s->pieces) + r : r;
    return g < s->real_rows;
}

int64_t dt_shard_max_runs(const dt_shard *s) {
    int64_t r, c;
    dt_shard_local_shape(s, &r, &c);
    return s->dim == 1 ? r * s->parts : 1;
}

int64_t dt_shard_runs(const dt_shard *s, dt_shard_run *runs, int64_t cap) {
    int64_t r, c, n = 0;
    dt_shard_local_shape(s, &r, &c);
    if (s->dim != 1) { /* rows are contiguous in both: one run over the real rows */
        int64_t real = 0;
        while (real < r && dt_shard_row_is_real(s, real)) real++;
        if (real > 0 && cap > 0) runs[0] = (dt_shard_run){0, dt_shard_global_index(s, 0, 0), real * c};
        return real > 0;
    }
    int64_t w = c / s->parts;
    for (int64_t i = 0; i < r && dt_shard_row_is_real(s, i); i++)
        for (int p = 0; p < s->parts; p++, n++)
            if (n < cap) runs[n] = (dt_shard_run){i * c + p * w, dt_shard_global_index(s, i, p * w), w};
    return n;
}
