/* A Hugging Face model directory as train.init_from (checkpoint.h) */
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int dt_hf_is_model_dir(const char *path) {
    struct stat sb;
    char p[DT_PATH_MAX + 16];
    if (!path[0] || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    snprintf(p, sizeof p, "%s/config.json", path);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* key's number (absent: def; present and not a number in [lo, hi]: *bad set) */
static double num(const cJSON *j, const char *key, double def, double lo, double hi, const char **bad) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return def;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        if (!*bad) *bad = key;
        return def;
    }
    return v->valuedouble;
}
static int flag(const cJSON *j, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}
static const char *str(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static dt_status llama_keys(dt_config *c, const cJSON *j, const char *type, const char *where) {
    const char *bad = NULL, *act = str(j, "hidden_act");
    if (act && strcmp(act, "silu") != 0)
        return dt_fail(DT_EINPUT, "%s: hidden_act '%s' is not supported (SwiGLU with silu only)", where, act);
    if (flag(j, "attention_bias", 0) && strcmp(type, "qwen2") != 0)
        return dt_fail(DT_EINPUT, "%s: attention_bias true (an o_proj bias) is not supported", where);
    if (flag(j, "mlp_bias", 0)) return dt_fail(DT_EINPUT, "%s: mlp_bias true is not supported", where);
    double window = num(j, "sliding_window", 0, 0, 1e12, &bad);
    int sliding = !strcmp(type, "qwen2") ? flag(j, "use_sliding_window", 0) && window > 0 : window > 0;
    if (sliding && window < c->model.seq_len)
        return dt_fail(DT_EINPUT, "%s: sliding_window %.0f is shorter than model.seq_len %d (sliding-window "
                       "attention is not supported)", where, window, c->model.seq_len);
    int C = (int)num(j, "hidden_size", 0, 1, 65536, &bad), H = (int)num(j, "num_attention_heads", 0, 1, 1024, &bad);
    int KV = (int)num(j, "num_key_value_heads", H, 1, 1024, &bad);
    int L = (int)num(j, "num_hidden_layers", 0, 1, 1024, &bad), V = (int)num(j, "vocab_size", 0, 1, 1 << 24, &bad);
    int I = (int)num(j, "intermediate_size", 0, 1, 1 << 20, &bad);
    double maxpos = num(j, "max_position_embeddings", 1 << 24, 1, 1e12, &bad);
    double theta = num(j, "rope_theta", 10000, 1, 1e12, &bad), eps = num(j, "rms_norm_eps", 1e-6, 1e-12, 1, &bad);
    double hd = num(j, "head_dim", H ? C / H : 0, 1, 65536, &bad);
    if (bad) return dt_fail(DT_EINPUT, "%s: '%s' is missing or out of range", where, bad);
    if (!C || !H || !L || !V || !I)
        return dt_fail(DT_EINPUT, "%s: hidden_size, num_attention_heads, num_hidden_layers, vocab_size and "
                       "intermediate_size are required", where);
    if (C % H != 0 || (int)hd != C / H)
        return dt_fail(DT_EINPUT, "%s: head_dim %.0f differs from hidden_size / num_attention_heads (%d / %d): "
                       "not supported", where, hd, C, H);
    if (c->model.seq_len > maxpos)
        return dt_fail(DT_EINPUT, "%s: model.seq_len %d exceeds max_position_embeddings %.0f", where,
                       c->model.seq_len, maxpos);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    c->model.rope_factor = 0;
    if (rs && !cJSON_IsNull(rs)) {
        const char *rt = str(rs, "rope_type") ? str(rs, "rope_type") : str(rs, "type");
        if (!rt || strcmp(rt, "llama3") != 0)
            return dt_fail(DT_EINPUT, "%s: rope_scaling type '%s' is not supported (llama3 only)", where,
                           rt ? rt : "(none)");
        c->model.rope_factor = num(rs, "factor", 0, 1e-6, 1e6, &bad);
        c->model.rope_low_freq = num(rs, "low_freq_factor", 1, 1e-6, 1e6, &bad);
        c->model.rope_high_freq = num(rs, "high_freq_factor", 4, 1e-6, 1e6, &bad);
        c->model.rope_original_max = (int)num(rs, "original_max_position_embeddings", 8192, 1, 1 << 24, &bad);
        if (bad || c->model.rope_high_freq <= c->model.rope_low_freq)
            return dt_fail(DT_EINPUT, "%s: rope_scaling's %s is missing or out of range", where,
                           bad ? bad : "high_freq_factor");
    }
    snprintf(c->model.family, sizeof c->model.family, "llama");
    c->model.n_embd = C, c->model.n_head = H, c->model.n_kv_head = KV, c->model.n_layer = L;
    c->model.vocab_size = V, c->model.intermediate_size = I;
    c->model.rope_theta = theta, c->model.norm_eps = eps;
    c->model.tie_embeddings = flag(j, "tie_word_embeddings", 0);
    c->model.qkv_bias = !strcmp(type, "qwen2");
    return DT_OK;
}

static dt_status gpt2_keys(dt_config *c, const cJSON *j, const char *where) {
    const char *bad = NULL;
    int C = (int)num(j, "n_embd", 768, 1, 65536, &bad), H = (int)num(j, "n_head", 12, 1, 1024, &bad);
    int L = (int)num(j, "n_layer", 12, 1, 1024, &bad), V = (int)num(j, "vocab_size", 50257, 1, 1 << 24, &bad);
    int P = (int)num(j, "n_positions", 1024, 1, 65536, &bad);
    if (bad) return dt_fail(DT_EINPUT, "%s: '%s' is out of range", where, bad);
    const char *act = str(j, "activation_function");
    if (act && strcmp(act, "gelu_new") != 0)
        return dt_fail(DT_EINPUT, "%s: activation_function '%s' is not supported (gelu_new)", where, act);
    snprintf(c->model.family, sizeof c->model.family, "gpt2");
    c->model.n_embd = C, c->model.n_head = H, c->model.n_layer = L, c->model.vocab_size = V, c->model.seq_len = P;
    c->model.n_kv_head = 0, c->model.intermediate_size = 0, c->model.qkv_bias = 0, c->model.tie_embeddings = 1;
    c->model.rope_factor = 0;
    return DT_OK;
}

dt_status dt_hf_apply_config(dt_config *c) {
    const char *dir = c->train.init_from;
    if (!dt_hf_is_model_dir(dir)) return DT_OK;
    char path[DT_PATH_MAX + 16], where[DT_PATH_MAX + 64], *text;
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(where, sizeof where, "train.init_from '%s'", path);
    DT_TRY(dt_config_read_file(path, "train.init_from", &text));
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dt_fail(DT_EINPUT, "%s: not a JSON object", where);
    }
    const char *type = str(j, "model_type");
    dt_status s;
    if (!type) s = dt_fail(DT_EINPUT, "%s: no model_type", where);
    else if (!strcmp(type, "llama") || !strcmp(type, "mistral") || !strcmp(type, "qwen2")) s = llama_keys(c, j, type, where);
    else if (!strcmp(type, "gpt2")) s = gpt2_keys(c, j, where);
    else
        s = dt_fail(DT_EINPUT, "%s: model_type '%s' is not supported (llama, mistral, qwen2, gpt2)", where, type);
    cJSON_Delete(j);
    return s;
}
