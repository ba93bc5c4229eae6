#include "ckpt_verify.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/config.h"
#include "checkpoint.h"
#include "ckpt_dir.h"

static int g_report = 1;
static struct {
    int valid;
    char path[1100], step_dir[1100];
} g_kept;

void dt_ckpt_resolve_report(int on) { g_report = on; }
void dt_ckpt_resolve_forget(void) { g_kept.valid = 0; }

/* The last component of a path, trailing slashes ignored ("a/step_1/" -> "step_1"). */
static void base_name(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(n - b), path + b);
}

dt_status dt_ckpt_verify_step(const char *step_dir) {
    dt_train_state st;
    char *cfg = NULL, name[256];
    DT_TRY(dt_ckpt_load_state(step_dir, &st, &cfg));
    free(cfg);
    base_name(step_dir, name, sizeof name);
    long long named = dt_ckpt_step_of(name);
    if (named >= 0 && named != st.step)
        return dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json is at step %lld, but the directory is named for "
                       "step %lld (a copied or edited file?)", step_dir, st.step, named);
    dt_config c;
    DT_TRY(dt_ckpt_load_config(step_dir, &c));
    DT_TRY(dt_ckpt_check_tensors(step_dir, "model", 1));
    return dt_ckpt_check_tensors(step_dir, "optimizer", 0);
}

/* The current error message without the step directory's own path (a warning names it
 * once): "checkpoint 'D': x" -> "x", "D/model.safetensors: x" -> "model.safetensors: x". */
static void reason_in(const char *step_dir, char *out, size_t cap) {
    const char *m = dt_error_message();
    char pre[1200], dslash[1200];
    snprintf(pre, sizeof pre, "checkpoint '%s': ", step_dir);
    snprintf(dslash, sizeof dslash, "%s/", step_dir);
    if (!strncmp(m, pre, strlen(pre))) m += strlen(pre);
    size_t n = 0, dl = strlen(dslash);
    while (*m && n + 1 < cap) {
        if (!strncmp(m, dslash, dl)) {
            m += dl;
            continue;
        }
        out[n++] = *m++;
    }
    out[n] = 0;
    dt_error_clear();
}

typedef struct {
    char name[256];
    char reason[600];
} skipped;

/* DIR holds `latest` or step directories: the newest intact step (see the header). */
static dt_status resolve_saves(const char *dir, char *step_dir, size_t cap) {
    char (*names)[64] = NULL, latest[256] = "", p[1200];
    long long *steps = NULL;
    int n = 0, nskip = 0;
    skipped *skip = NULL;
    struct stat sb;
    snprintf(p, sizeof p, "%s/latest", dir);
    int has_latest = lstat(p, &sb) == 0;
    char latest_err[600] = "";
    if (has_latest && dt_ckpt_read_latest(dir, latest, sizeof latest) != DT_OK) {
        snprintf(latest_err, sizeof latest_err, "%s", dt_error_message());
        dt_error_clear();
        latest[0] = 0;
    }
    dt_status s = dt_ckpt_list_steps(dir, &names, &steps, &n);
    if (s == DT_OK && !(skip = calloc((size_t)n + 2, sizeof *skip))) s = dt_fail(DT_ERUNTIME, "out of memory");
    if (s != DT_OK) goto out;
    /* the order tried: the step `latest` names, then the older steps newest first; steps
     * above it are a later save's, never committed. Other copies of latest's step are not
     * tried while it is there: a run resuming retires them (dt_ckpt_prepare_dir). */
    long long limit = LLONG_MAX; /* steps below it are tried */
    if (latest[0]) {
        snprintf(p, sizeof p, "%s/%s", dir, latest);
        long long ls = dt_ckpt_step_of(latest);
        if (ls >= 0) limit = stat(p, &sb) == 0 && S_ISDIR(sb.st_mode) ? ls : ls + 1;
        if (dt_ckpt_verify_step(p) == DT_OK) goto found;
        snprintf(skip[nskip].name, sizeof skip[nskip].name, "%s", latest);
        reason_in(p, skip[nskip].reason, sizeof skip[nskip].reason);
        nskip++;
    } else if (has_latest) {
        snprintf(skip[nskip].name, sizeof skip[nskip].name, "latest");
        snprintf(skip[nskip].reason, sizeof skip[nskip].reason, "%s", latest_err);
        nskip++;
    }
    for (int i = 0; i < n; i++) {
        if (steps[i] >= limit || !strcmp(names[i], latest)) continue;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (dt_ckpt_verify_step(p) == DT_OK) {
            snprintf(latest, sizeof latest, "%s", names[i]);
            goto found;
        }
        snprintf(skip[nskip].name, sizeof skip[nskip].name, "%s", names[i]);
        reason_in(p, skip[nskip].reason, sizeof skip[nskip].reason);
        nskip++;
    }
    if (nskip == 0)
        s = dt_fail(DT_EINPUT, "checkpoint '%s': no step directory to resume from", dir);
    else if (nskip == 1)
        s = dt_fail(DT_EINPUT, "checkpoint '%s': %s is damaged and no older step is intact: %s", dir, skip[0].name,
                    skip[0].reason);
    else
        s = dt_fail(DT_EINPUT, "checkpoint '%s': no step is intact; the newest, %s: %s (and %d older one%s damaged too)",
                    dir, skip[0].name, skip[0].reason, nskip - 1, nskip > 2 ? "s" : "");
    goto out;
found:
    if (snprintf(step_dir, cap, "%s/%s", dir, latest) >= (int)cap)
        s = dt_fail(DT_EINPUT, "checkpoint '%.64s...': path too long", dir);
    for (int i = 0; s == DT_OK && g_report && i < nskip; i++)
        fprintf(stderr, "dtrain: warning: checkpoint %s/%s skipped: %s; falling back to %s\n", dir, skip[i].name,
                skip[i].reason, latest);
out:
    free(names);
    free(steps);
    free(skip);
    return s;
}

dt_status dt_ckpt_resolve(const char *path, char *step_dir, size_t cap) {
    if (g_kept.valid && !strcmp(g_kept.path, path)) {
        snprintf(step_dir, cap, "%s", g_kept.step_dir);
        return DT_OK;
    }
    char p[1200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/trainer_state.json", path);
    if (stat(p, &sb) == 0) { /* a step directory: this one or none */
        DT_TRY(dt_ckpt_verify_step(path));
        if (snprintf(step_dir, cap, "%s", path) >= (int)cap)
            return dt_fail(DT_EINPUT, "checkpoint '%.64s...': path too long", path);
    } else {
        snprintf(p, sizeof p, "%s/latest", path);
        char (*names)[64] = NULL;
        long long *steps = NULL;
        int n = 0;
        if (lstat(p, &sb) != 0 && (dt_ckpt_list_steps(path, &names, &steps, &n) != DT_OK || n == 0)) {
            dt_error_clear();
            free(names);
            free(steps);
            return dt_fail(DT_EINPUT, "checkpoint '%s': no trainer_state.json and no 'latest' file", path);
        }
        free(names);
        free(steps);
        DT_TRY(resolve_saves(path, step_dir, cap));
    }
    if (strlen(path) < sizeof g_kept.path && strlen(step_dir) < sizeof g_kept.step_dir) {
        snprintf(g_kept.path, sizeof g_kept.path, "%s", path);
        snprintf(g_kept.step_dir, sizeof g_kept.step_dir, "%s", step_dir);
        g_kept.valid = 1;
    }
    return DT_OK;
}
