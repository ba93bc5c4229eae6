/* `dtrain export`: a checkpoint as a directory that Hugging Face transformers loads with
 * GPT2LMHeadModel.from_pretrained(OUT):
 *   model.safetensors        the weights, HF GPT-2 names without the "transformer." prefix (as
 *                            the hub's gpt2 file; transformers adds it), Conv1D layout, fp32,
 *                            no lm_head.weight (tied to wte) and no vocabulary padding rows
 *   config.json              GPT2Config (gelu_new, layer_norm_epsilon 1e-5, dropout 0, tied head)
 *   generation_config.json   bos/eos token ids
 *   vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json
 *                            only for runs with data.tokenizer = gpt2 (byte runs have no HF
 *                            tokenizer equivalent: token id = byte value)
 * The weights go through the checkpoint loader first, so every check on load applies. */
#ifndef DT_EXPORT_H
#define DT_EXPORT_H

#include "../core/status.h"

typedef struct {
    char step_dir[1024]; /* the step directory CKPT resolved to */
    long long step;
    int tokenizer_files; /* 1: the GPT-2 tokenizer files were written; 0: byte run, none */
} dt_export_info;

/* Writes the export of checkpoint ckpt (a step directory, or a save directory with `latest`)
 * into out, created if missing. A non-empty out is refused (DT_EINPUT) unless force; with
 * force, files are replaced one by one, atomically, and tokenizer files a byte run does not
 * have are removed. Nothing is written before the checkpoint and tokenizer files are validated. */
dt_status dt_export(const char *ckpt, const char *out, int force, dt_export_info *info);

#endif
