/* The checkpoint of a distributed state (src/ckpt/distributed.h): who writes what, and
 * that every layout's files are byte for byte the single writer's. A model of 2 blocks
 * (its weights and two "moments" from gpt_init with three seeds, so every element is
 * known) is held whole by every rank (data parallelism), split over all ranks (tensor
 * parallelism), and, with 4 ranks, split over pairs of ranks in two replicas (dp 2 x tp 2);
 * the pieces are handed over as the engine hands them (dt_ckpt_pieces: the full state as
 * unit views, or streamed one tensor at a time). Checked: the roles (one writer per
 * checkpoint, the first replica's; only the root has the split digest; async only where
 * one rank writes), every save's model, optimizer and trainer_state files equal
 * dt_ckpt_save's of the whole model, a streamed save makes the same source calls on
 * every rank, and the digest is the whole model's. Usage: mpirun -np N
 * mpi_test_ckpt_distributed [SOURCE_DIR] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/ops.h"
#include "ckpt/distributed.h"

#include "check.h"

/* weights and both moments of one layout, from seeds 1, 2, 3 */
typedef struct {
    gpt_model set[3];
    long calls; /* a streamed source's get calls */
} held;

static dt_status make(held *h, const gpt_shape *s, int tp, int tp_rank) {
    gpt_layout lay = {.tp = tp, .tp_rank = tp_rank};
    for (int k = 0; k < 3; k++) {
        DT_TRY(gpt_create_layout(&h->set[k], s, dt_ops_cpu(), 1, 8, 1, &lay));
        gpt_init(&h->set[k], (uint64_t)k + 1);
    }
    h->calls = 0;
    return DT_OK;
}
static void unmake(held *h) {
    for (int k = 0; k < 3; k++) gpt_destroy(&h->set[k]);
}

static dt_status open_full(void *ctx, int moments, int snapshot, int reader, float ***mv, float ***vv) {
    (void)snapshot;
    held *h = ctx;
    *mv = reader && moments ? h->set[1].unit_params : NULL;
    *vv = reader && moments ? h->set[2].unit_params : NULL;
    return DT_OK;
}
static dt_status close_full(void *ctx, float **mv, float **vv) {
    (void)ctx, (void)mv, (void)vv;
    return DT_OK;
}
static dt_status get(void *ctx, int set, int i, const float **data) {
    held *h = ctx;
    const gpt_model *m = &h->set[set];
    const gpt_tensor *t = &m->tensors[i];
    h->calls++;
    *data = m->unit_params[t->unit] + (t->offset - m->units[t->unit].offset);
    return DT_OK;
}
static dt_status source_open(void *ctx, int moments, int reader, dt_ckpt_source *src) {
    (void)reader; /* every rank takes part */
    *src = (dt_ckpt_source){get, ctx, moments};
    return DT_OK;
}
static void source_close(void *ctx, dt_ckpt_source *src) { (void)ctx, (void)src; }

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb, ca, cb;
    while (same && (ca = fgetc(fa), cb = fgetc(fb), ca == cb) && ca != EOF) {}
    if (same) same = feof(fa) && feof(fb);
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static char g_base[256];
static const dt_train_state g_st = {.step = 3, .data_epoch = 1, .data_pos = 40};

/* rank 0: DIR's step 3 holds the reference's files, byte for byte, and no other step */
static void check_files(const char *name) {
    if (g_rank != 0) return;
    static const char *files[] = {"model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    for (int f = 0; f < 3; f++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/ref/step_00000003/%s", g_base, files[f]);
        snprintf(b, sizeof b, "%s/%s/step_00000003/%s", g_base, name, files[f]);
        CHECK(same_file(a, b), "%s: %s is the single writer's", name, files[f]);
    }
    char latest[512];
    snprintf(latest, sizeof latest, "%s/%s/latest", g_base, name);
    FILE *f = fopen(latest, "r");
    char line[64] = "";
    CHECK(f && fgets(line, sizeof line, f) && !strcmp(line, "step_00000003\n"), "%s: latest names step 3", name);
    if (f) fclose(f);
}

static void save_into(dt_ckpt_dist *c, const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_base, name);
    if (g_rank == 0) mkdir(dir, 0777);
    CHECK(dt_ckpt_save_distributed(c, dir, &g_st, "{}", 0) == DT_OK, "%s: save", name);
    CHECK(dt_ckpt_save_wait(c) == DT_OK, "%s: wait", name);
    check_files(name);
}

int main(int argc, char **argv) {
    dt_comm *world = NULL;
    if (dt_comm_init(&world, &argc, &argv) != DT_OK) {
        fprintf(stderr, "mpi_test_ckpt_distributed: %s\n", dt_error_message());
        return 1;
    }
    g_rank = dt_comm_rank(world);
    int n = dt_comm_size(world);
    double pid = (double)getpid(); /* one directory for every rank: rank 0's */
    dt_bcast(world, &pid, 1, DT_F64, 0);
    snprintf(g_base, sizeof g_base, "/tmp/mpi_test_ckpt_distributed.%d", (int)pid);
    gpt_shape s = {2, 12, 48, 8, 150, .padded_vocab = 0}; /* heads and the padded vocabulary (192) split by 2, 3, 4 */
    held whole;
    CHECK(make(&whole, &s, 1, 0) == DT_OK, "whole model");
    char ref_hex[65];
    dt_weights_digest(&whole.set[0], ref_hex);
    if (g_rank == 0) {
        char dir[512];
        mkdir(g_base, 0777);
        snprintf(dir, sizeof dir, "%s/ref", g_base);
        mkdir(dir, 0777);
        CHECK(dt_ckpt_save(dir, &whole.set[0], whole.set[1].unit_params, whole.set[2].unit_params, &g_st, "{}", 0) ==
                  DT_OK, "the single writer's save");
    }
    dt_barrier(world);

    /* data parallelism: every rank holds the whole state; rank 0 writes alone */
    dt_ckpt_groups g = {world, {NULL, NULL}, NULL};
    dt_ckpt_roles r = dt_ckpt_roles_of(&g);
    CHECK(!r.split && r.replica0 == (g_rank == 0) && r.writer == (g_rank == 0) && !r.root, "dp roles");
    dt_ckpt_pieces p = {&whole, open_full, close_full, NULL, NULL};
    dt_ckpt_dist c;
    dt_ckpt_dist_init(&c, &g, &whole.set[0], &p);
    save_into(&c, "dp");
    char hex[65] = "";
    CHECK(dt_ckpt_digest_distributed(&c, hex) == DT_OK && !strcmp(hex, ref_hex), "dp digest on every rank");
    CHECK(dt_ckpt_dist_set_async(&c, 1) == 1, "async where one rank writes");
    save_into(&c, "dp_async");
    dt_ckpt_dist_finish(&c);
    CHECK(dt_ckpt_dist_set_async(&c, 0) == 0, "async off");
    p = (dt_ckpt_pieces){&whole, open_full, close_full, source_open, source_close};
    dt_ckpt_dist_init(&c, &g, &whole.set[0], &p);
    whole.calls = 0;
    save_into(&c, "dp_stream");
    double calls[2] = {(double)whole.calls, (double)whole.calls}; /* [0] min, [1] max over ranks */
    calls[0] = -calls[0];
    dt_allreduce(world, calls, 2, DT_F64, DT_MAX);
    CHECK(-calls[0] == calls[1] && calls[1] == 3.0 * whole.set[0].ntensors,
          "a streamed save asks every rank's source the same (%g..%g calls)", -calls[0], calls[1]);
    CHECK(dt_ckpt_digest_distributed(&c, hex) == DT_OK && !strcmp(hex, ref_hex), "streamed digest");

    /* tensor parallelism over every rank: rank 0 assembles and writes */
    held piece;
    CHECK(make(&piece, &s, n, g_rank) == DT_OK, "tp %d pieces", n);
    g = (dt_ckpt_groups){NULL, {world, NULL}, NULL};
    dt_comm *self = NULL;
    CHECK(dt_comm_split(world, g_rank, 0, &self) == DT_OK, "a group of one");
    g.dp = self;
    r = dt_ckpt_roles_of(&g);
    CHECK(r.split && r.replica0 && r.writer == (g_rank == 0) && r.root == (g_rank == 0), "tp roles");
    p = (dt_ckpt_pieces){&piece, open_full, close_full, NULL, NULL};
    dt_ckpt_dist_init(&c, &g, &piece.set[0], &p);
    CHECK(dt_ckpt_dist_set_async(&c, 1) == 0, "no async with stage writers");
    save_into(&c, "tp");
    CHECK(dt_ckpt_digest_distributed(&c, hex) == DT_OK && !strcmp(hex, g_rank == 0 ? ref_hex : ""),
          "tp digest at the root");
    unmake(&piece);

    /* dp 2 x tp n/2: the first replica's tensor-parallel group writes; the second only
     * answers open_full (no reader) */
    if (n == 4) {
        dt_comm *tp = NULL, *dp = NULL;
        CHECK(dt_comm_split(world, g_rank / 2, g_rank, &tp) == DT_OK, "tp groups");
        CHECK(dt_comm_split(world, g_rank % 2, g_rank, &dp) == DT_OK, "dp groups");
        CHECK(make(&piece, &s, 2, g_rank % 2) == DT_OK, "tp 2 pieces");
        g = (dt_ckpt_groups){dp, {tp, NULL}, NULL};
        r = dt_ckpt_roles_of(&g);
        CHECK(r.split && r.replica0 == (g_rank < 2) && r.writer == (g_rank == 0) && r.root == (g_rank == 0),
              "dp x tp roles");
        p = (dt_ckpt_pieces){&piece, open_full, close_full, NULL, NULL};
        dt_ckpt_dist_init(&c, &g, &piece.set[0], &p);
        save_into(&c, "dp_tp");
        CHECK(dt_ckpt_digest_distributed(&c, hex) == DT_OK && !strcmp(hex, g_rank == 0 ? ref_hex : ""),
              "dp x tp digest at the root");
        unmake(&piece);
        dt_comm_free(tp);
        dt_comm_free(dp);
    }
    dt_comm_free(self);
    unmake(&whole);
    dt_barrier(world);
    if (g_rank == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_base);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_base);
    }
    double fails = g_fail;
    dt_allreduce(world, &fails, 1, DT_F64, DT_SUM);
    if (g_rank == 0) printf("mpi_test_ckpt_distributed: %d ranks, %d checks on rank 0, %g failures\n", n, g_pass, fails);
    dt_comm_finalize(world);
    return fails > 0;
}
