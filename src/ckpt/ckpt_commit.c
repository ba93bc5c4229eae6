/* The commit protocol of a save: the temporary step directory, the check that every
 * writer's files are there, and the commit (trainer_state.json, the rename into place,
 * `latest`, the retired copies). The protocol and its crash points: dt_ckpt_commit. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/atomic_file.h"
#include "ckpt_dir.h"
#include "ckpt_internal.h"

dt_status dt_ckpt_check_files(const char *tmp, int total, int optimizer) {
    char name[64], path[1200];
    struct stat sb;
    for (int kind = 0; kind < 1 + (optimizer != 0); kind++)
        for (int k = 0; k < total; k++) {
            ckpt_file_name(name, sizeof name, kind ? "optimizer" : "model", k, total);
            snprintf(path, sizeof path, "%s/%s", tmp, name);
            if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
                return dt_fail(DT_ERUNTIME, "checkpoint '%s': another stage's '%s' is not there (checkpoint.dir must "
                               "be one file system for every writer, shared across hosts)", tmp, name);
        }
    return DT_OK;
}

/* The temporary step directory of a save (the commit protocol: see dt_ckpt_commit). */
void dt_ckpt_tmp_name(const char *dir, long long step, int pid, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s/.step_%08lld.tmp.%d", dir, step, pid);
}

dt_status dt_ckpt_begin(const char *dir, long long step, int pid, char *tmp, size_t cap) {
    dt_ckpt_tmp_name(dir, step, pid, tmp, cap);
    dt_ckpt_remove_flat_dir(tmp); /* our own pid's leftover (pid reuse in containers) */
    if (mkdir(tmp, 0777) != 0)
        return dt_fail(DT_ERUNTIME, "checkpoint '%s': cannot create (%s)", tmp, strerror(errno));
    return DT_OK;
}

void dt_ckpt_abort(const char *tmp) { dt_ckpt_remove_flat_dir(tmp); }

/* Commit protocol. A new copy never takes the name of an existing directory, and a
 * directory is removed only once `latest` names its replacement, so at every instant
 * `latest` names a complete step directory. Crash points (the DT_TEST_CRASH_AT names)
 * and what a kill there leaves:
 *   "shard"       (several writers: a writer other than the root, its files written, the
 *                 others' maybe not) .step_N.tmp.PID/ incomplete: a leftover; `latest` unchanged
 *   "tmp"         .step_N.tmp.PID/ complete, not renamed: a leftover; `latest` unchanged
 *   "renamed"     the new directory in place under a fresh name; `latest` still names
 *                 the previous step (which resume uses; step N is then saved again)
 *   "latest_tmp"  latest.tmp.PID written, not renamed: a leftover; `latest` unchanged
 *   "latest"      `latest` names the new copy; a superseded copy of step N remains
 *   "retire"      a superseded copy moved to .<name>.old.PID, not yet deleted
 * Leftovers are removed by the next run's dt_ckpt_prepare_dir.
 * Each file of a step (every writer's shards, the indexes) is complete and fsynced when
 * this runs; a crash before the rename (any writer's) leaves only the temporary directory. */
dt_status dt_ckpt_commit(const char *dir, const char *tmp, const dt_train_state *st, const char *config_json) {
    char name[64], final[1100], path[1200];
    dt_status s;
    char *js = ckpt_state_json(st, config_json);
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    s = js ? dt_write_file_atomic(path, js, strlen(js)) : dt_fail(DT_ERUNTIME, "out of memory (state)");
    free(js);
    if (s == DT_OK) s = dt_fsync_dir(tmp);
    if (s == DT_OK) dt_ckpt_test_crash("tmp", st->step);
    if (s == DT_OK) s = dt_ckpt_fresh_name(dir, st->step, name, sizeof name);
    if (s == DT_OK) {
        snprintf(final, sizeof final, "%s/%s", dir, name);
        if (rename(tmp, final) != 0)
            s = dt_fail(DT_ERUNTIME, "checkpoint '%s': cannot rename into place (%s)", final, strerror(errno));
    }
    if (s != DT_OK) {
        dt_ckpt_remove_flat_dir(tmp);
        return s;
    }
    DT_TRY(dt_fsync_dir(dir));
    dt_ckpt_test_crash("renamed", st->step);
    char latest[1024], line[80];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", name);
    dt_atomic_file f;
    DT_TRY(dt_atomic_open(&f, latest));
    s = dt_atomic_write(&f, line, strlen(line));
    if (s == DT_OK) dt_ckpt_test_crash("latest_tmp", st->step);
    if (s == DT_OK) s = dt_atomic_commit(&f);
    else dt_atomic_abort(&f);
    DT_TRY(s);
    dt_ckpt_test_crash("latest", st->step);
    return dt_ckpt_retire_copies(dir, st->step, name);
}
