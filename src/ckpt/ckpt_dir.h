/* The save directory's lifecycle: names of step directories, the `latest` pointer,
 * refusing a second run, cleaning what killed saves left, retiring old steps.
 *   step_%08lld         a step directory (the normal name)
 *   step_%08lld.vK      a newer copy of a step that already had a directory (K >= 2);
 *                       the older copy is retired once `latest` names the new one
 *   .step_N.tmp.PID/    a save in progress (or killed)          } removed by the next run
 *   .<step dir>.old.PID a retired step directory being deleted  } when PID is not alive
 *   latest.tmp.PID      `latest` being replaced                 }
 * Only rank 0 calls these (it alone manages the directory; in a sharded save the other
 * pipeline stages' writers only add their files to the step's temporary directory). */
#ifndef DT_CKPT_DIR_H
#define DT_CKPT_DIR_H
#include <stddef.h>

#include "../core/status.h"

/* Creates DIR if needed and checks it is writable. A directory that already holds
 * checkpoints (a `latest` file or a step directory) is refused with DT_EINPUT unless
 * the run resumes from it (resume_step: the resolved step directory, else NULL) or
 * `overwrite` is set; *replaces_run (may be NULL) tells the caller it then holds another
 * run's steps, to be dropped by dt_ckpt_prune once this run has saved. Afterwards
 * removes the temporaries of saves whose process is gone, and other copies of the step
 * `latest` names (what a save killed after its rename leaves); nothing else. */
dt_status dt_ckpt_prepare_dir(const char *dir, const char *resume_step, int overwrite, int *replaces_run);
/* Reads DIR/latest into name (one step-directory name, no path). */
dt_status dt_ckpt_read_latest(const char *dir, char *name, size_t cap);
/* Total bytes of the files in the step directory DIR/latest names (for the save's report). */
dt_status dt_ckpt_latest_bytes(const char *dir, double *bytes);
/* DIR's step directories, newest first (by step, then the later copy first): names[i]
 * (malloc'd, free it) holds steps[i] (malloc'd too). */
dt_status dt_ckpt_list_steps(const char *dir, char (**names)[64], long long **steps, int *count);
/* Step number of a step-directory name ("step_00000010" or "step_00000010.v2"), or -1. */
long long dt_ckpt_step_of(const char *name);
/* A name for a new copy of `step` that no entry of DIR has: "step_%08lld" when free,
 * else the first free "step_%08lld.vK". */
dt_status dt_ckpt_fresh_name(const char *dir, long long step, char *name, size_t cap);
/* Retires every directory of `step` other than `keep` (renamed to ".<name>.old.PID",
 * then deleted), so no partly deleted directory ever carries a step name. */
dt_status dt_ckpt_retire_copies(const char *dir, long long step, const char *keep);
/* After a save has updated `latest` (step N): with drop_others, retires every other step
 * directory (a replaced run's); else with keep_last K > 0, keeps the K newest steps up
 * to N and retires older ones. Steps above N (a run resumed from an earlier step
 * replaces them as it passes them) are left alone. */
dt_status dt_ckpt_prune(const char *dir, int keep_last, int drop_others);
/* Removes a directory of plain files (a step directory or a temporary one); best effort. */
void dt_ckpt_remove_flat_dir(const char *path);
/* Test hook: when the environment variable DT_TEST_CRASH_AT is "POINT" or "POINT:STEP"
 * and matches, the process ends at once with _exit(99), like a kill at that instant. */
void dt_ckpt_test_crash(const char *point, long long step);
/* Test hook: whether the environment variable DT_TEST_FAIL_AT ("POINT" or "POINT:STEP")
 * matches, for a caller to fail there as an I/O error would. */
int dt_ckpt_test_fail(const char *point, long long step);

#endif
