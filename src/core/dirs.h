/* Directories a run writes into are made as needed (mkdir -p), as torchrun's and
 * DeepSpeed's users expect of an output path: a fresh clone's `runs/...` just works. */
#ifndef DT_DIRS_H
#define DT_DIRS_H
#include "status.h"

/* Makes `dir` and every missing ancestor (mode 0777 minus umask). An existing directory
 * is fine; a component that exists but is not a directory, or cannot be made, is
 * DT_EINPUT naming `what` (e.g. "checkpoint dir"), the path and the failing component. */
dt_status dt_make_dirs(const char *dir, const char *what);
/* Makes the directory that will hold `file` (everything before its last '/'), if any. */
dt_status dt_make_parent_dirs(const char *file, const char *what);

#endif
