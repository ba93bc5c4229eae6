/* Private to the files that implement checkpoint.h (ckpt_write.c, ckpt_index.c,
 * ckpt_commit.c, ckpt_state.c, ckpt_read.c, ckpt_digest.c): the tensor arithmetic, file
 * naming and checkpoint source (what a load reads from) that they share. */
#ifndef DT_CKPT_INTERNAL_H
#define DT_CKPT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"

/* trainer_state.json's "format": a file without it is not one of ours */
#define DT_CKPT_FORMAT "dtrain-checkpoint-v1"

/* Elements of a tensor as saved (rows past the vocabulary's padding are not). */
static inline int64_t ckpt_saved_numel(const gpt_tensor *t) { return (int64_t)t->saved_rows * t->shape[1]; }

/* Tensor i inside a unit view (one base pointer per model unit, as in gpt_model.unit_params). */
static inline float *ckpt_in_view(const gpt_model *m, float *const *units, int i) {
    const gpt_tensor *t = &m->tensors[i];
    return units[t->unit] + (t->offset - m->units[t->unit].offset);
}

/* ckpt_write.c: which of this writer's files each tensor goes to (-1: not saved; file_of
 * may be NULL), returning the count; and file k (0-based) of total: "model.safetensors"
 * alone, else Hugging Face's shard names. */
int ckpt_plan_files(const gpt_model *m, double shard_mb, int *file_of);
void ckpt_file_name(char *buf, size_t cap, const char *kind, int k, int total);

/* ckpt_state.c: trainer_state.json's text (NULL: out of memory; the caller frees it). */
char *ckpt_state_json(const dt_train_state *st, const char *config_json);

/* What a load reads from (ckpt_src). A checkpoint's tensors (weights, or moments) are one safetensors file or
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

/* ckpt_read.c: the path of file k (buf holds it for an index's files), the release, the
 * entry of a name (NULL: none) and the order of entries (by name). */
const char *ckpt_src_path(const ckpt_src *c, int k, char *buf, size_t cap);
void ckpt_src_free(ckpt_src *c);
src_entry *ckpt_src_find(const ckpt_src *c, const char *name);
int ckpt_src_cmp(const void *a, const void *b);
/* ckpt_index.c: an index and its files (every file's header, each tensor in its mapped
 * file and no other); on failure c is freed. */
dt_status ckpt_src_open_index(ckpt_src *c, const char *index_path);

#endif
