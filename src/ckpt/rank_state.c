#include "rank_state.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_dir.h"

static void step_dir_of(const char *dir, long long step, char *out, size_t cap) {
    snprintf(out, cap, "%s/rank_state/step_%08lld", dir, step);
}

static dt_status make_dir(const char *path) {
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return dt_fail(DT_ERUNTIME, "checkpoint rank state: cannot create '%s' (%s)", path, strerror(errno));
    return DT_OK;
}

dt_status dt_rank_state_save(const char *dir, long long step, int rank, const char *layout, const st_tensor_ref *t,
                             int n) {
    char d[1100], path[1200];
    snprintf(d, sizeof d, "%s/rank_state", dir);
    DT_TRY(make_dir(d));
    step_dir_of(dir, step, d, sizeof d);
    DT_TRY(make_dir(d));
    snprintf(path, sizeof path, "%s/rank-%05d.safetensors", d, rank);
    const char *keys[] = {"layout"}, *vals[] = {layout};
    return st_write(path, t, n, keys, vals, 1);
}

/* The rank-state directory of the checkpoint that step_dir (DIR/step_N[.vK]) belongs to. */
static void files_of(const char *step_dir, long long step, char *out, size_t cap) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", step_dir);
    for (size_t k = strlen(dir); k > 1 && dir[k - 1] == '/'; k--) dir[k - 1] = 0; /* "ckpt/step_N/" */
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    step_dir_of(dir, step, out, cap);
}

int dt_rank_state_present(const char *step_dir, long long step) {
    char d[1100];
    struct stat sb;
    files_of(step_dir, step, d, sizeof d);
    return stat(d, &sb) == 0 && S_ISDIR(sb.st_mode);
}

dt_status dt_rank_state_open_from(const char *step_dir, long long step, int from, st_file *f, const char **layout) {
    char d[1100], path[1200];
    files_of(step_dir, step, d, sizeof d);
    snprintf(path, sizeof path, "%s/rank-%05d.safetensors", d, from);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dt_fail(DT_EINPUT, "checkpoint '%s': no rank state for rank %d (%s): it was saved by a run without "
                       "this mode's per-rank state, or by fewer ranks", step_dir, from, path);
    DT_TRY(st_open(f, path));
    *layout = st_metadata(f, "layout");
    if (*layout) return DT_OK;
    st_close(f);
    return dt_fail(DT_EINPUT, "%s: no layout in its metadata", path);
}

dt_status dt_rank_state_open(const char *step_dir, long long step, int rank, const char *layout, st_file *f) {
    const char *saved;
    DT_TRY(dt_rank_state_open_from(step_dir, step, rank, f, &saved));
    if (!saved || strcmp(saved, layout) != 0) {
        dt_status s = dt_fail(DT_EINPUT, "checkpoint '%s': its per-rank state belongs to the layout '%s', this run is "
                              "'%s' (resume it with the same layout and mode)", step_dir, saved ? saved : "?", layout);
        st_close(f);
        return s;
    }
    return DT_OK;
}

static dt_status read_as(st_file *f, const char *name, st_dtype t, void *dst, size_t n) {
    const st_entry *e = st_find(f, name);
    if (!e || e->dtype != t || e->end - e->begin != n * st_dtype_size(t))
        return dt_fail(DT_EINPUT, "%s: tensor '%s' missing or not %zu %s values", f->path, name, n, st_dtype_name(t));
    return st_read(f, e, dst, n * st_dtype_size(t));
}

dt_status dt_rank_state_read(st_file *f, const char *name, float *dst, size_t n) {
    DT_TRY(read_as(f, name, ST_F32, dst, n));
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i])) return dt_fail(DT_EINPUT, "%s: tensor '%s' holds NaN or Inf", f->path, name);
    return DT_OK;
}

dt_status dt_rank_state_read_f64(st_file *f, const char *name, double *dst, size_t n) {
    DT_TRY(read_as(f, name, ST_F64, dst, n));
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i])) return dt_fail(DT_EINPUT, "%s: tensor '%s' holds NaN or Inf", f->path, name);
    return DT_OK;
}

void dt_rank_state_clear(const char *dir, long long step) {
    char d[1100];
    step_dir_of(dir, step, d, sizeof d);
    dt_ckpt_remove_flat_dir(d);
}

void dt_rank_state_prune(const char *dir) {
    char root[1100];
    snprintf(root, sizeof root, "%s/rank_state", dir);
    DIR *dp = opendir(root);
    if (!dp) return;
    char (*names)[64] = NULL;
    long long *steps = NULL;
    int count = 0;
    if (dt_ckpt_list_steps(dir, &names, &steps, &count) != DT_OK) {
        dt_error_clear();
        closedir(dp);
        return;
    }
    long long newest = -1; /* a step above it may be a save under way (other ranks write first) */
    for (int i = 0; i < count; i++) newest = steps[i] > newest ? steps[i] : newest;
    struct dirent *ent;
    while ((ent = readdir(dp))) {
        long long step = dt_ckpt_step_of(ent->d_name);
        if (step < 0 || step >= newest) continue;
        int kept = 0;
        for (int i = 0; i < count && !kept; i++) kept = steps[i] == step;
        if (kept) continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", root, ent->d_name);
        dt_ckpt_remove_flat_dir(path);
    }
    closedir(dp);
    free(names);
    free(steps);
}
