/* Shard specs: every real element of a tensor belongs to exactly one piece of any split
 * (rows, columns, fused q/k/v columns), runs agree element by element with
 * dt_shard_global_index, padding rows are never mapped, replicated pieces map as their
 * piece does, bad splits are refused. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/shard.h"

static void check_split(int64_t rows, int64_t cols, int64_t real, int dim, int pieces, int parts) {
    int64_t n = rows * cols;
    int *hits = calloc((size_t)n, sizeof *hits);
    int ok_runs = 1, ok_shape = 1;
    for (int p = 0; p < pieces; p++) {
        dt_shard s = dt_shard_full(rows, cols, real);
        if (dt_shard_split(&s, dim, pieces, p, parts, "t") != DT_OK) {
            CHECK(0, "split %lldx%lld dim %d into %d (%d parts)", (long long)rows, (long long)cols, dim, pieces, parts);
            free(hits);
            return;
        }
        int64_t lr, lc;
        dt_shard_local_shape(&s, &lr, &lc);
        ok_shape &= lr * lc * pieces == n && dt_shard_local_numel(&s) == lr * lc;
        for (int64_t r = 0; r < lr; r++)
            for (int64_t c = 0; c < lc; c++)
                if (dt_shard_row_is_real(&s, r)) hits[dt_shard_global_index(&s, r, c)]++;
        /* the runs cover the same mapping */
        int64_t nr = dt_shard_runs(&s, NULL, 0);
        dt_shard_run *runs = malloc((size_t)(nr ? nr : 1) * sizeof *runs);
        ok_runs &= nr <= dt_shard_max_runs(&s) && dt_shard_runs(&s, runs, nr) == nr;
        for (int64_t k = 0; k < nr; k++)
            for (int64_t e = 0; e < runs[k].len; e++) {
                int64_t loc = runs[k].local + e;
                ok_runs &= dt_shard_global_index(&s, loc / lc, loc % lc) == runs[k].global + e &&
                           dt_shard_row_is_real(&s, loc / lc);
            }
        free(runs);
    }
    int once = 1;
    for (int64_t g = 0; g < n; g++) once &= hits[g] == (g / cols < real ? 1 : 0);
    CHECK(once && ok_runs && ok_shape, "%lldx%lld (real rows %lld) dim %d into %d, %d parts: once %d runs %d shape %d",
          (long long)rows, (long long)cols, (long long)real, dim, pieces, parts, once, ok_runs, ok_shape);
    free(hits);
}

int main(void) {
    for (int pieces = 1; pieces <= 4; pieces *= 2) {
        check_split(64, 48, 64, 0, pieces, 1);   /* row split (MLP down, attention out) */
        check_split(64, 48, 64, 1, pieces, 1);   /* column split (MLP up) */
        check_split(16, 96, 16, 1, pieces, 3);   /* fused q|k|v columns */
        check_split(320, 32, 300, 0, pieces, 1); /* vocabulary rows with padding (wte) */
        check_split(1, 96, 1, 1, pieces, 3);     /* a 1-D bias split like its weight */
    }
    /* replicated pieces (Llama's 2 key/value heads under tp 4): ranks 2t and 2t+1 hold
     * piece t, as its replicas 0 and 1, with the mapping and runs of the plain split; one
     * piece (multi-query under tp 2) is the whole tensor on each rank, replicas 1 */
    for (int rank = 0; rank < 4; rank++) {
        dt_shard rs = dt_shard_full(16, 32, 16), ps = dt_shard_full(16, 32, 16);
        CHECK(dt_shard_split_replicated(&rs, 0, 4, rank, 2, 1, "k_proj") == DT_OK &&
                  dt_shard_split(&ps, 0, 2, rank / 2, 1, "k_proj") == DT_OK,
              "replicated split, rank %d", rank);
        CHECK(rs.dim == 0 && rs.pieces == 2 && rs.index == rank / 2 && rs.replicas == 2 && rs.replica == rank % 2 &&
                  dt_shard_local_numel(&rs) == 8 * 32,
              "rank %d: dim %d pieces %d index %d replicas %d replica %d", rank, rs.dim, rs.pieces, rs.index,
              rs.replicas, rs.replica);
        dt_shard_run a[1], b[1];
        CHECK(dt_shard_runs(&rs, a, 1) == 1 && dt_shard_runs(&ps, b, 1) == 1 && a[0].global == b[0].global &&
                  a[0].global == (int64_t)(rank / 2) * 8 * 32 && a[0].len == 8 * 32 &&
                  dt_shard_global_index(&rs, 3, 5) == dt_shard_global_index(&ps, 3, 5),
              "rank %d: the runs of piece %d", rank, rank / 2);
        dt_shard bias = dt_shard_full(1, 16, 1);
        CHECK(dt_shard_split_replicated(&bias, 1, 4, rank, 2, 1, "k_proj.bias") == DT_OK && bias.dim == 1 &&
                  bias.index == rank / 2 && bias.replica == rank % 2 &&
                  dt_shard_global_index(&bias, 0, 0) == (rank / 2) * 8,
              "rank %d: the bias's piece", rank);
        dt_shard one = dt_shard_full(8, 32, 8);
        CHECK(dt_shard_split_replicated(&one, 0, 2, rank % 2, 2, 1, "mqa") == DT_OK && one.dim == -1 &&
                  one.pieces == 1 && one.replicas == 1 && one.replica == 0 && dt_shard_local_numel(&one) == 8 * 32,
              "one piece over 2 ranks: whole, replicas %d", one.replicas);
    }
    dt_shard plain = dt_shard_full(16, 32, 16);
    CHECK(dt_shard_split(&plain, 0, 2, 1, 1, "x") == DT_OK && plain.replicas == 1 && plain.replica == 0,
          "a plain split: replicas 1");
    CHECK(dt_shard_split_replicated(&plain, 0, 4, 1, 3, 1, "x") == DT_EINPUT, "3 replicas over 4 ranks");
    dt_error_clear();
    /* q|k|v: piece 1 of 2 of a [4, 3·8] tensor holds columns 4..7, 12..15, 20..23 */
    dt_shard s = dt_shard_full(4, 24, 4);
    CHECK(dt_shard_split(&s, 1, 2, 1, 3, "c_attn") == DT_OK, "qkv split");
    CHECK(dt_shard_global_index(&s, 0, 0) == 4 && dt_shard_global_index(&s, 0, 4) == 12 &&
              dt_shard_global_index(&s, 1, 11) == 24 + 23,
          "qkv mapping %lld %lld %lld", (long long)dt_shard_global_index(&s, 0, 0),
          (long long)dt_shard_global_index(&s, 0, 4), (long long)dt_shard_global_index(&s, 1, 11));
    /* a piece of padding rows only has no runs; one piece of one is replicated */
    s = dt_shard_full(8, 2, 4);
    CHECK(dt_shard_split(&s, 0, 2, 1, 1, "wte") == DT_OK && dt_shard_runs(&s, NULL, 0) == 0, "all-padding piece");
    s = dt_shard_full(8, 6, 8);
    CHECK(dt_shard_split(&s, 1, 1, 0, 3, "x") == DT_OK && s.dim == -1 && s.parts == 1, "one piece = replicated");
    dt_error_clear();
    /* refused: uneven pieces, parts along rows, bad index */
    s = dt_shard_full(10, 6, 10);
    CHECK(dt_shard_split(&s, 0, 3, 0, 1, "h.0.mlp.c_proj.weight") == DT_EINPUT &&
              strstr(dt_error_message(), "h.0.mlp.c_proj.weight: 10 rows"),
          "uneven rows: %s", dt_error_message());
    dt_error_clear();
    s = dt_shard_full(4, 6, 4);
    CHECK(dt_shard_split(&s, 1, 4, 0, 3, "c_attn") == DT_EINPUT, "2 columns per part into 4");
    dt_error_clear();
    CHECK(dt_shard_split(&s, 0, 2, 0, 3, "x") == DT_EINPUT, "parts along rows");
    dt_error_clear();
    CHECK(dt_shard_split(&s, 1, 2, 2, 1, "x") == DT_EINPUT, "index out of range");
    return check_finish();
}
