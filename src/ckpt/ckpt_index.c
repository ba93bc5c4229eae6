/* The sharded index (model.safetensors.index.json, optimizer.safetensors.index.json):
 * written as Hugging Face writes it, and read back as untrusted input, with every file it
 * names checked before any tensor is read (ckpt_read.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/atomic_file.h"
#include "ckpt_internal.h"
#include "safetensors.h"

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
        ckpt_file_name(fname, sizeof fname, kind, rows[i].file, total); /* names are [a-z0-9._]: no escaping */
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
        int nf = ckpt_plan_files(m, shard_mb, file_of);
        if (first[q] < 0 || first[q] + nf > total) s = dt_fail(DT_ERUNTIME, "checkpoint index: bad file numbers");
        for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
            if (file_of[i] < 0) continue;
            snprintf(rows[n].name, sizeof rows[n].name, "%s", m->tensors[i].name);
            rows[n++].file = first[q] + file_of[i];
            bytes += (uint64_t)ckpt_saved_numel(&m->tensors[i]) * sizeof(float);
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

/* Bounds on what an index may make us allocate (GPT-2 sizes have < 13000 tensors; the
 * index of a 1024-layer model's optimizer is about 2 MiB). */
#define DT_INDEX_MAX_BYTES (16u << 20)
#define DT_INDEX_MAX_TENSORS 100000
#define DT_INDEX_MAX_FILES 100000

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
        qsort(c->e, (size_t)n, sizeof *c->e, ckpt_src_cmp);
        for (int k = 1; k < n && s == DT_OK; k++)
            if (!strcmp(c->e[k].name, c->e[k - 1].name))
                s = dt_fail(DT_EINPUT, "checkpoint index '%s': tensor '%s' is listed twice", w, c->e[k].name);
    }
    return s;
}

/* An index and its files: every file's header, each tensor in its mapped file and no other. */
dt_status ckpt_src_open_index(ckpt_src *c, const char *index_path) {
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
        int st = lstat(ckpt_src_path(c, k, pbuf, sizeof pbuf), &sb), err = st ? errno : 0;
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
        const char *path = ckpt_src_path(c, k, pbuf, sizeof pbuf);
        st_file f;
        s = st_open(&f, path);
        for (int i = 0; s == DT_OK && i < f.n; i++) {
            src_entry *e = ckpt_src_find(c, f.entries[i].name);
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
    if (s != DT_OK) ckpt_src_free(c);
    return s;
}
