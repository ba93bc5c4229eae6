/* Training checkpoints. A checkpoint directory DIR holds one sub-directory per saved
 * step plus a pointer file:
 *   DIR/step_00000010/model.safetensors      weights, Hugging Face GPT-2 names, fp32
 *   DIR/step_00000010/optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
 *   DIR/step_00000010/trainer_state.json     step, data position, RNG, config
 *   DIR/latest                               name of the newest complete step directory
 * A step is written into a temporary directory, fsynced, and renamed into place under
 * a name no directory has; `latest` is replaced atomically afterwards and only then is
 * an older copy of the same step removed, so a crash at any point leaves `latest`
 * naming a complete checkpoint (protocol and crash points: checkpoint.c). The save
 * directory's lifecycle (refusing a second run, cleanup, pruning): ckpt_dir.h. */
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
 * like it (one pointer per model unit; NULL: no optimizer file). */
dt_status dt_ckpt_save(const char *dir, const gpt_model *m, float *const *exp_avg, float *const *exp_avg_sq,
                       const dt_train_state *st, const char *config_json);
/* Resolves DIR (a step directory, or a checkpoint root: follows `latest`) to a step directory. */
dt_status dt_ckpt_resolve(const char *dir, char *step_dir, size_t cap);
/* Loads the trainer state and the saved config JSON (caller frees *config_json). */
dt_status dt_ckpt_load_state(const char *step_dir, dt_train_state *st, char **config_json);
/* The config the checkpoint was trained with: defaults, then its saved config. */
dt_status dt_ckpt_load_config(const char *step_dir, dt_config *c);
/* Loads weights (into m->unit_params) from a safetensors file with HF GPT-2 names;
 * shapes must match exactly. */
dt_status dt_ckpt_load_weights(const char *path, gpt_model *m);
dt_status dt_ckpt_load_optimizer(const char *step_dir, const gpt_model *m, float *const *exp_avg,
                                 float *const *exp_avg_sq);
/* SHA-256 over every parameter in name order as its full fp32 little-endian tensor. */
void dt_weights_digest(const gpt_model *m, char hex[65]);

#endif
