/* DeepSpeed JSON configs (`--deepspeed FILE`), translated onto dtrain's keys: a key with
 * the same meaning here sets that key ("auto", Hugging Face's convention, keeps dtrain's
 * value); a key that would change the math in a way dtrain cannot reproduce (fp16 loss
 * scaling, partial offload, a log-rate warmup, another optimizer) is DT_EINPUT naming it;
 * a tuning knob with no counterpart (bucket prefetch, persistence thresholds, aio queue
 * depth, logging backends) is collected in the ignored list. The offload blocks and aio
 * map onto offload.* (docs/offload.md). As in DeepSpeed, unknown top-level keys are tolerated
 * (listed as ignored) and unknown keys inside zero_optimization and the optimizer's
 * params are errors. docs/coming-from.md has the key-by-key table. */
#ifndef DT_DEEPSPEED_H
#define DT_DEEPSPEED_H
#include <stddef.h>

#include "config.h"

struct cJSON;

/* Applies the DeepSpeed config file at path on top of c. On success `ignored` holds the
 * comma-separated keys (dotted paths) that had no effect, "" when none. */
dt_status dt_deepspeed_load_file(dt_config *c, const char *path, char *ignored, size_t cap);
/* The same for a JSON text; origin names it in errors. */
dt_status dt_deepspeed_load_json(dt_config *c, const char *json, const char *origin, char *ignored, size_t cap);
/* The first top-level key of a JSON object that marks it as a DeepSpeed config
 * (train_batch_size, zero_optimization, bf16, ...), or NULL. */
const char *dt_deepspeed_marker(const struct cJSON *root);

#endif
