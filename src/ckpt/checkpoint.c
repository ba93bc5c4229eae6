#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/atomic_file.h"
#include "ckpt_dir.h"
#include "safetensors.h"

/* trainer_state.json's "format": a file without it is not one of ours */
#define DT_CKPT_FORMAT "dtrain-checkpoint-v1"

static int64_t saved_numel(const gpt_tensor *t) { return (int64_t)t->saved_rows * t->shape[1]; }

static void tensor_shape(const gpt_tensor *t, int *ndim, int64_t shape[8]) {
    memset(shape, 0, 8 * sizeof(int64_t));
    *ndim = t->ndim;
    shape[0] = t->saved_rows;
    if (t->ndim > 1) shape[1] = t->shape[1];
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Tensor i inside a unit view (one base pointer per model unit, as in gpt_model.unit_params). */
static float *in_view(const gpt_model *m, float *const *units, int i) {
    const gpt_tensor *t = &m->tensors[i];
    return units[t->unit] + (t->offset - m->units[t->unit].offset);
}

/* A pipeline stage's copy of a tied tensor (wte on a last stage without the embeddings):
 * the first stage's is the same, and only that one is saved. */
static int tied_copy(const gpt_model *m, const gpt_tensor *t) { return t->unit == 0 && !m->has_embed; }

/* Which of this writer's files each tensor goes to (-1: not saved); returns the count. */
static int plan_files(const gpt_model *m, double shard_mb, int *file_of) {
    uint64_t limit = shard_mb > 0 ? (uint64_t)(shard_mb * 1048576.0) : 0, cur = 0;
    if (shard_mb > 0 && limit == 0) limit = 1;
    int nf = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        if (tied_copy(m, t)) {
            if (file_of) file_of[i] = -1;
            continue;
        }
        uint64_t b = (uint64_t)saved_numel(t) * sizeof(float);
        if (nf == 0 || (limit && cur > 0 && cur + b > limit)) {
            nf++;
            cur = 0;
        }
        if (file_of) file_of[i] = nf - 1;
        cur += b;
    }
    return nf;
}

int dt_ckpt_count_files(const gpt_model *m, double shard_mb) { return plan_files(m, shard_mb, NULL); }

/* File k (0-based) of total: "model.safetensors" alone, else Hugging Face's shard names. */
static void file_name(char *buf, size_t cap, const char *kind, int k, int total) {
    if (total <= 1) snprintf(buf, cap, "%s.safetensors", kind);
    else snprintf(buf, cap, "%s-%05d-of-%05d.safetensors", kind, k + 1, total);
}

dt_status dt_ckpt_check_files(const char *tmp, int total, int optimizer) {
    char name[64], path[1200];
    struct stat sb;
    for (int kind = 0; kind < 1 + (optimizer != 0); kind++)
        for (int k = 0; k < total; k++) {
            file_name(name, sizeof name, kind ? "optimizer" : "model", k, total);
            snprintf(path, sizeof path, "%s/%s", tmp, name);
            if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
                return dt_fail(DT_ERUNTIME, "checkpoint '%s': another stage's '%s' is not there (checkpoint.dir must "
                               "be one file system for every writer, shared across hosts)", tmp, name);
        }
    return DT_OK;
}

/* Where the tensors being written come from: unit views (one base pointer per unit for
 * each set: 0 weights, 1 exp_avg, 2 exp_avg_sq), or a source asked for each in turn (a
 * streamed save); pos counts the source's calls, in the order of walk_order. */
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
        *data = in_view(f->m, f->views[f->set[k]], f->idx[k]);
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
    int nf = plan_files(m, shard_mb, file_of);
    dt_status s = DT_OK;
    if (first < 0 || first + nf > total)
        s = dt_fail(DT_ERUNTIME, "checkpoint: files %d..%d of %d do not exist", first + 1, first + nf, total);
    char name[64], path[1200];
    const char *wpre[] = {""};
    const char *opre[] = {"exp_avg.", "exp_avg_sq."};
    for (int k = 0; s == DT_OK && k < nf; k++) {
        file_name(name, sizeof name, "model", first + k, total);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        s = write_sets(path, fd, 0, wpre, 1, file_of, k);
        if (s == DT_OK && moments) {
            file_name(name, sizeof name, "optimizer", first + k, total);
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
    int nf = plan_files(m, shard_mb, file_of), nsets = fd->src->moments ? 3 : 1;
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

/* ---- model.safetensors.index.json, as transformers' save_pretrained writes it:
 * json.dumps({"metadata": {"total_size": bytes}, "weight_map": {name: file}},
 * indent=2, sort_keys=True) + "\n"; total_size counts the tensors' bytes. */
typedef struct {
    char name[128];
    int file;
} index_row;

static int cmp_row(const void *a, const void *b) { return strcmp(((const index_row *)a)->name, ((const index_row *)b)->name); }

static dt_status write_one_index(const char *tmp, const char *kind, index_row *rows, int n, int total,
                                 uint64_t total_size) {
    qsort(rows, (size_t)n, sizeof *rows, cmp_row);
    for (int i = 1; i < n; i++)
        if (!strcmp(rows[i - 1].name, rows[i].name))
            return dt_fail(DT_ERUNTIME, "checkpoint: tensor '%s' is written by two pipeline stages", rows[i].name);
    size_t cap = 256 + (size_t)n * 200, len = 0;
    char *buf = malloc(cap), fname[64];
    if (!buf) return dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
    len += (size_t)snprintf(buf + len, cap - len, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n"
                            "  \"weight_map\": {\n", total_size);
    for (int i = 0; i < n; i++) {
        file_name(fname, sizeof fname, kind, rows[i].file, total); /* names are [a-z0-9._]: no escaping */
        len += (size_t)snprintf(buf + len, cap - len, "    \"%s\": \"%s\"%s\n", rows[i].name, fname,
                                i + 1 < n ? "," : "");
    }
    len += (size_t)snprintf(buf + len, cap - len, "  }\n}\n");
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", tmp, kind);
    dt_status s = dt_write_file_atomic(path, buf, len);
    free(buf);
    return s;
}

dt_status dt_ckpt_write_index(const char *tmp, const gpt_model *const *stages, const int *first, int nstages,
                              int total, double shard_mb, int moments) {
    int n = 0, cap = 0;
    for (int q = 0; q < nstages; q++) cap += stages[q]->ntensors;
    index_row *rows = calloc((size_t)cap + 1, sizeof *rows);
    int *file_of = NULL;
    uint64_t bytes = 0;
    dt_status s = rows ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
    for (int q = 0; s == DT_OK && q < nstages; q++) {
        const gpt_model *m = stages[q];
        int *f = realloc(file_of, (size_t)m->ntensors * sizeof(int) + 1);
        if (!f) {
            s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
            break;
        }
        file_of = f;
        int nf = plan_files(m, shard_mb, file_of);
        if (first[q] < 0 || first[q] + nf > total) s = dt_fail(DT_ERUNTIME, "checkpoint index: bad file numbers");
        for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
            if (file_of[i] < 0) continue;
            snprintf(rows[n].name, sizeof rows[n].name, "%s", m->tensors[i].name);
            rows[n++].file = first[q] + file_of[i];
            bytes += (uint64_t)saved_numel(&m->tensors[i]) * sizeof(float);
        }
    }
    free(file_of);
    if (s == DT_OK) s = write_one_index(tmp, "model", rows, n, total, bytes);
    if (s == DT_OK && moments) {
        index_row *o = calloc((size_t)n * 2 + 1, sizeof *o); /* exp_avg.X and exp_avg_sq.X in X's file */
        if (!o) s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
        for (int i = 0; s == DT_OK && i < n; i++) {
            snprintf(o[2 * i].name, sizeof o[2 * i].name, "exp_avg.%.100s", rows[i].name);
            snprintf(o[2 * i + 1].name, sizeof o[2 * i + 1].name, "exp_avg_sq.%.100s", rows[i].name);
            o[2 * i].file = o[2 * i + 1].file = rows[i].file;
        }
        if (s == DT_OK) s = write_one_index(tmp, "optimizer", o, 2 * n, total, 2 * bytes);
        free(o);
    }
    free(rows);
    return s;
}

static char *state_json(const dt_train_state *st, const char *config_json) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", DT_CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "step", (double)st->step);
    cJSON *data = cJSON_AddObjectToObject(root, "data");
    cJSON_AddNumberToObject(data, "epoch", (double)st->data_epoch);
    cJSON_AddNumberToObject(data, "pos", (double)st->data_pos);
    cJSON *rng = cJSON_AddArrayToObject(root, "rng");
    for (int i = 0; i < 4; i++) {
        char hex[24];
        snprintf(hex, sizeof hex, "%016" PRIx64, st->rng.s[i]);
        cJSON_AddItemToArray(rng, cJSON_CreateString(hex));
    }
    cJSON *cfg = config_json ? cJSON_Parse(config_json) : NULL;
    if (cfg) cJSON_AddItemToObject(root, "config", cfg);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

/* The temporary step directory of a save (the commit protocol: see dt_ckpt_save). */
void dt_ckpt_tmp_name(const char *dir, long long step, int pid, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s/.step_%08lld.tmp.%d", dir, step, pid);
}

dt_status dt_ckpt_begin(const char *dir, long long step, int pid, char *tmp, size_t cap) {
    dt_ckpt_tmp_name(dir, step, pid, tmp, cap);
    dt_ckpt_remove_flat_dir(tmp); /* our own pid's leftover (pid reuse in containers) */
    if (mkdir(tmp, 0777) != 0)
        return dt_fail(DT_ERUNTIME, "checkpoint '%s': cannot create (%s)", tmp, strerror(errno));
    return DT_OK;
}

void dt_ckpt_abort(const char *tmp) { dt_ckpt_remove_flat_dir(tmp); }

/* Each file of a step (every writer's shards, the indexes) is complete and fsynced when
 * this runs; a crash before the rename (any writer's) leaves only the temporary directory. */
dt_status dt_ckpt_commit(const char *dir, const char *tmp, const dt_train_state *st, const char *config_json) {
    char name[64], final[1100], path[1200];
    dt_status s;
    char *js = state_json(st, config_json);
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    s = js ? dt_write_file_atomic(path, js, strlen(js)) : dt_fail(DT_ERUNTIME, "out of memory (state)");
    free(js);
    if (s == DT_OK) s = dt_fsync_dir(tmp);
    if (s == DT_OK) dt_ckpt_test_crash("tmp", st->step);
    if (s == DT_OK) s = dt_ckpt_fresh_name(dir, st->step, name, sizeof name);
    if (s == DT_OK) {
        snprintf(final, sizeof final, "%s/%s", dir, name);
        if (rename(tmp, final) != 0)
            s = dt_fail(DT_ERUNTIME, "checkpoint '%s': cannot rename into place (%s)", final, strerror(errno));
    }
    if (s != DT_OK) {
        dt_ckpt_remove_flat_dir(tmp);
        return s;
    }
    DT_TRY(dt_fsync_dir(dir));
    dt_ckpt_test_crash("renamed", st->step);
    char latest[1024], line[80];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", name);
    dt_atomic_file f;
    DT_TRY(dt_atomic_open(&f, latest));
    s = dt_atomic_write(&f, line, strlen(line));
    if (s == DT_OK) dt_ckpt_test_crash("latest_tmp", st->step);
    if (s == DT_OK) s = dt_atomic_commit(&f);
    else dt_atomic_abort(&f);
    DT_TRY(s);
    dt_ckpt_test_crash("latest", st->step);
    return dt_ckpt_retire_copies(dir, st->step, name);
}

/* Commit protocol. A new copy never takes the name of an existing directory, and a
 * directory is removed only once `latest` names its replacement, so at every instant
 * `latest` names a complete step directory. Crash points (the DT_TEST_CRASH_AT names)
 * and what a kill there leaves:
 *   "shard"       (several writers: a writer other than the root, its files written, the
 *                 others' maybe not) .step_N.tmp.PID/ incomplete: a leftover; `latest` unchanged
 *   "tmp"         .step_N.tmp.PID/ complete, not renamed: a leftover; `latest` unchanged
 *   "renamed"     the new directory in place under a fresh name; `latest` still names
 *                 the previous step (which resume uses; step N is then saved again)
 *   "latest_tmp"  latest.tmp.PID written, not renamed: a leftover; `latest` unchanged
 *   "latest"      `latest` names the new copy; a superseded copy of step N remains
 *   "retire"      a superseded copy moved to .<name>.old.PID, not yet deleted
 * Leftovers are removed by the next run's dt_ckpt_prepare_dir. */
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

/* A non-negative integer field (JSON numbers are doubles: 2.5 or 1e300 are not steps). */
static dt_status json_uint(const char *step_dir, const cJSON *o, const char *key, double max, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json: '%s' is missing or not a number", step_dir,
                       key);
    double x = v->valuedouble;
    if (!(x >= 0 && x <= max && x == floor(x)))
        return dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json: '%s' = %.17g is not an integer in [0, %.0f]",
                       step_dir, key, x, max);
    *out = x;
    return DT_OK;
}

dt_status dt_ckpt_load_state(const char *step_dir, dt_train_state *st, char **config_json) {
    char p[1100];
    snprintf(p, sizeof p, "%s/trainer_state.json", step_dir);
    char *txt = NULL;
    size_t len = 0;
    DT_TRY(dt_read_file(p, &txt, &len, 16u << 20));
    const char *end = NULL;
    cJSON *root = strlen(txt) == len ? cJSON_ParseWithOpts(txt, &end, 0) : NULL;
    if (root) {
        while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
        if (*end) { /* a valid object followed by more: not what we wrote */
            cJSON_Delete(root);
            root = NULL;
        }
    }
    free(txt);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json is not one valid JSON object", step_dir);
    }
    dt_status s = DT_OK;
    double step = 0, epoch = 0, pos = 0;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, DT_CKPT_FORMAT) != 0)
        s = dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json: format %s%s%s is not %s (not a dtrain "
                    "checkpoint, or one this version cannot read)", step_dir, cJSON_IsString(fmt) ? "'" : "",
                    cJSON_IsString(fmt) ? fmt->valuestring : "missing", cJSON_IsString(fmt) ? "'" : "", DT_CKPT_FORMAT);
    if (s == DT_OK) s = json_uint(step_dir, root, "step", 2147483647.0, &step);
    if (s == DT_OK && !cJSON_IsObject(data))
        s = dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json lacks the data position", step_dir);
    if (s == DT_OK) s = json_uint(step_dir, data, "epoch", 9.0e15, &epoch);
    if (s == DT_OK) s = json_uint(step_dir, data, "pos", 9.0e15, &pos);
    if (s == DT_OK && (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4))
        s = dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json: bad rng state", step_dir);
    if (s == DT_OK) {
        st->step = (long long)step;
        st->data_epoch = (long long)epoch;
        st->data_pos = (uint64_t)pos;
        for (int i = 0; i < 4 && s == DT_OK; i++) {
            const cJSON *h = cJSON_GetArrayItem(rng, i);
            char *e2 = NULL;
            if (!cJSON_IsString(h) || strlen(h->valuestring) != 16 || !isxdigit((unsigned char)h->valuestring[0])) {
                s = dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json: bad rng state", step_dir);
                break;
            }
            st->rng.s[i] = strtoull(h->valuestring, &e2, 16);
            if (*e2) s = dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json: bad rng state", step_dir);
        }
    }
    if (s == DT_OK && config_json) {
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
        *config_json = cJSON_IsObject(cfg) ? cJSON_PrintUnformatted(cfg) : NULL;
        if (!*config_json) s = dt_fail(DT_EINPUT, "checkpoint '%s': trainer_state.json has no config", step_dir);
    }
    cJSON_Delete(root);
    return s;
}

dt_status dt_ckpt_load_config(const char *step_dir, dt_config *c) {
    dt_train_state st;
    char *js = NULL, origin[1100];
    DT_TRY(dt_ckpt_load_state(step_dir, &st, &js));
    dt_config_defaults(c);
    snprintf(origin, sizeof origin, "checkpoint '%s' config", step_dir);
    dt_status s = dt_config_load_json(c, js, origin);
    free(js);
    return s;
}

/* ---- Loading. A checkpoint's tensors (weights, or moments) are one safetensors file or
 * the files a Hugging Face index names; both are untrusted input. They are validated whole
 * before any data is read: the index (JSON, a weight_map of plain file names, its
 * total_size), every file's header (st_open), each tensor in exactly the file the index
 * maps it to; then names and shapes against the model. */
typedef struct {
    char name[128]; /* the model's names with a moment prefix are < 64 bytes */
    int file;       /* index into src.paths */
    int found;      /* seen in its file */
    uint64_t bytes;
} src_entry;

typedef struct {
    char where[1100];    /* what errors name: the single file, or the index */
    char dir[1100];      /* an index's directory ("" for a single file) */
    char single[1100];   /* the single file's path */
    int nfiles;
    char (*paths)[256];  /* an index's files: names in dir */
    int n;
    src_entry *e;        /* sorted by name */
} ckpt_src;

/* Bounds on what an index may make us allocate (GPT-2 sizes have < 13000 tensors; the
 * index of a 1024-layer model's optimizer is about 2 MiB). */
#define DT_INDEX_MAX_BYTES (16u << 20)
#define DT_INDEX_MAX_TENSORS 100000
#define DT_INDEX_MAX_FILES 100000

static const char *src_path(const ckpt_src *c, int k, char *buf, size_t cap) {
    if (!c->dir[0]) return c->single;
    snprintf(buf, cap, "%s/%s", c->dir, c->paths[k]);
    return buf;
}

static void src_free(ckpt_src *c) {
    free(c->paths);
    free(c->e);
    memset(c, 0, sizeof *c);
}

static int cmp_src(const void *a, const void *b) { return strcmp(((const src_entry *)a)->name, ((const src_entry *)b)->name); }

static src_entry *src_find(const ckpt_src *c, const char *name) {
    if (!c->e || strlen(name) >= sizeof c->e[0].name) return NULL;
    src_entry key;
    strcpy(key.name, name);
    return bsearch(&key, c->e, (size_t)c->n, sizeof *c->e, cmp_src);
}

/* One safetensors file. */
static dt_status src_open_file(ckpt_src *c, const char *path) {
    memset(c, 0, sizeof *c);
    snprintf(c->where, sizeof c->where, "%s", path);
    st_file f;
    DT_TRY(st_open(&f, path));
    c->nfiles = 1;
    c->paths = calloc(1, sizeof *c->paths);
    c->e = calloc(f.n ? (size_t)f.n : 1, sizeof *c->e);
    dt_status s = c->paths && c->e ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (checkpoint)");
    if (s == DT_OK) {
        snprintf(c->single, sizeof c->single, "%s", path);
        for (int i = 0; s == DT_OK && i < f.n; i++) { /* st_open sorted them and refused duplicates */
            size_t len = strlen(f.entries[i].name);
            if (len >= sizeof c->e[i].name) { /* no tensor of ours has so long a name */
                s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%.64s...' is not part of this model (another "
                            "model's checkpoint?)", path, f.entries[i].name);
                break;
            }
            memcpy(c->e[i].name, f.entries[i].name, len + 1);
            c->e[i].bytes = f.entries[i].end - f.entries[i].begin;
            c->e[i].found = 1;
        }
        if (s == DT_OK) c->n = f.n;
    }
    st_close(&f);
    if (s != DT_OK) src_free(c);
    return s;
}

/* A file name from an index: a plain name in the index's directory, nothing else. */
static int plain_file_name(const char *f) {
    size_t n = strlen(f);
    if (n == 0 || n >= 256 || !strcmp(f, ".") || strstr(f, "..") || strchr(f, '/') || strchr(f, '\\')) return 0;
    for (const unsigned char *p = (const unsigned char *)f; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return 0;
    return 1;
}

typedef struct {
    const char *file;
    int row;
} file_ref;

static int cmp_file_ref(const void *a, const void *b) {
    int c = strcmp(((const file_ref *)a)->file, ((const file_ref *)b)->file);
    return c ? c : ((const file_ref *)a)->row - ((const file_ref *)b)->row;
}

/* Parses and checks the index, numbering its files (rows of c->e in weight_map order). */
static dt_status index_parse(ckpt_src *c, const char *dir, const cJSON *root, uint64_t *total_size) {
    const char *w = c->where;
    if (!cJSON_IsObject(root)) return dt_fail(DT_EINPUT, "checkpoint index '%s': not a JSON object", w);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) return dt_fail(DT_EINPUT, "checkpoint index '%s': 'weight_map' is missing or not an object", w);
    const cJSON *ts = cJSON_IsObject(meta) ? cJSON_GetObjectItemCaseSensitive(meta, "total_size") : NULL;
    double v = cJSON_IsNumber(ts) ? ts->valuedouble : -1;
    if (!(v >= 0 && v < 9007199254740992.0 && v == floor(v)))
        return dt_fail(DT_EINPUT, "checkpoint index '%s': 'metadata.total_size' is missing or not a byte count", w);
    *total_size = (uint64_t)v;
    int n = cJSON_GetArraySize(map);
    if (n <= 0) return dt_fail(DT_EINPUT, "checkpoint index '%s': 'weight_map' is empty", w);
    if (n > DT_INDEX_MAX_TENSORS)
        return dt_fail(DT_EINPUT, "checkpoint index '%s': 'weight_map' lists %d tensors (at most %d)", w, n,
                       DT_INDEX_MAX_TENSORS);
    c->e = calloc((size_t)n, sizeof *c->e);
    file_ref *refs = calloc((size_t)n, sizeof *refs);
    dt_status s = c->e && refs ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
    int i = 0;
    for (const cJSON *it = map->child; s == DT_OK && it; it = it->next, i++) {
        if (!it->string || !it->string[0] || strlen(it->string) >= sizeof c->e[i].name)
            s = dt_fail(DT_EINPUT, "checkpoint index '%s': a tensor name in 'weight_map' is empty or too long", w);
        else if (!cJSON_IsString(it))
            s = dt_fail(DT_EINPUT, "checkpoint index '%s': tensor '%s' maps to a non-string", w, it->string);
        else if (!plain_file_name(it->valuestring))
            s = dt_fail(DT_EINPUT, "checkpoint index '%s': tensor '%s' maps to '%.80s', not a plain file name in the "
                        "index's directory (a path separator, '..' or a control character)", w, it->string,
                        it->valuestring);
        if (s != DT_OK) break;
        strcpy(c->e[i].name, it->string);
        refs[i].file = it->valuestring;
        refs[i].row = i;
    }
    c->n = s == DT_OK ? n : 0;
    /* number the distinct files (in name order) */
    if (s == DT_OK) qsort(refs, (size_t)n, sizeof *refs, cmp_file_ref);
    int nf = 0;
    for (int k = 0; s == DT_OK && k < n; k++)
        if (k == 0 || strcmp(refs[k].file, refs[k - 1].file)) nf++;
    if (s == DT_OK && nf > DT_INDEX_MAX_FILES)
        s = dt_fail(DT_EINPUT, "checkpoint index '%s': names %d files (at most %d)", w, nf, DT_INDEX_MAX_FILES);
    if (s == DT_OK && !(c->paths = calloc((size_t)nf, sizeof *c->paths)))
        s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    for (int k = 0, f = -1; s == DT_OK && k < n; k++) {
        if (k == 0 || strcmp(refs[k].file, refs[k - 1].file))
            memcpy(c->paths[++f], refs[k].file, strlen(refs[k].file) + 1); /* plain_file_name: < 256 bytes */
        c->e[refs[k].row].file = f;
    }
    if (s == DT_OK) c->nfiles = nf;
    free(refs);
    if (s == DT_OK) { /* sorted by name; cJSON keeps duplicate keys */
        qsort(c->e, (size_t)n, sizeof *c->e, cmp_src);
        for (int k = 1; k < n && s == DT_OK; k++)
            if (!strcmp(c->e[k].name, c->e[k - 1].name))
                s = dt_fail(DT_EINPUT, "checkpoint index '%s': tensor '%s' is listed twice", w, c->e[k].name);
    }
    return s;
}

/* An index and its files: every file's header, each tensor in its mapped file and no other. */
static dt_status src_open_index(ckpt_src *c, const char *index_path) {
    memset(c, 0, sizeof *c);
    snprintf(c->where, sizeof c->where, "%s", index_path);
    char dir[1100];
    if (snprintf(dir, sizeof dir, "%s", index_path) >= (int)sizeof dir) /* cut, its last '/' would be another one */
        return dt_fail(DT_EINPUT, "checkpoint index '%.64s...': path too long", index_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    char *txt = NULL;
    size_t len = 0;
    DT_TRY(dt_read_file(index_path, &txt, &len, DT_INDEX_MAX_BYTES));
    const char *end = NULL;
    cJSON *root = strlen(txt) == len ? cJSON_ParseWithOpts(txt, &end, 0) : NULL;
    if (root)
        for (; *end; end++)
            if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
                cJSON_Delete(root);
                root = NULL;
                break;
            }
    free(txt);
    if (!root) return dt_fail(DT_EINPUT, "checkpoint index '%s': not valid JSON", index_path);
    uint64_t total_size = 0, sum = 0;
    dt_status s = index_parse(c, dir, root, &total_size);
    cJSON_Delete(root);
    for (int k = 0; s == DT_OK && k < c->nfiles; k++) { /* every file there before any is read */
        struct stat sb;
        char pbuf[1400];
        /* a regular file in the step directory itself: not a FIFO (its open would block),
         * not a symbolic link (to a file elsewhere) */
        int st = lstat(src_path(c, k, pbuf, sizeof pbuf), &sb), err = st ? errno : 0;
        if (st == 0 && !S_ISREG(sb.st_mode)) {
            s = dt_fail(DT_EINPUT, "checkpoint index '%s': '%s' is %s, not a regular file", index_path, c->paths[k],
                        S_ISLNK(sb.st_mode) ? "a symbolic link" : "special");
        } else if (st != 0) {
            const char *who = "?";
            for (int i = 0; i < c->n; i++)
                if (c->e[i].file == k) {
                    who = c->e[i].name;
                    break;
                }
            s = dt_fail(DT_EINPUT, "checkpoint index '%s': tensor '%s' maps to '%s', which cannot be opened (%s)",
                        index_path, who, c->paths[k], strerror(err));
        }
    }
    for (int k = 0; s == DT_OK && k < c->nfiles; k++) {
        char pbuf[1400];
        const char *path = src_path(c, k, pbuf, sizeof pbuf);
        st_file f;
        s = st_open(&f, path);
        for (int i = 0; s == DT_OK && i < f.n; i++) {
            src_entry *e = src_find(c, f.entries[i].name);
            if (!e)
                s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is not listed in the index '%s'", f.path,
                            f.entries[i].name, index_path);
            else if (e->file != k)
                s = dt_fail(DT_EINPUT, "checkpoint index '%s': tensor '%s' is in '%s' too, but the index maps it to "
                            "'%s'", index_path, e->name, c->paths[k], c->paths[e->file]);
            else {
                e->found = 1;
                e->bytes = f.entries[i].end - f.entries[i].begin;
            }
        }
        st_close(&f);
    }
    for (int i = 0; s == DT_OK && i < c->n; i++) {
        if (!c->e[i].found)
            s = dt_fail(DT_EINPUT, "checkpoint index '%s': tensor '%s' is not in '%s', the file the index maps it to",
                        index_path, c->e[i].name, c->paths[c->e[i].file]);
        else sum += c->e[i].bytes;
    }
    if (s == DT_OK && sum != total_size)
        s = dt_fail(DT_EINPUT, "checkpoint index '%s': metadata.total_size is %" PRIu64 " but the tensors it maps "
                    "hold %" PRIu64 " bytes", index_path, total_size, sum);
    if (s != DT_OK) src_free(c);
    return s;
}

static int is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* kind "model" or "optimizer" in directory dir (as Hugging Face looks: the single file
 * first, then the index), or path itself when it is a file. */
static dt_status src_open(ckpt_src *c, const char *path, const char *kind) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char single[1200], index[1200];
        snprintf(single, sizeof single, "%s/%s.safetensors", path, kind);
        snprintf(index, sizeof index, "%s/%s.safetensors.index.json", path, kind);
        if (snprintf(single, sizeof single, "%s/%s.safetensors", path, kind) >= (int)sizeof single ||
            snprintf(index, sizeof index, "%s/%s.safetensors.index.json", path, kind) >= (int)sizeof index)
            return dt_fail(DT_EINPUT, "checkpoint '%.64s...': path too long", path);
        if (!is_file(single) && is_file(index)) return src_open_index(c, index);
        return src_open_file(c, single);
    }
    if (ends_with(path, ".index.json")) return src_open_index(c, path);
    return src_open_file(c, path);
}

/* Reads every model tensor (name prefixed) into the unit view. The files hold whole
 * tensors; a sharded tensor (tensor parallelism) reads only this rank's piece, run by run
 * as its shard spec places it. One file open at a time. */
static dt_status read_tensors(const ckpt_src *c, const gpt_model *m, float *const *const *views,
                              const char *const *prefixes, int nsets) {
    dt_shard_run *runs = NULL;
    int64_t cap = 0;
    dt_status s = DT_OK;
    char name[128];
    for (int k = 0; s == DT_OK && k < nsets; k++) /* every tensor there before any file is read */
        for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
            snprintf(name, sizeof name, "%s%s", prefixes[k], m->tensors[i].name);
            if (!src_find(c, name)) s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is missing", c->where, name);
        }
    for (int fi = 0; s == DT_OK && fi < c->nfiles; fi++) {
        st_file f;
        int opened = 0;
        for (int k = 0; s == DT_OK && k < nsets; k++)
            for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
                const gpt_tensor *t = &m->tensors[i];
                snprintf(name, sizeof name, "%s%s", prefixes[k], t->name);
                const src_entry *se = src_find(c, name);
                if (!se || se->file != fi) continue;
                if (!opened) {
                    char pbuf[1400];
                    s = st_open(&f, src_path(c, fi, pbuf, sizeof pbuf));
                    if (s != DT_OK) break;
                    opened = 1;
                }
                const st_entry *e = st_find(&f, name);
                if (!e) { /* the file changed since it was checked */
                    s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is missing", f.path, name);
                    break;
                }
                int ndim = t->ndim;
                int64_t shape[8] = {t->ndim > 1 ? t->shard.real_rows : t->shard.cols, t->shard.cols}; /* the whole tensor */
                int match = e->dtype == ST_F32 && e->ndim == ndim;
                for (int d = 0; match && d < ndim; d++) match = e->shape[d] == shape[d];
                if (!match) {
                    char have[128], want[128];
                    format_shape(have, sizeof have, e->ndim, e->shape);
                    format_shape(want, sizeof want, ndim, shape);
                    s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is %s %s, the model needs F32 %s", f.path,
                                name, st_dtype_name(e->dtype), have, want);
                    break;
                }
                float *dst = in_view(m, views[k], i);
                memset(dst, 0, t->numel * sizeof(float)); /* rows beyond the vocabulary (padding) stay zero */
                if (t->shard.pieces <= 1) {
                    s = st_read(&f, e, dst, (uint64_t)saved_numel(t) * sizeof(float));
                } else {
                    s = st_verify(&f, e); /* the pieces alone cannot be checked against the whole's checksum */
                    if (s != DT_OK) break;
                    int64_t need = dt_shard_max_runs(&t->shard);
                    if (need > cap) {
                        dt_shard_run *r = realloc(runs, (size_t)need * sizeof *runs);
                        if (!r) {
                            s = dt_fail(DT_ERUNTIME, "out of memory (shard runs)");
                            break;
                        }
                        runs = r;
                        cap = need;
                    }
                    int64_t n = dt_shard_runs(&t->shard, runs, cap);
                    for (int64_t r = 0; s == DT_OK && r < n; r++)
                        s = st_read_range(&f, e, (uint64_t)runs[r].global * sizeof(float), dst + runs[r].local,
                                          (uint64_t)runs[r].len * sizeof(float));
                }
                for (size_t j = 0; s == DT_OK && j < t->numel; j++)
                    if (!isfinite(dst[j])) /* a diverged or corrupted run: training on it is undefined */
                        s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' holds %s at element %zu", f.path, name,
                                    isnan(dst[j]) ? "NaN" : "infinity", j);
            }
        if (opened) st_close(&f);
    }
    free(runs);
    return s;
}

/* Whether name is a tensor of the whole model m is (a pipeline stage of): the stage's own,
 * or the embeddings, ln_f, or a block of another stage (the names of this stage's first
 * block with another index below n_layer). */
static int of_whole_model(const gpt_model *m, const char *name) {
    if (gpt_find(m, name)) return 1;
    static const char *const ends[] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
    for (size_t k = 0; k < sizeof ends / sizeof ends[0]; k++)
        if (!strcmp(name, ends[k])) return 1;
    int l, n = 0;
    if (sscanf(name, "h.%d.%n", &l, &n) != 1 || n == 0 || l < 0 || l >= m->shape.n_layer) return 0;
    char mine[160];
    snprintf(mine, sizeof mine, "h.%d.%s", m->first_layer, name + n);
    return gpt_find(m, mine) != NULL;
}

/* Tensors a Hugging Face GPT-2 file may hold that are not parameters: the causal-mask
 * buffers (h.N.attn.bias, h.N.attn.masked_bias, in the hub's gpt2 file) and the LM head,
 * tied to wte in GPT-2 (so the same values); after the prefix. */
static int hf_extra(const char *name) {
    int l, n = 0;
    if (!strcmp(name, "lm_head.weight")) return 1;
    if (sscanf(name, "h.%d.attn.%n", &l, &n) != 1 || n == 0) return 0;
    return !strcmp(name + n, "bias") || !strcmp(name + n, "masked_bias");
}

/* Every tensor of the checkpoint is one of the model's under one of the prefixes: a tensor
 * the model does not have means another model (more layers, another naming). With hf,
 * Hugging Face's non-parameter tensors (hf_extra) are passed over. */
static dt_status check_no_extra(const ckpt_src *c, const gpt_model *m, const char *const *prefixes, int np, int hf) {
    for (int i = 0; i < c->n; i++) {
        const char *name = c->e[i].name;
        int known = 0;
        if (hf && (hf_extra(name) || (!strncmp(name, prefixes[0], strlen(prefixes[0])) &&
                                      hf_extra(name + strlen(prefixes[0])))))
            continue;
        for (int k = 0; k < np && !known; k++) {
            size_t l = strlen(prefixes[k]);
            known = !strncmp(name, prefixes[k], l) && of_whole_model(m, name + l);
        }
        if (!known)
            return dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is not part of this model (another model's "
                           "checkpoint?)", c->where, name);
    }
    return DT_OK;
}

/* hf: a weights file as Hugging Face writes GPT-2's: names with or without the
 * "transformer." of GPT2LMHeadModel.save_pretrained, mask buffers and lm_head passed over. */
static dt_status load_sets(const char *path, const char *kind, const gpt_model *m, float *const *const *views,
                           const char *const *prefixes, int nsets, int hf) {
    static const char *const transformer[] = {"transformer."};
    ckpt_src c;
    DT_TRY(src_open(&c, path, kind));
    if (hf && !src_find(&c, "wte.weight") && src_find(&c, "transformer.wte.weight")) prefixes = transformer;
    dt_status s = check_no_extra(&c, m, prefixes, nsets, hf);
    if (s == DT_OK) s = read_tensors(&c, m, views, prefixes, nsets);
    src_free(&c);
    return s;
}

dt_status dt_ckpt_load_weights(const char *path, gpt_model *m) {
    static const char *const none[] = {""};
    float *const *views[] = {m->unit_params};
    return load_sets(path, "model", m, views, none, 1, 1);
}

dt_status dt_ckpt_load_optimizer(const char *step_dir, const gpt_model *m, float *const *exp_avg,
                                 float *const *exp_avg_sq) {
    static const char *const moments[] = {"exp_avg.", "exp_avg_sq."};
    float *const *views[] = {exp_avg, exp_avg_sq};
    return load_sets(step_dir, "optimizer", m, views, moments, 2, 0);
}

dt_status dt_ckpt_check_tensors(const char *step_dir, const char *kind, int required) {
    char single[1200], index[1200];
    snprintf(single, sizeof single, "%s/%s.safetensors", step_dir, kind);
    snprintf(index, sizeof index, "%s/%s.safetensors.index.json", step_dir, kind);
    struct stat sb;
    if (!required && lstat(single, &sb) != 0 && lstat(index, &sb) != 0) return DT_OK;
    ckpt_src c;
    DT_TRY(src_open(&c, step_dir, kind));
    dt_status s = DT_OK;
    for (int k = 0; s == DT_OK && k < c.nfiles; k++) {
        char pbuf[1400];
        st_file f;
        s = st_open(&f, src_path(&c, k, pbuf, sizeof pbuf));
        for (int i = 0; s == DT_OK && i < f.n; i++) s = st_verify(&f, &f.entries[i]);
        st_close(&f);
    }
    src_free(&c);
    return s;
}

/* SHA-256 over the tensors in name order, each from the views or asked of src. */
static dt_status digest(const gpt_model *m, const dt_ckpt_source *src, char hex[65]) {
    int *order = malloc((size_t)m->ntensors * sizeof(int) + 1);
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    dt_status s = order && ctx ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (digest)");
    if (s == DT_OK) EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    if (s == DT_OK) gpt_sorted_order(m, order);
    for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[order[i]];
        const float *p = NULL;
        if (src) s = src->get(src->ctx, 0, order[i], &p);
        else p = in_view(m, m->unit_params, order[i]);
        if (s == DT_OK) EVP_DigestUpdate(ctx, p, (size_t)saved_numel(t) * sizeof(float));
    }
    if (s == DT_OK) EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    free(order);
    hex[0] = 0;
    for (int i = 0; s == DT_OK && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return s;
}

void dt_weights_digest(const gpt_model *m, char hex[65]) { (void)digest(m, NULL, hex); }

dt_status dt_weights_digest_stream(const gpt_model *m, const dt_ckpt_source *src, char hex[65]) {
    return digest(m, src, hex);
}
