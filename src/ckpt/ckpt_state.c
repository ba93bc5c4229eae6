/* trainer_state.json: the step, the data position, the RNG and the run's config, written
 * at the commit and read back (untrusted) on resume. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/atomic_file.h"
#include "ckpt_internal.h"

char *ckpt_state_json(const dt_train_state *st, const char *config_json) {
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
