/* Which step a checkpoint path resolves to (src/ckpt/ckpt_verify.c): a save directory's
 * newest intact step, passing over damaged ones (a flipped data bit, a trainer_state.json
 * of another step, a garbled `latest`); an explicitly named damaged step is an error, never
 * swapped; no intact step is an error naming the newest; answers are kept per path.
 * Usage: test_ckpt_resolve SRC_DIR */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_verify.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "model/gpt.h"

#include "check.h"

static char g_dir[64];

static void save(const gpt_model *m, long long step) {
    dt_train_state st = {.step = step};
    CHECK(dt_ckpt_save(g_dir, m, NULL, NULL, &st, "{}", 0) == DT_OK, "save step %lld", step);
}

static void step_path(char *out, size_t cap, long long step, const char *file) {
    snprintf(out, cap, "%s/step_%08lld%s%s", g_dir, step, file ? "/" : "", file ? file : "");
}

/* Flips one bit in the data of tensor `name` of a step's model.safetensors. */
static void flip(long long step, const char *name) {
    char p[256];
    step_path(p, sizeof p, step, "model.safetensors");
    st_file f;
    CHECK(st_open(&f, p) == DT_OK, "open %s", p);
    long off = (long)(f.data_start + st_find(&f, name)->begin);
    st_close(&f);
    FILE *fp = fopen(p, "r+b");
    int c = fp && fseek(fp, off, SEEK_SET) == 0 ? fgetc(fp) : EOF;
    CHECK(c != EOF && fseek(fp, off, SEEK_SET) == 0 && fputc(c ^ 1, fp) != EOF && fclose(fp) == 0, "flip %s", p);
}

/* resolve(path) gives the step directory of `want` (a step number; -1: an error with `word`). */
static void expect(const char *path, long long want, const char *word) {
    char got[512], exp[256];
    dt_ckpt_resolve_forget();
    dt_error_clear();
    dt_status s = dt_ckpt_resolve(path, got, sizeof got);
    if (want < 0) {
        CHECK(s == DT_EINPUT && strstr(dt_error_message(), word), "%s: an error with '%s'", path, word);
        return;
    }
    step_path(exp, sizeof exp, want, NULL);
    CHECK(s == DT_OK && !strcmp(got, exp), "%s: resolves to %s (got %s)", path, exp, s == DT_OK ? got : "an error");
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_ckpt_resolve_XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "mkdtemp failed: %s\n", strerror(errno));
        return 1;
    }
    dt_ckpt_resolve_report(0);
    gpt_shape shape = {1, 2, 8, 4, 16, .padded_vocab = 0};
    gpt_model m;
    if (gpt_create(&m, &shape, dt_ops_cpu(), 1, 4) != DT_OK) return 1;
    gpt_init(&m, 1);
    for (long long s = 10; s <= 40; s += 10) save(&m, s);
    char p[256];

    expect(g_dir, 40, NULL);
    step_path(p, sizeof p, 40, NULL);
    expect(p, 40, NULL);
    CHECK(dt_ckpt_verify_step(p) == DT_OK, "an intact step verifies");

    flip(40, "wte.weight");
    expect(g_dir, 30, NULL);                           /* passed over */
    expect(p, -1, "tensor 'wte.weight': checksum mismatch"); /* named: an error, not step 30 */

    /* the answer is kept per path: damage after the first call does not change it */
    char got[512];
    dt_ckpt_resolve_forget();
    CHECK(dt_ckpt_resolve(g_dir, got, sizeof got) == DT_OK, "resolve");
    flip(30, "h.0.ln_1.weight");
    CHECK(dt_ckpt_resolve(g_dir, got, sizeof got) == DT_OK && strstr(got, "step_00000030"), "kept answer");
    expect(g_dir, 20, NULL); /* forgotten: checked again */

    /* trainer_state.json of another step */
    char st[256], *txt = NULL;
    size_t len = 0;
    step_path(st, sizeof st, 20, "trainer_state.json");
    CHECK(dt_read_file(st, &txt, &len, 1 << 20) == DT_OK, "read state");
    char *at = txt ? strstr(txt, "\"step\":\t20") : NULL;
    CHECK(at != NULL, "state names step 20: %s", txt ? txt : "");
    if (at) at[strlen("\"step\":\t2")] = '1'; /* 20 -> 21 */
    CHECK(txt && dt_write_file_atomic(st, txt, len) == DT_OK, "write state");
    free(txt);
    expect(g_dir, 10, NULL);
    step_path(p, sizeof p, 20, NULL);
    expect(p, -1, "trainer_state.json is at step 21, but the directory is named for step 20");

    /* `latest` garbled or missing: the newest intact step of all */
    snprintf(st, sizeof st, "%s/latest", g_dir);
    CHECK(dt_write_file_atomic(st, "../x\n", 5) == DT_OK, "garble latest");
    expect(g_dir, 10, NULL);
    unlink(st);
    expect(g_dir, 10, NULL);
    CHECK(dt_write_file_atomic(st, "step_00000040\n", 14) == DT_OK, "restore latest");

    /* no intact step: the newest is named */
    flip(10, "wpe.weight");
    expect(g_dir, -1, "no step is intact; the newest, step_00000040: model.safetensors: tensor 'wte.weight'");
    /* nothing there */
    snprintf(p, sizeof p, "%s/none", g_dir);
    expect(p, -1, "no trainer_state.json and no 'latest' file");

    gpt_destroy(&m);
    check_remove_tree(g_dir);
    return check_finish();
}
