/* Writing a step's tensor files: which file each tensor goes to (checkpoint.shard_mb),
 * the files themselves from unit views or a streamed source, and the one-writer saves
 * (dt_ckpt_save, dt_ckpt_save_stream) that write and then commit (ckpt_commit.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_dir.h"
#include "ckpt_internal.h"
#include "safetensors.h"

static void tensor_shape(const gpt_tensor *t, int *ndim, int64_t shape[8]) {
    memset(shape, 0, 8 * sizeof(int64_t));
    *ndim = t->ndim;
    shape[0] = t->saved_rows;
    if (t->ndim > 1) shape[1] = t->shape[1];
}

/* A pipeline stage's copy of a tied tensor (wte on a last stage without the embeddings):
 * the first stage's is the same, and only that one is saved. */
static int tied_copy(const gpt_model *m, const gpt_tensor *t) { return t->unit == 0 && !m->has_embed; }

/* Which of this writer's files each tensor goes to (-1: not saved); returns the count. */
int ckpt_plan_files(const gpt_model *m, double shard_mb, int *file_of) {
    uint64_t limit = shard_mb > 0 ? (uint64_t)(shard_mb * 1048576.0) : 0, cur = 0;
    if (shard_mb > 0 && limit == 0) limit = 1;
    int nf = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        if (tied_copy(m, t)) {
            if (file_of) file_of[i] = -1;
            continue;
        }
        uint64_t b = (uint64_t)ckpt_saved_numel(t) * sizeof(float);
        if (nf == 0 || (limit && cur > 0 && cur + b > limit)) {
            nf++;
            cur = 0;
        }
        if (file_of) file_of[i] = nf - 1;
        cur += b;
    }
    return nf;
}

int dt_ckpt_count_files(const gpt_model *m, double shard_mb) { return ckpt_plan_files(m, shard_mb, NULL); }

/* File k (0-based) of total: "model.safetensors" alone, else Hugging Face's shard names. */
void ckpt_file_name(char *buf, size_t cap, const char *kind, int k, int total) {
    if (total <= 1) snprintf(buf, cap, "%s.safetensors", kind);
    else snprintf(buf, cap, "%s-%05d-of-%05d.safetensors", kind, k + 1, total);
}

/* Where the tensors being written come from: unit views (one base pointer per unit for
 * each set: 0 weights, 1 exp_avg, 2 exp_avg_sq), or a source asked for each in turn (a
 * streamed save); pos counts the source's calls, in the order write_files makes them. */
typedef struct {
    const gpt_model *m;
    float *const *views[3];
    const dt_ckpt_source *src;
    long pos;
    int failed; /* a call of the source failed: no more are made */
    /* the file being written: its tensors' sets and table indices, in data order */
    const int *set, *idx;
} feed;

static dt_status feed_get(void *ctx, int k, const void **data) {
    feed *f = ctx;
    if (!f->src) {
        *data = ckpt_in_view(f->m, f->views[f->set[k]], f->idx[k]);
        return DT_OK;
    }
    const float *p = NULL;
    f->pos++;
    dt_status s = f->src->get(f->src->ctx, f->set[k], f->idx[k], &p);
    if (s != DT_OK) f->failed = 1;
    *data = p;
    return s;
}

/* Writes sets [set0, set0 + nsets) of the tensors of file k (file_of) into one file, named
 * with prefixes (e.g. exp_avg.* then exp_avg_sq.*), each set in table order. */
static dt_status write_sets(const char *path, feed *fd, int set0, const char *const *prefixes, int nsets,
                            const int *file_of, int k_file) {
    const gpt_model *m = fd->m;
    int n = 0;
    size_t cap = (size_t)m->ntensors * (size_t)nsets;
    st_tensor_ref *refs = calloc(cap, sizeof *refs);
    char (*names)[96] = calloc(cap, sizeof *names);
    int *set = calloc(cap, sizeof *set), *idx = calloc(cap, sizeof *idx);
    dt_status s = DT_OK;
    if (!refs || !names || !set || !idx) s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint)");
    for (int k = 0; s == DT_OK && k < nsets; k++)
        for (int i = 0; i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            if (file_of[i] != k_file) continue;
            snprintf(names[n], sizeof names[n], "%s%s", prefixes[k], t->name);
            refs[n].name = names[n];
            refs[n].dtype = ST_F32;
            tensor_shape(t, &refs[n].ndim, refs[n].shape);
            set[n] = set0 + k;
            idx[n] = i;
            n++;
        }
    const char *keys[] = {"format"}, *vals[] = {"pt"};
    fd->set = set;
    fd->idx = idx;
    if (s == DT_OK) s = st_write_fetch(path, refs, n, keys, vals, 1, feed_get, fd);
    free(refs);
    free(names);
    free(set);
    free(idx);
    return s;
}

static dt_status write_files(const char *tmp, feed *fd, int moments, int first, int total, double shard_mb) {
    const gpt_model *m = fd->m;
    int *file_of = malloc((size_t)m->ntensors * sizeof(int) + 1);
    if (!file_of) return dt_fail(DT_ERUNTIME, "out of memory (checkpoint)");
    int nf = ckpt_plan_files(m, shard_mb, file_of);
    dt_status s = DT_OK;
    if (first < 0 || first + nf > total)
        s = dt_fail(DT_ERUNTIME, "checkpoint: files %d..%d of %d do not exist", first + 1, first + nf, total);
    char name[64], path[1200];
    const char *wpre[] = {""};
    const char *opre[] = {"exp_avg.", "exp_avg_sq."};
    for (int k = 0; s == DT_OK && k < nf; k++) {
        ckpt_file_name(name, sizeof name, "model", first + k, total);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        s = write_sets(path, fd, 0, wpre, 1, file_of, k);
        if (s == DT_OK && moments) {
            ckpt_file_name(name, sizeof name, "optimizer", first + k, total);
            snprintf(path, sizeof path, "%s/%s", tmp, name);
            s = write_sets(path, fd, 1, opre, 2, file_of, k);
        }
    }
    free(file_of);
    return s;
}

dt_status dt_ckpt_write_files(const char *tmp, const gpt_model *m, float *const *exp_avg, float *const *exp_avg_sq,
                              int first, int total, double shard_mb) {
    feed fd = {.m = m, .views = {m->unit_params, exp_avg, exp_avg_sq}};
    return write_files(tmp, &fd, exp_avg != NULL, first, total, shard_mb);
}

/* The source's calls from position fd->pos on, in the order write_files makes them (file
 * by file: the weights, then exp_avg and exp_avg_sq), with nothing written: a rank that
 * does not write, or the writer after a failed write, so the collectives behind the
 * source stay matched across the ranks. */
static dt_status walk_rest(feed *fd, double shard_mb) {
    const gpt_model *m = fd->m;
    int *file_of = malloc((size_t)m->ntensors * sizeof(int) + 1);
    if (!file_of) return dt_fail(DT_ERUNTIME, "out of memory (checkpoint)");
    int nf = ckpt_plan_files(m, shard_mb, file_of), nsets = fd->src->moments ? 3 : 1;
    long pos = 0;
    dt_status s = DT_OK;
    for (int k = 0; k < nf && s == DT_OK && !fd->failed; k++)
        for (int set = 0; set < nsets && s == DT_OK; set++)
            for (int i = 0; i < m->ntensors && s == DT_OK; i++) {
                if (file_of[i] != k || pos++ < fd->pos) continue;
                const float *p;
                s = fd->src->get(fd->src->ctx, set, i, &p);
            }
    free(file_of);
    return s;
}

/* One writer: its files, the index when they are more than one, the commit. */
dt_status dt_ckpt_save(const char *dir, const gpt_model *m, float *const *exp_avg, float *const *exp_avg_sq,
                       const dt_train_state *st, const char *config_json, double shard_mb) {
    char tmp[1024];
    DT_TRY(dt_ckpt_begin(dir, st->step, (int)getpid(), tmp, sizeof tmp));
    int total = dt_ckpt_count_files(m, shard_mb), first = 0;
    dt_status s = dt_ckpt_write_files(tmp, m, exp_avg, exp_avg_sq, 0, total, shard_mb);
    if (s == DT_OK && total > 1) s = dt_ckpt_write_index(tmp, &m, &first, 1, total, shard_mb, exp_avg != NULL);
    if (s == DT_OK && dt_ckpt_test_fail("write", st->step))
        s = dt_fail(DT_ERUNTIME, "checkpoint '%s': files could not be written (test hook DT_TEST_FAIL_AT)", tmp);
    if (s != DT_OK) {
        dt_ckpt_abort(tmp);
        return s;
    }
    return dt_ckpt_commit(dir, tmp, st, config_json);
}

dt_status dt_ckpt_save_stream(const char *dir, const gpt_model *m, const dt_ckpt_source *src, int writer,
                              const dt_train_state *st, const char *config_json, double shard_mb) {
    feed fd = {.m = m, .src = src};
    char tmp[1024];
    int begun = 0;
    dt_status s = DT_OK;
    if (writer) {
        s = dt_ckpt_begin(dir, st->step, (int)getpid(), tmp, sizeof tmp);
        begun = s == DT_OK;
        int total = dt_ckpt_count_files(m, shard_mb), first = 0;
        if (s == DT_OK) s = write_files(tmp, &fd, src->moments, 0, total, shard_mb);
        if (s == DT_OK && total > 1) s = dt_ckpt_write_index(tmp, &m, &first, 1, total, shard_mb, src->moments);
        if (s == DT_OK && dt_ckpt_test_fail("write", st->step))
            s = dt_fail(DT_ERUNTIME, "checkpoint '%s': files could not be written (test hook DT_TEST_FAIL_AT)", tmp);
    }
    dt_status w = walk_rest(&fd, shard_mb); /* nothing left on a writer that wrote everything */
    if (s == DT_OK) s = w;
    if (!writer) return s;
    if (s != DT_OK) {
        if (begun) dt_ckpt_abort(tmp);
        return s;
    }
    return dt_ckpt_commit(dir, tmp, st, config_json);
}
