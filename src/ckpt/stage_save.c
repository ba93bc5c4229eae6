#include "stage_save.h"

#include <stdlib.h>
#include <unistd.h>

#include "ckpt_dir.h"

/* The first stage's writer writes the indexes: every stage's tensor table, rebuilt from
 * the layouts the stages sent (info rows: files, pid, moments, layout). */
enum { INFO = 3 + DT_WHOLE_LAYOUT };
static dt_status write_indexes(const dt_whole_model *w, const double *info, int pp, const int *first, int total,
                               const char *tmp, double shard_mb) {
    dt_whole_model *tabs = calloc((size_t)pp, sizeof *tabs);
    const gpt_model **stages = calloc((size_t)pp, sizeof *stages);
    dt_status s = tabs && stages ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
    for (int q = 0; s == DT_OK && q < pp; q++) {
        if (q == 0) {
            stages[q] = &w->full;
            continue;
        }
        gpt_layout lay = dt_whole_unpack_layout(info + (size_t)q * INFO + 3);
        s = dt_whole_of(&w->full, &lay, 0, &tabs[q], 0); /* its table: names and sizes, in its order */
        stages[q] = &tabs[q].full;
    }
    if (s == DT_OK) s = dt_ckpt_write_index(tmp, stages, first, pp, total, shard_mb, w->mom[0] != NULL);
    for (int q = 0; tabs && q < pp; q++) dt_whole_free(&tabs[q]);
    free(tabs);
    free(stages);
    return s;
}

dt_status dt_ckpt_save_stages(dt_comm *ppc, const dt_whole_model *w, dt_status s, const char *dir,
                              const dt_train_state *st, const char *config_json, double shard_mb) {
    int multi = ppc && dt_comm_size(ppc) > 1;
    int pp = multi ? dt_comm_size(ppc) : 1, me = multi ? dt_comm_rank(ppc) : 0, made = 0;
    char tmp[1024] = "";
    if (me == 0 && s == DT_OK) { /* the step's temporary directory, named by the first writer's pid */
        s = dt_ckpt_begin(dir, st->step, (int)getpid(), tmp, sizeof tmp);
        made = s == DT_OK;
    }
    double *info = s == DT_OK ? calloc((size_t)pp * INFO, sizeof(double)) : NULL;
    int *first = s == DT_OK ? calloc((size_t)pp + 1, sizeof(int)) : NULL;
    if (s == DT_OK && (!info || !first)) s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint)");
    if (pp > 1) s = dt_comm_agree(ppc, s, NULL);
    int total = 0;
    if (s == DT_OK) { /* every stage's file count, the first writer's pid, whether moments are saved, its blocks */
        double *mine = info + (size_t)me * INFO;
        mine[0] = dt_ckpt_count_files(&w->full, shard_mb);
        mine[1] = (double)getpid();
        mine[2] = w->mom[0] != NULL;
        dt_whole_pack_layout(&w->full, mine + 3);
        if (pp > 1) s = dt_allgather(ppc, mine, info, INFO, DT_F64);
    }
    if (s == DT_OK) { /* the same on every writer: no agreement needed */
        for (int q = 0; q < pp; q++) {
            first[q] = total;
            total += (int)info[(size_t)q * INFO];
            if (info[(size_t)q * INFO + 2] != info[2])
                s = dt_fail(DT_ERUNTIME, "checkpoint: pipeline stage %d %s optimizer state, stage 0 %s", q,
                            info[(size_t)q * INFO + 2] ? "has" : "has no", info[2] ? "has" : "has none");
        }
        dt_ckpt_tmp_name(dir, st->step, (int)info[1], tmp, sizeof tmp);
    }
    if (s == DT_OK) s = dt_ckpt_write_files(tmp, &w->full, w->view[0], w->view[1], first[me], total, shard_mb);
    if (s == DT_OK && me > 0) { /* a kill or a failure here: another stage's files may be missing */
        dt_ckpt_test_crash("shard", st->step);
        if (dt_ckpt_test_fail("shard", st->step))
            s = dt_fail(DT_ERUNTIME, "checkpoint '%s': stage %d's files could not be written (test hook "
                        "DT_TEST_FAIL_AT)", tmp, me);
    }
    if (s == DT_OK && me == 0 && total > 1) s = write_indexes(w, info, pp, first, total, tmp, shard_mb);
    if (pp > 1) s = dt_comm_agree(ppc, s, NULL); /* every stage's files complete and fsynced */
    if (me == 0 && s == DT_OK && pp > 1) s = dt_ckpt_check_files(tmp, total, w->view[0] != NULL);
    if (me == 0 && s == DT_OK) s = dt_ckpt_commit(dir, tmp, st, config_json);
    else if (me == 0 && made) dt_ckpt_abort(tmp);
    free(info);
    free(first);
    return s;
}
