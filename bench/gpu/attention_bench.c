/* Times bf16 causal attention on the GPU through the CUDA ops table, the kernels that
 * DT_CUDA_ATTENTION picks (mma, the default, with DT_CUDA_FA_ROWS 32 or 16 query rows
 * per warp in the forward; wmma; simt), forward and backward (the
 * backward's D = rowsum(dO∘O) pass included) at B T NH HS (default GPT-2 124M's 64 1024
 * 12 64): the median of 20 calls after 3 warm-ups, each synchronised. TFLOP/s counts the
 * causal half: forward 2·B·NH·T²·HS, backward 2.5 times that (five products to the
 * forward's two), as FlashAttention's benchmarks do.
 * Usage: attention_bench [B T NH HS [DOC]]; DOC > 0 packs each row with documents of DOC
 * tokens (document-masked attention; TFLOP/s then still counts the full causal work, so
 * it reads as the speed-up). bench/gpu/torch_attention.py measures PyTorch's SDPA at the
 * same shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/ops.h"
#include "core/bf16.h"
#include "core/status.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int B = argc > 4 ? atoi(argv[1]) : 64, T = argc > 4 ? atoi(argv[2]) : 1024, NH = argc > 4 ? atoi(argv[3]) : 12,
        HS = argc > 4 ? atoi(argv[4]) : 64, C = NH * HS, DOC = argc > 5 ? atoi(argv[5]) : 0;
    const dt_ops *G;
    if (dt_ops_cuda(&G, 1) != DT_OK) {
        printf("skip: %s\n", dt_error_message());
        return 77;
    }
    size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    uint16_t *h = malloc(nqkv * 2);
    unsigned s = 12345;
    for (size_t i = 0; i < nqkv; i++) {
        s = s * 1103515245u + 12345u;
        h[i] = dt_f32_to_bf16(((s >> 8) & 0xffff) / 32768.0f - 1.0f);
    }
    float *qkv, *out, *lse, *dout, *dqkv;
    if (G->alloc((void **)&qkv, nqkv * 2, "qkv") || G->alloc((void **)&out, no * 2, "out") ||
        G->alloc((void **)&lse, nl * 4, "lse") || G->alloc((void **)&dout, no * 2, "dout") ||
        G->alloc((void **)&dqkv, nqkv * 2, "dqkv")) {
        printf("FAIL %s\n", dt_error_message());
        return 1;
    }
    G->upload(qkv, h, nqkv * 2);
    G->upload(dout, h, no * 2);
    int *seg = NULL;
    if (DOC > 0) {
        int *hs = malloc((size_t)B * T * sizeof *hs);
        for (size_t i = 0; i < (size_t)B * T; i++) hs[i] = (int)(i % (size_t)T) / DOC * DOC;
        if (G->alloc((void **)&seg, (size_t)B * T * sizeof *seg, "seg")) {
            printf("FAIL %s\n", dt_error_message());
            return 1;
        }
        G->upload(seg, hs, (size_t)B * T * sizeof *hs);
        free(hs);
    }
    enum { WARM = 3, RUNS = 20 };
    double tf[RUNS], tb[RUNS];
    for (int i = 0; i < WARM + RUNS; i++) {
        G->sync();
        double t0 = now();
        G->attention_fwd(out, lse, qkv, seg, B, T, C, NH);
        G->sync();
        double t1 = now();
        G->attention_bwd(dqkv, dout, qkv, out, lse, seg, B, T, C, NH);
        if (G->sync() != DT_OK) {
            printf("FAIL %s\n", dt_error_message());
            return 1;
        }
        double t2 = now();
        if (i >= WARM) tf[i - WARM] = t1 - t0, tb[i - WARM] = t2 - t1;
    }
    qsort(tf, RUNS, sizeof *tf, cmp);
    qsort(tb, RUNS, sizeof *tb, cmp);
    double flops = 2.0 * B * NH * (double)T * T * HS, f = tf[RUNS / 2], b = tb[RUNS / 2];
    const char *path = getenv("DT_CUDA_ATTENTION"), *rows = getenv("DT_CUDA_FA_ROWS");
    char what[64];
    if (path && strcmp(path, "mma")) snprintf(what, sizeof what, "%s", path);
    else snprintf(what, sizeof what, "mma, forward %s rows per warp", rows && !strcmp(rows, "16") ? "16" : "32");
    if (DOC > 0) snprintf(what + strlen(what), sizeof what - strlen(what), ", documents of %d", DOC);
    printf("dtrain attention (%s) B=%d T=%d NH=%d HS=%d: forward %.3f ms %.1f TFLOP/s, backward %.3f ms %.1f "
           "TFLOP/s\n",
           what, B, T, NH, HS, f * 1e3, flops / f / 1e12, b * 1e3, 2.5 * flops / b / 1e12);
    free(h);
    return 0;
}
