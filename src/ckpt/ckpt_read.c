/* Loading a checkpoint's tensors (weights, or the optimizer's moments) into a model, and
 * verifying them: one safetensors file or the files an index names (ckpt_index.c), both
 * untrusted, validated whole before any data is read; then names and shapes against the
 * model, and each tensor's data against its checksum. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "safetensors.h"

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

const char *ckpt_src_path(const ckpt_src *c, int k, char *buf, size_t cap) {
    if (!c->dir[0]) return c->single;
    snprintf(buf, cap, "%s/%s", c->dir, c->paths[k]);
    return buf;
}

void ckpt_src_free(ckpt_src *c) {
    free(c->paths);
    free(c->e);
    memset(c, 0, sizeof *c);
}

int ckpt_src_cmp(const void *a, const void *b) { return strcmp(((const src_entry *)a)->name, ((const src_entry *)b)->name); }

src_entry *ckpt_src_find(const ckpt_src *c, const char *name) {
    if (!c->e || strlen(name) >= sizeof c->e[0].name) return NULL;
    src_entry key;
    strcpy(key.name, name);
    return bsearch(&key, c->e, (size_t)c->n, sizeof *c->e, ckpt_src_cmp);
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
    if (s != DT_OK) ckpt_src_free(c);
    return s;
}

/* n 16-bit values (bf16, or IEEE fp16) at the start of x widened in place to n floats */
static void widen16(float *x, size_t n, int bf16) {
    const uint16_t *h = (const uint16_t *)x;
    for (size_t i = n; i-- > 0;) { /* from the end: each float lands at or after its source */
        uint16_t v = h[i];
        uint32_t bits;
        if (bf16) {
            bits = (uint32_t)v << 16;
        } else {
            uint32_t sign = (uint32_t)(v & 0x8000) << 16, e = (v >> 10) & 0x1f, mant = v & 0x3ff;
            if (e == 0x1f) bits = sign | 0x7f800000u | (mant << 13); /* inf, NaN */
            else if (e) bits = sign | ((e + 112) << 23) | (mant << 13);
            else if (!mant) bits = sign;
            else { /* subnormal: normalise */
                e = 113;
                while (!(mant & 0x400)) mant <<= 1, e--;
                bits = sign | (e << 23) | ((mant & 0x3ff) << 13);
            }
        }
        memcpy(&x[i], &bits, sizeof bits);
    }
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
        if (!is_file(single) && is_file(index)) return ckpt_src_open_index(c, index);
        return src_open_file(c, single);
    }
    if (ends_with(path, ".index.json")) return ckpt_src_open_index(c, path);
    return src_open_file(c, path);
}

/* Reads every model tensor (name prefixed) into the unit view (a unit whose view is NULL
 * is passed over: a load one unit at a time). The files hold whole tensors; a sharded
 * tensor (tensor parallelism) reads only this rank's piece, run by run as its shard spec
 * places it. One file open at a time. */
static dt_status read_tensors(const ckpt_src *c, const gpt_model *m, float *const *const *views,
                              const char *const *prefixes, int nsets) {
    dt_shard_run *runs = NULL;
    int64_t cap = 0;
    dt_status s = DT_OK;
    char name[128];
    for (int k = 0; s == DT_OK && k < nsets; k++) /* every tensor there before any file is read */
        for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
            snprintf(name, sizeof name, "%s%s", prefixes[k], m->tensors[i].name);
            if (!ckpt_src_find(c, name)) s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is missing", c->where, name);
        }
    for (int fi = 0; s == DT_OK && fi < c->nfiles; fi++) {
        st_file f;
        int opened = 0;
        for (int k = 0; s == DT_OK && k < nsets; k++)
            for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
                const gpt_tensor *t = &m->tensors[i];
                if (!views[k][t->unit]) continue;
                snprintf(name, sizeof name, "%s%s", prefixes[k], t->name);
                const src_entry *se = ckpt_src_find(c, name);
                if (!se || se->file != fi) continue;
                if (!opened) {
                    char pbuf[1400];
                    s = st_open(&f, ckpt_src_path(c, fi, pbuf, sizeof pbuf));
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
                /* 16-bit weights (Hugging Face's bf16 and fp16 files) are widened as read */
                int half = e->dtype == ST_BF16 || e->dtype == ST_F16, esz = half ? 2 : 4;
                int match = (e->dtype == ST_F32 || (half && views[k] == m->unit_params)) && e->ndim == ndim;
                for (int d = 0; match && d < ndim; d++) match = e->shape[d] == shape[d];
                if (!match) {
                    char have[128], want[128];
                    format_shape(have, sizeof have, e->ndim, e->shape);
                    format_shape(want, sizeof want, ndim, shape);
                    s = dt_fail(DT_EINPUT, "checkpoint '%s': tensor '%s' is %s %s, the model needs %s %s", f.path,
                                name, st_dtype_name(e->dtype), have, half ? "F32" : "F32 (or BF16, F16)", want);
                    break;
                }
                float *dst = ckpt_in_view(m, views[k], i);
                memset(dst, 0, t->numel * sizeof(float)); /* rows beyond the vocabulary (padding) stay zero */
                if (t->shard.pieces <= 1) {
                    s = st_read(&f, e, dst, (uint64_t)ckpt_saved_numel(t) * (uint64_t)esz);
                    if (s == DT_OK && half) widen16(dst, (size_t)ckpt_saved_numel(t), e->dtype == ST_BF16);
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
                    for (int64_t r = 0; s == DT_OK && r < n; r++) {
                        s = st_read_range(&f, e, (uint64_t)runs[r].global * (uint64_t)esz, dst + runs[r].local,
                                          (uint64_t)runs[r].len * (uint64_t)esz);
                        if (s == DT_OK && half) widen16(dst + runs[r].local, (size_t)runs[r].len, e->dtype == ST_BF16);
                    }
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
    static const char *const gpt2_ends[] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
    static const char *const llama_ends[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
    int l, n = 0, llama = m->shape.family == GPT_FAMILY_LLAMA;
    const char *const *ends = llama ? llama_ends : gpt2_ends;
    int nends = llama ? 2 + !m->shape.tie : 4; /* an untied head's weight */
    for (int k = 0; k < nends; k++)
        if (!strcmp(name, ends[k])) return 1;
    if (sscanf(name, llama ? "model.layers.%d.%n" : "h.%d.%n", &l, &n) != 1 || n == 0 || l < 0 ||
        l >= m->shape.n_layer)
        return 0;
    char mine[160];
    snprintf(mine, sizeof mine, llama ? "model.layers.%d.%s" : "h.%d.%s", m->first_layer, name + n);
    return gpt_find(m, mine) != NULL;
}

/* Tensors a Hugging Face GPT-2 file may hold that are not parameters: the causal-mask
 * buffers (h.N.attn.bias, h.N.attn.masked_bias, in the hub's gpt2 file) and the LM head,
 * tied to wte in GPT-2 (so the same values); after the prefix. */
static int hf_extra(const char *name) {
    int l, n = 0;
    if (!strcmp(name, "lm_head.weight")) return 1;
    /* older Llama files keep the rotary frequencies as a buffer */
    if (sscanf(name, "model.layers.%d.self_attn.rotary_emb.%n", &l, &n) == 1 && n && !strcmp(name + n, "inv_freq"))
        return 1;
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
    if (hf && !ckpt_src_find(&c, "wte.weight") && ckpt_src_find(&c, "transformer.wte.weight")) prefixes = transformer;
    dt_status s = check_no_extra(&c, m, prefixes, nsets, hf);
    if (s == DT_OK) s = read_tensors(&c, m, views, prefixes, nsets);
    ckpt_src_free(&c);
    return s;
}

dt_status dt_ckpt_load_weights(const char *path, gpt_model *m) { return dt_ckpt_load_weights_into(path, m, m->unit_params); }

dt_status dt_ckpt_load_weights_into(const char *path, const gpt_model *m, float *const *units) {
    static const char *const none[] = {""};
    float *const *views[] = {units};
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
        s = st_open(&f, ckpt_src_path(&c, k, pbuf, sizeof pbuf));
        for (int i = 0; s == DT_OK && i < f.n; i++) s = st_verify(&f, &f.entries[i]);
        st_close(&f);
    }
    ckpt_src_free(&c);
    return s;
}

