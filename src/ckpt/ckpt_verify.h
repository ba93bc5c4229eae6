/* Which step a checkpoint path means, and whether a step directory is intact.
 * A step directory is intact when its trainer_state.json parses and names the step its
 * directory name does (step_%08lld[.vK]; other names are not checked), its saved config
 * loads, and its model files (and optimizer files, when present) pass a load's checks
 * (index, headers, sizes) with every tensor's data matching its checksum (safetensors.h).
 * That reads the whole checkpoint once; the result is kept for the process, so every
 * caller (the config restore, the trainer, export, sample) gets the same step. */
#ifndef DT_CKPT_VERIFY_H
#define DT_CKPT_VERIFY_H
#include <stddef.h>

#include "../core/status.h"

/* DT_OK, or DT_EINPUT naming the first damage found (file, tensor, cause). */
dt_status dt_ckpt_verify_step(const char *step_dir);

/* PATH -> a step directory to load:
 *   a step directory (holds trainer_state.json): itself, when intact; else DT_EINPUT naming
 *     the damage (what the user named is never swapped for another step);
 *   a save directory (`latest`, step directories): the step `latest` names when intact,
 *     else the newest intact step below it (or, `latest` missing or unreadable, the newest
 *     intact step), one warning line per step passed over on stderr ("dtrain: warning:
 *     checkpoint DIR/step_N skipped: REASON; falling back to step_M"); no intact step:
 *     DT_EINPUT naming the newest and its damage.
 * Repeated calls with the same PATH give the first call's answer without checking again. */
dt_status dt_ckpt_resolve(const char *path, char *step_dir, size_t cap);
/* Whether resolve prints its warnings (on: the default; ranks other than 0 turn it off). */
void dt_ckpt_resolve_report(int on);
/* Forgets the kept answer (tests that damage a directory between calls). */
void dt_ckpt_resolve_forget(void);

#endif
