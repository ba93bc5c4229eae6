/* Training checkpoints. A checkpoint directory DIR holds one sub-directory per saved
 * step plus a pointer file:
 *   DIR/step_00000010/model.safetensors      weights, Hugging Face GPT-2 names, fp32
 *   DIR/step_00000010/optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
 *   DIR/step_00000010/trainer_state.json     step, data position, RNG, config
 *   DIR/latest                               name of the newest complete step directory
 * or, sharded (pipeline stages, checkpoint.shard_mb), Hugging Face's shards + index:
 *   DIR/step_00000010/model-00001-of-00002.safetensors ... model.safetensors.index.json
 *   DIR/step_00000010/optimizer-00001-of-00002.safetensors ... optimizer.safetensors.index.json
 * A step is written into a temporary directory, fsynced, and renamed into place under
 * a name no directory has; `latest` is replaced atomically afterwards and only then is
 * an older copy of the same step removed, so a crash at any point leaves `latest`
 * naming a complete checkpoint (protocol and crash points: ckpt_commit.c). The save
 * directory's lifecycle (refusing a second run, cleanup, pruning): ckpt_dir.h.
 * Implemented by: ckpt_write.c (the file plan, the tensor files, one-writer saves),
 * ckpt_index.c (the sharded index), ckpt_commit.c, ckpt_state.c (trainer_state.json),
 * ckpt_read.c (loading and checking tensors), ckpt_digest.c. Checkpoints of a
 * distributed state (who writes what, the assembly of whole tensors, the stage writers'
 * commit, asynchronous saves): distributed.h. */
#ifndef DT_CHECKPOINT_H
#define DT_CHECKPOINT_H
#include <stdint.h>

#include "../core/config.h"
#include "../core/rng.h"
#include "../core/status.h"
#include "../model/gpt.h"

typedef struct {
    long long step;       /* optimizer steps completed */
    long long data_epoch; /* loader position of the next batch */
    uint64_t data_pos;
    dt_rng rng;           /* run RNG (sampling); saved for exact resume */
} dt_train_state;

/* Weights come from m->unit_params; the optimizer moments from unit views laid out
 * like it (one pointer per model unit; NULL: no optimizer file). One writer: the files
 * of checkpoint.shard_mb (0: one model.safetensors and one optimizer.safetensors). */
dt_status dt_ckpt_save(const char *dir, const gpt_model *m, float *const *exp_avg, float *const *exp_avg_sq,
                       const dt_train_state *st, const char *config_json, double shard_mb);

/* Where a streamed save's whole tensors come from, one at a time: get(ctx, set, i, &data)
 * gives tensor i's saved values (fp32, saved_rows rows) of set 0 (weights), 1 (exp_avg) or
 * 2 (exp_avg_sq), valid until the next call; moments: sets 1 and 2 are saved too. */
typedef struct {
    dt_status (*get)(void *ctx, int set, int i, const float **data);
    void *ctx;
    int moments;
} dt_ckpt_source;

/* dt_ckpt_save's files, byte for byte, with the tensors asked of src one by one, so a save
 * holds one whole tensor at a time (ZeRO gathers each unit as it is written, collectively).
 * Every rank of the source's group calls it: the writer writes and commits; the others
 * (writer = 0) make the same calls of src in the same order, and so does the writer after
 * a failed write, so the collectives behind src stay matched. Returns the writer's status
 * on the writer, the source's on the others. */
dt_status dt_ckpt_save_stream(const char *dir, const gpt_model *m, const dt_ckpt_source *src, int writer,
                              const dt_train_state *st, const char *config_json, double shard_mb);

/* A save by several writers (one per pipeline stage, each holding its stage's whole
 * tensors; the collective part is stage_save.c's, dt_ckpt_save_stages), in steps:
 *   root:       dt_ckpt_begin (the temporary step directory, named by the root's pid)
 *   every one:  dt_ckpt_count_files, then dt_ckpt_write_files (file numbers first..)
 *   root:       dt_ckpt_write_index (when the files are more than one)
 *   root:       dt_ckpt_commit once every writer's files are complete, else dt_ckpt_abort.
 * File names: with one file in all, model.safetensors / optimizer.safetensors; else
 * model-%05d-of-%05d.safetensors (numbered from 1) + model.safetensors.index.json, and
 * optimizer-%05d-of-%05d.safetensors + optimizer.safetensors.index.json, the optimizer file
 * k holding the moments of the tensors of model file k (Hugging Face's naming). A writer's
 * tensors go to files in table order, a new file when the next tensor would take the file
 * past shard_mb MiB (0: no limit; a larger tensor alone); a pipeline stage's copy of a
 * tied tensor (wte on the last stage) is not written. */
void dt_ckpt_tmp_name(const char *dir, long long step, int pid, char *tmp, size_t cap);
dt_status dt_ckpt_begin(const char *dir, long long step, int pid, char *tmp, size_t cap);
int dt_ckpt_count_files(const gpt_model *m, double shard_mb);
dt_status dt_ckpt_write_files(const char *tmp, const gpt_model *m, float *const *exp_avg, float *const *exp_avg_sq,
                              int first, int total, double shard_mb);
/* stages[s]: writer s's tensor table (its first file: first[s]); moments: an optimizer index too. */
dt_status dt_ckpt_write_index(const char *tmp, const gpt_model *const *stages, const int *first, int nstages,
                              int total, double shard_mb, int moments);
/* trainer_state.json, then the commit protocol (ckpt_commit.c); removes tmp on failure
 * before its rename. */
dt_status dt_ckpt_commit(const char *dir, const char *tmp, const dt_train_state *st, const char *config_json);
void dt_ckpt_abort(const char *tmp);
/* Every one of a sharded save's `total` model (and optimizer) files is in tmp: what the
 * writers said they wrote is where the root commits (a shared file system). */
dt_status dt_ckpt_check_files(const char *tmp, int total, int optimizer);
/* Loads the trainer state and the saved config JSON (caller frees *config_json). */
dt_status dt_ckpt_load_state(const char *step_dir, dt_train_state *st, char **config_json);
/* The config the checkpoint was trained with: defaults, then its saved config. */
dt_status dt_ckpt_load_config(const char *step_dir, dt_config *c);
/* Loads weights (into m->unit_params) with HF GPT-2 names; shapes must match exactly.
 * path: a safetensors file, a model.safetensors.index.json (sharded: every file it names,
 * validated first), or a directory holding either (model.safetensors first, as Hugging
 * Face looks). */
dt_status dt_ckpt_load_weights(const char *path, gpt_model *m);
/* The same into the unit views units (laid out as m->unit_params); a unit whose view is
 * NULL is not read (a load one unit at a time; every tensor must still be there). */
dt_status dt_ckpt_load_weights_into(const char *path, const gpt_model *m, float *const *units);
/* optimizer.safetensors.index.json when the step directory has one, else optimizer.safetensors
 * (a unit whose views are NULL is not read, as above). */
dt_status dt_ckpt_load_optimizer(const char *step_dir, const gpt_model *m, float *const *exp_avg,
                                 float *const *exp_avg_sq);
/* The kind ("model" or "optimizer") of tensors of a step directory as a load finds them (the
 * single file, else the index and its files: validated as a load validates them), every
 * tensor's data checked against its checksum; absent and not required: DT_OK. */
dt_status dt_ckpt_check_tensors(const char *step_dir, const char *kind, int required);
/* SHA-256 over every parameter in name order as its full fp32 little-endian tensor. */
void dt_weights_digest(const gpt_model *m, char hex[65]);
/* The same digest with the tensors asked of src (set 0) in name order (collective as src is). */
dt_status dt_weights_digest_stream(const gpt_model *m, const dt_ckpt_source *src, char hex[65]);

/* A Hugging Face model directory as train.init_from: when it is a directory holding a
 * config.json, that file sets c's model keys (LlamaForCausalLM, MistralForCausalLM
 * without a sliding window shorter than model.seq_len, Qwen2ForCausalLM with its q/k/v
 * biases, GPT-2), so `--set train.init_from=path/to/model` needs no model keys of its
 * own; the weights then load through the checkpoint reader (model.safetensors, or the
 * shards its model.safetensors.index.json lists; bf16 and fp16 widened to fp32). A
 * family, activation, rotary scaling or bias dtrain does not have is a one-line DT_EINPUT
 * naming it; so is model.seq_len beyond max_position_embeddings. Otherwise nothing. */
dt_status dt_hf_apply_config(dt_config *c);

#endif
