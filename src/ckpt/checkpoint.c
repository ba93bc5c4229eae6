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

/* Writes nsets copies of the tensor table (e.g. exp_avg.* and exp_avg_sq.*) into one file. */
static dt_status write_sets(const char *path, const gpt_model *m, float *const *const *views,
                            const char *const *prefixes, int nsets) {
    int n = m->ntensors * nsets;
    st_tensor_ref *refs = calloc((size_t)n, sizeof *refs);
    char (*names)[96] = calloc((size_t)n, sizeof *names);
    dt_status s = DT_OK;
    if (!refs || !names) s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint)");
    for (int k = 0; s == DT_OK && k < nsets; k++)
        for (int i = 0; i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            int j = k * m->ntensors + i;
            snprintf(names[j], sizeof names[j], "%s%s", prefixes[k], t->name);
            refs[j].name = names[j];
            refs[j].dtype = ST_F32;
            tensor_shape(t, &refs[j].ndim, refs[j].shape);
            refs[j].data = in_view(m, views[k], i);
        }
    const char *keys[] = {"format"}, *vals[] = {"pt"};
    if (s == DT_OK) s = st_write(path, refs, n, keys, vals, 1);
    free(refs);
    free(names);
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

/* Commit protocol. A new copy never takes the name of an existing directory, and a
 * directory is removed only once `latest` names its replacement, so at every instant
 * `latest` names a complete step directory. Crash points (the DT_TEST_CRASH_AT names)
 * and what a kill there leaves:
 *   "tmp"         .step_N.tmp.PID/ complete, not renamed: a leftover; `latest` unchanged
 *   "renamed"     the new directory in place under a fresh name; `latest` still names
 *                 the previous step (which resume uses; step N is then saved again)
 *   "latest_tmp"  latest.tmp.PID written, not renamed: a leftover; `latest` unchanged
 *   "latest"      `latest` names the new copy; a superseded copy of step N remains
 *   "retire"      a superseded copy moved to .<name>.old.PID, not yet deleted
 * Leftovers are removed by the next run's dt_ckpt_prepare_dir. */
dt_status dt_ckpt_save(const char *dir, const gpt_model *m, float *const *exp_avg, float *const *exp_avg_sq,
                       const dt_train_state *st, const char *config_json) {
    char name[64], tmp[1024], final[1100], path[1100];
    snprintf(tmp, sizeof tmp, "%s/.step_%08lld.tmp.%d", dir, st->step, (int)getpid());
    dt_ckpt_remove_flat_dir(tmp); /* our own pid's leftover (pid reuse in containers) */
    if (mkdir(tmp, 0777) != 0)
        return dt_fail(DT_ERUNTIME, "checkpoint '%s': cannot create (%s)", tmp, strerror(errno));
    dt_status s;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    float *const *wbase[] = {m->unit_params};
    const char *wpre[] = {""};
    s = write_sets(path, m, wbase, wpre, 1);
    if (s == DT_OK && exp_avg) {
        float *const *obase[] = {exp_avg, exp_avg_sq};
        const char *opre[] = {"exp_avg.", "exp_avg_sq."};
        snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
        s = write_sets(path, m, obase, opre, 2);
    }
    if (s == DT_OK) {
        char *js = state_json(st, config_json);
        snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
        s = js ? dt_write_file_atomic(path, js, strlen(js)) : dt_fail(DT_ERUNTIME, "out of memory (state)");
        free(js);
    }
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

dt_status dt_ckpt_resolve(const char *dir, char *step_dir, size_t cap) {
    char p[1100], name[256];
    struct stat sb;
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (stat(p, &sb) == 0) {
        snprintf(step_dir, cap, "%s", dir);
        return DT_OK;
    }
    snprintf(p, sizeof p, "%s/latest", dir);
    if (stat(p, &sb) != 0)
        return dt_fail(DT_EINPUT, "checkpoint '%s': no trainer_state.json and no 'latest' file", dir);
    DT_TRY(dt_ckpt_read_latest(dir, name, sizeof name));
    snprintf(step_dir, cap, "%s/%s", dir, name);
    snprintf(p, sizeof p, "%s/trainer_state.json", step_dir);
    if (stat(p, &sb) != 0) return dt_fail(DT_EINPUT, "checkpoint '%s': missing trainer_state.json", step_dir);
    return DT_OK;
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

/* Reads every model tensor (name prefixed) from an open safetensors file into the unit
 * view. The file holds whole tensors; a sharded tensor (tensor parallelism) reads only
 * this rank's piece, run by run as its shard spec places it. */
static dt_status read_tensors(st_file *f, const gpt_model *m, float *const *view, const char *prefix) {
    dt_shard_run *runs = NULL;
    int64_t cap = 0;
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        const st_entry *e = st_find(f, name);
        if (!e) {
            s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is missing", f->path, name);
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
            s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is %s %s, the model needs F32 %s", f->path, name,
                        st_dtype_name(e->dtype), have, want);
            break;
        }
        float *dst = in_view(m, view, i);
        memset(dst, 0, t->numel * sizeof(float)); /* rows beyond the vocabulary (padding) stay zero */
        if (t->shard.pieces <= 1) {
            s = st_read(f, e, dst, (uint64_t)saved_numel(t) * sizeof(float));
        } else {
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
            for (int64_t k = 0; s == DT_OK && k < n; k++)
                s = st_read_range(f, e, (uint64_t)runs[k].global * sizeof(float), dst + runs[k].local,
                                  (uint64_t)runs[k].len * sizeof(float));
        }
        for (size_t k = 0; s == DT_OK && k < t->numel; k++)
            if (!isfinite(dst[k])) /* a diverged or corrupted run: training on it is undefined */
                s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' holds %s at element %zu", f->path, name, isnan(dst[k]) ? "NaN" : "infinity", k);
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

/* Every tensor in the file is one of the model's under one of the prefixes: a tensor the
 * model does not have means another model (more layers, another naming). */
static dt_status check_no_extra(const st_file *f, const gpt_model *m, const char *const *prefixes, int np) {
    for (int i = 0; i < f->n; i++) {
        const char *name = f->entries[i].name;
        int known = 0;
        for (int k = 0; k < np && !known; k++) {
            size_t l = strlen(prefixes[k]);
            known = !strncmp(name, prefixes[k], l) && of_whole_model(m, name + l);
        }
        if (!known)
            return dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is not part of this model (another model's "
                           "checkpoint?)", f->path, name);
    }
    return DT_OK;
}

dt_status dt_ckpt_load_weights(const char *path, gpt_model *m) {
    st_file f;
    DT_TRY(st_open(&f, path));
    static const char *const none[] = {""};
    dt_status s = check_no_extra(&f, m, none, 1);
    if (s == DT_OK) s = read_tensors(&f, m, m->unit_params, "");
    st_close(&f);
    return s;
}

dt_status dt_ckpt_load_optimizer(const char *step_dir, const gpt_model *m, float *const *exp_avg,
                                 float *const *exp_avg_sq) {
    char p[1100];
    st_file f;
    snprintf(p, sizeof p, "%s/optimizer.safetensors", step_dir);
    DT_TRY(st_open(&f, p));
    static const char *const moments[] = {"exp_avg.", "exp_avg_sq."};
    dt_status s = check_no_extra(&f, m, moments, 2);
    if (s == DT_OK) s = read_tensors(&f, m, exp_avg, "exp_avg.");
    if (s == DT_OK) s = read_tensors(&f, m, exp_avg_sq, "exp_avg_sq.");
    st_close(&f);
    return s;
}

void dt_weights_digest(const gpt_model *m, char hex[65]) {
    int *order = malloc((size_t)m->ntensors * sizeof(int));
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    if (order) {
        gpt_sorted_order(m, order);
        for (int i = 0; i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[order[i]];
            EVP_DigestUpdate(ctx, in_view(m, m->unit_params, order[i]), (size_t)saved_numel(t) * sizeof(float));
        }
    }
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    free(order);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}
