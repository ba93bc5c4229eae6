#include "export.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../backend/ops.h"
#include "../core/atomic_file.h"
#include "../core/config.h"
#include "../data/tokenizer.h"
#include "../model/gpt.h"
#include "checkpoint.h"
#include "ckpt_verify.h"
#include "safetensors.h"

/* The constants of dtrain's model that GPT2Config must restate (src/backend/cpu/layernorm.c,
 * the tanh GELU of src/backend/cpu/elementwise.c = transformers' "gelu_new"). */
#define LN_EPS 1e-5
/* The byte tokenizer has no end-of-text token; `dtrain sample` starts a document from '\n'. */
enum { BYTE_BOS = '\n' };

static const char *const TOKENIZER_FILES[] = {"vocab.json", "merges.txt", "tokenizer_config.json",
                                              "special_tokens_map.json"};
enum { N_TOKENIZER_FILES = sizeof TOKENIZER_FILES / sizeof TOKENIZER_FILES[0] };

typedef struct {
    dt_config cfg;
    gpt_model model;
    int bos, eos;                /* -1: none */
    char *vocab_json, *merges;   /* GPT-2 runs: the tokenizer files' bytes */
    size_t vocab_len, merges_len;
} export_src;

/* Refuses an output that is not a directory, or a non-empty one without force. */
static dt_status check_out(const char *out, int force) {
    if (strlen(out) > 900) return dt_fail(DT_EINPUT, "export: output path '%.64s...' is too long", out);
    struct stat sb;
    if (stat(out, &sb) != 0) {
        if (errno == ENOENT) return DT_OK;
        return dt_fail(DT_EINPUT, "export: output '%s': %s", out, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) return dt_fail(DT_EINPUT, "export: output '%s' exists and is not a directory", out);
    DIR *d = opendir(out);
    if (!d) return dt_fail(DT_EINPUT, "export: output directory '%s': cannot read (%s)", out, strerror(errno));
    int nonempty = 0;
    struct dirent *e;
    while (!nonempty && (e = readdir(d))) nonempty = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    if (nonempty && !force)
        return dt_fail(DT_EINPUT, "export: output directory '%s' is not empty (--force overwrites)", out);
    return DT_OK;
}

/* Checkpoint -> config and validated weights (and, for GPT-2 BPE runs, the tokenizer files). */
static dt_status load_source(const char *ckpt, export_src *src, dt_export_info *info) {
    char path[1100];
    dt_train_state st;
    char *cfg_json = NULL;
    DT_TRY(dt_ckpt_resolve(ckpt, info->step_dir, sizeof info->step_dir));
    DT_TRY(dt_ckpt_load_state(info->step_dir, &st, &cfg_json));
    info->step = st.step;
    dt_config *c = &src->cfg;
    dt_config_defaults(c);
    snprintf(path, sizeof path, "checkpoint '%s' config", info->step_dir);
    dt_status s = dt_config_load_json(c, cfg_json, path);
    free(cfg_json);
    DT_TRY(s);
    DT_TRY(dt_config_validate(c));
    gpt_shape shape = gpt_shape_of_config(c);
    /* activations for one token only: the model is a weight container and validator here */
    DT_TRY(gpt_create(&src->model, &shape, dt_ops_cpu(), 1, 1));
    DT_TRY(dt_ckpt_load_weights(info->step_dir, &src->model)); /* model.safetensors, or the shards of its index */

    src->bos = BYTE_BOS;
    src->eos = -1;
    if (strcmp(c->data.tokenizer, "gpt2") != 0) return DT_OK;
    /* the files the run was trained with: loading them checks they are a GPT-2 BPE pair */
    dt_tokenizer *tok = NULL;
    s = dt_tokenizer_gpt2(&tok, c->data.encoder_json, c->data.vocab_bpe);
    if (s != DT_OK) {
        dt_error_context("export: the checkpoint's tokenizer (data.encoder_json, data.vocab_bpe)");
        return s;
    }
    src->bos = src->eos = dt_tokenizer_eot(tok);
    dt_tokenizer_free(tok);
    DT_TRY(dt_read_file(c->data.encoder_json, &src->vocab_json, &src->vocab_len, 64u << 20));
    return dt_read_file(c->data.vocab_bpe, &src->merges, &src->merges_len, 64u << 20);
}

static void add_id(cJSON *o, const char *key, int id) {
    if (id >= 0) cJSON_AddNumberToObject(o, key, id);
    else cJSON_AddNullToObject(o, key);
}

/* LlamaConfig (or Qwen2Config: q/k/v biases without an o_proj bias, which Llama's
 * attention_bias would add) as transformers reads it. The tensors need no conversion:
 * dtrain keeps the Llama family in Hugging Face's names, nn.Linear layout and
 * rotate_half rotary convention. */
static cJSON *hf_llama_config(const export_src *src) {
    const dt_config *c = &src->cfg;
    gpt_shape s = src->model.shape;
    cJSON *j = cJSON_CreateObject();
    const char *arch = s.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(&arch, 1));
    cJSON_AddStringToObject(j, "model_type", s.qkv_bias ? "qwen2" : "llama");
    cJSON_AddNumberToObject(j, "vocab_size", s.vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", s.n_embd);
    cJSON_AddNumberToObject(j, "intermediate_size", s.intermediate);
    cJSON_AddNumberToObject(j, "num_hidden_layers", s.n_layer);
    cJSON_AddNumberToObject(j, "num_attention_heads", s.n_head);
    cJSON_AddNumberToObject(j, "num_key_value_heads", s.n_kv_head);
    cJSON_AddNumberToObject(j, "head_dim", s.n_embd / s.n_head);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->model.seq_len);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->model.norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->model.rope_theta);
    if (c->model.rope_factor > 0) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", "llama3");
        cJSON_AddNumberToObject(r, "factor", c->model.rope_factor);
        cJSON_AddNumberToObject(r, "low_freq_factor", c->model.rope_low_freq);
        cJSON_AddNumberToObject(r, "high_freq_factor", c->model.rope_high_freq);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", c->model.rope_original_max);
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    if (!s.qkv_bias) {
        cJSON_AddFalseToObject(j, "attention_bias");
        cJSON_AddFalseToObject(j, "mlp_bias");
    }
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", s.tie);
    cJSON_AddTrueToObject(j, "use_cache");
    add_id(j, "bos_token_id", src->bos);
    add_id(j, "eos_token_id", src->eos);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

/* GPT2Config as transformers reads it (defaults spelled out where dtrain's model differs
 * from them or where they matter to the forward pass). */
static cJSON *hf_config(const export_src *src) {
    const dt_config *c = &src->cfg;
    if (src->model.shape.family == GPT_FAMILY_LLAMA) return hf_llama_config(src);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray((const char *[]){"GPT2LMHeadModel"}, 1));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "vocab_size", c->model.vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", c->model.seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", c->model.seq_len);
    cJSON_AddNumberToObject(j, "n_embd", c->model.n_embd);
    cJSON_AddNumberToObject(j, "n_layer", c->model.n_layer);
    cJSON_AddNumberToObject(j, "n_head", c->model.n_head);
    cJSON_AddNullToObject(j, "n_inner"); /* 4 x n_embd */
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", LN_EPS);
    cJSON_AddNumberToObject(j, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "attn_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddTrueToObject(j, "scale_attn_weights");
    cJSON_AddFalseToObject(j, "scale_attn_by_inverse_layer_idx");
    cJSON_AddFalseToObject(j, "reorder_and_upcast_attn");
    cJSON_AddTrueToObject(j, "tie_word_embeddings");
    cJSON_AddTrueToObject(j, "use_cache");
    add_id(j, "bos_token_id", src->bos);
    add_id(j, "eos_token_id", src->eos);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

static cJSON *generation_config(const export_src *src) {
    cJSON *j = cJSON_CreateObject();
    add_id(j, "bos_token_id", src->bos);
    add_id(j, "eos_token_id", src->eos);
    return j;
}

/* As the hub's gpt2 tokenizer saves them: <|endoftext|> is bos, eos and unk; no padding token. */
static cJSON *tokenizer_config(const export_src *src) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddFalseToObject(j, "add_bos_token");
    cJSON_AddFalseToObject(j, "add_prefix_space");
    cJSON_AddStringToObject(j, "bos_token", "<|endoftext|>");
    cJSON_AddTrueToObject(j, "clean_up_tokenization_spaces");
    cJSON_AddStringToObject(j, "eos_token", "<|endoftext|>");
    cJSON_AddStringToObject(j, "errors", "replace");
    cJSON_AddNumberToObject(j, "model_max_length", src->cfg.model.seq_len);
    cJSON_AddNullToObject(j, "pad_token");
    cJSON_AddStringToObject(j, "tokenizer_class", "GPT2Tokenizer");
    cJSON_AddStringToObject(j, "unk_token", "<|endoftext|>");
    return j;
}

static cJSON *special_tokens_map(void) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "bos_token", "<|endoftext|>");
    cJSON_AddStringToObject(j, "eos_token", "<|endoftext|>");
    cJSON_AddStringToObject(j, "unk_token", "<|endoftext|>");
    return j;
}

/* Writes out/name atomically; takes ownership of j. */
static dt_status write_json(const char *out, const char *name, cJSON *j) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", out, name);
    char *txt = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!txt) return dt_fail(DT_ERUNTIME, "export: out of memory (%s)", name);
    size_t n = strlen(txt);
    char *buf = realloc(txt, n + 2); /* HF's files end with a newline */
    if (!buf) {
        free(txt);
        return dt_fail(DT_ERUNTIME, "export: out of memory (%s)", name);
    }
    buf[n] = '\n';
    dt_status s = dt_write_file_atomic(path, buf, n + 1);
    free(buf);
    return s;
}

static dt_status write_bytes(const char *out, const char *name, const char *data, size_t n) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", out, name);
    return dt_write_file_atomic(path, data, n);
}

/* The checkpoint's tensors in its own order and metadata, so the file matches the
 * checkpoint's model.safetensors byte for byte; a sharded checkpoint's shards make the
 * same single file (the model's table order). */
static dt_status write_weights(const char *out, const gpt_model *m) {
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    st_tensor_ref *refs = calloc((size_t)m->ntensors, sizeof *refs);
    if (!refs) return dt_fail(DT_ERUNTIME, "export: out of memory");
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        refs[i].name = t->name;
        refs[i].dtype = ST_F32;
        refs[i].ndim = t->ndim;
        refs[i].shape[0] = t->saved_rows; /* wte without its padding rows */
        if (t->ndim > 1) refs[i].shape[1] = t->shape[1];
        refs[i].data = m->params + t->offset;
    }
    const char *keys[] = {"format"}, *vals[] = {"pt"};
    dt_status s = st_write(path, refs, m->ntensors, keys, vals, 1);
    free(refs);
    return s;
}

static dt_status write_all(const char *out, int force, const export_src *src, dt_export_info *info) {
    if (mkdir(out, 0777) != 0 && errno != EEXIST)
        return dt_fail(DT_EINPUT, "export: cannot create output directory '%s' (%s)", out, strerror(errno));
    if (access(out, W_OK | X_OK) != 0)
        return dt_fail(DT_EINPUT, "export: output directory '%s' is not writable (%s)", out, strerror(errno));
    DT_TRY(write_weights(out, &src->model));
    DT_TRY(write_json(out, "config.json", hf_config(src)));
    DT_TRY(write_json(out, "generation_config.json", generation_config(src)));
    info->tokenizer_files = src->vocab_json != NULL;
    if (info->tokenizer_files) {
        DT_TRY(write_bytes(out, "vocab.json", src->vocab_json, src->vocab_len));
        DT_TRY(write_bytes(out, "merges.txt", src->merges, src->merges_len));
        DT_TRY(write_json(out, "tokenizer_config.json", tokenizer_config(src)));
        DT_TRY(write_json(out, "special_tokens_map.json", special_tokens_map()));
    } else if (force) { /* a byte run over an earlier BPE export: its tokenizer would not fit */
        char path[1100];
        for (int i = 0; i < N_TOKENIZER_FILES; i++) {
            snprintf(path, sizeof path, "%s/%s", out, TOKENIZER_FILES[i]);
            if (unlink(path) != 0 && errno != ENOENT)
                return dt_fail(DT_ERUNTIME, "export: cannot remove stale '%s' (%s)", path, strerror(errno));
        }
    }
    return dt_fsync_dir(out);
}

dt_status dt_export(const char *ckpt, const char *out, int force, dt_export_info *info) {
    memset(info, 0, sizeof *info);
    DT_TRY(check_out(out, force));
    export_src *src = calloc(1, sizeof *src); /* dt_config is large: not on the stack */
    if (!src) return dt_fail(DT_ERUNTIME, "export: out of memory");
    dt_status s = load_source(ckpt, src, info);
    if (s == DT_OK) s = write_all(out, force, src, info);
    gpt_destroy(&src->model);
    free(src->vocab_json);
    free(src->merges);
    free(src);
    return s;
}
