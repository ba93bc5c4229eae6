#include "distributed.h"

#include <string.h>

#include "stage_save.h"

dt_ckpt_roles dt_ckpt_roles_of(const dt_ckpt_groups *g) {
    dt_ckpt_roles r = {.split = dt_whole_split(&g->mp),
                       .replica0 = dt_comm_rank(g->dp) == 0 && (!g->replicas || dt_comm_rank(g->replicas) == 0)};
    /* the first replica's model-parallel groups write (a group's ranks share their
     * data-parallel rank); the other replicas take part in the gathers over dp only */
    r.writer = r.replica0 && (!r.split || dt_whole_is_stage_root(&g->mp));
    r.root = r.replica0 && r.split && dt_whole_is_root(&g->mp);
    return r;
}

void dt_ckpt_dist_init(dt_ckpt_dist *c, const dt_ckpt_groups *g, const gpt_model *m, const dt_ckpt_pieces *p) {
    memset(c, 0, sizeof *c);
    c->g = *g;
    c->m = m;
    c->pieces = *p;
}

int dt_ckpt_dist_set_async(dt_ckpt_dist *c, int on) { return c->async = on && !dt_ckpt_roles_of(&c->g).split; }

dt_status dt_ckpt_save_wait(dt_ckpt_dist *c) {
    return dt_comm_agree(c->g.dp, dt_ckpt_roles_of(&c->g).replica0 ? dt_ckpt_async_wait(&c->job) : DT_OK, NULL);
}

void dt_ckpt_dist_finish(dt_ckpt_dist *c) {
    if (c->job.pid > 0) {
        dt_status s = dt_ckpt_async_wait(&c->job);
        (void)s;
    }
}

/* Whole tensors, each stage's written at its stage root by the first replica. */
static dt_status save_split(dt_ckpt_dist *c, dt_ckpt_roles r, const char *dir, const dt_train_state *st,
                            const char *config_json, double shard_mb) {
    const dt_ckpt_pieces *p = &c->pieces;
    float **mv = NULL, **vv = NULL;
    dt_whole_model f;
    memset(&f, 0, sizeof f);
    dt_status s = p->open_full(p->ctx, 1, 1, r.replica0, &mv, &vv); /* this rank's pieces whole over dp */
    if (r.replica0) {
        s = dt_whole_agree(&c->g.mp, s); /* what follows is collective over the groups */
        if (s == DT_OK) s = dt_whole_gather_stage(&c->g.mp, c->m, mv, vv, &f);
    }
    if (r.writer) s = dt_ckpt_save_stages(c->g.mp.pp, &f, s, dir, st, config_json, shard_mb); /* in parallel */
    dt_whole_free(&f);
    dt_status cl = p->close_full(p->ctx, mv, vv);
    if (s == DT_OK) s = cl;
    s = dt_whole_agree(&c->g.mp, s);
    return dt_comm_agree(c->g.dp, s, NULL);
}

dt_status dt_ckpt_save_distributed(dt_ckpt_dist *c, const char *dir, const dt_train_state *st,
                                   const char *config_json, double shard_mb) {
    const dt_ckpt_pieces *p = &c->pieces;
    dt_ckpt_roles r = dt_ckpt_roles_of(&c->g);
    if (r.split) return save_split(c, r, dir, st, config_json, shard_mb);
    dt_status s = DT_OK;
    if (p->source_open && !c->async) { /* streamed: one piece whole at a time, written as it comes */
        dt_ckpt_source src;
        s = p->source_open(p->ctx, 1, r.writer, &src);
        if (s == DT_OK) s = dt_ckpt_save_stream(dir, c->m, &src, r.writer, st, config_json, shard_mb);
        p->source_close(p->ctx, &src);
        return dt_comm_agree(c->g.dp, s, NULL);
    }
    /* the writer alone; an asynchronous save's child from a snapshot of the whole state (fork) */
    float **mv = NULL, **vv = NULL;
    s = p->open_full(p->ctx, 1, 1, r.writer, &mv, &vv);
    if (s == DT_OK && r.writer)
        s = c->async ? dt_ckpt_save_async(&c->job, dir, c->m, mv, vv, st, config_json, shard_mb)
                     : dt_ckpt_save(dir, c->m, mv, vv, st, config_json, shard_mb);
    dt_status cl = p->close_full(p->ctx, mv, vv);
    if (s == DT_OK) s = cl;
    return dt_comm_agree(c->g.dp, s, NULL);
}

dt_status dt_ckpt_digest_distributed(dt_ckpt_dist *c, char hex[65]) {
    const dt_ckpt_pieces *p = &c->pieces;
    dt_ckpt_roles r = dt_ckpt_roles_of(&c->g);
    float **mv = NULL, **vv = NULL;
    if (r.split) { /* of the whole model, at the root */
        dt_whole_model f;
        memset(&f, 0, sizeof f);
        dt_status s = p->open_full(p->ctx, 0, 0, r.replica0, &mv, &vv);
        if (r.replica0) {
            s = dt_whole_agree(&c->g.mp, s);
            if (s == DT_OK) s = dt_whole_gather(&c->g.mp, c->m, NULL, NULL, &f);
        }
        hex[0] = 0;
        if (s == DT_OK && r.root) dt_weights_digest(&f.full, hex);
        dt_whole_free(&f);
        dt_status cl = p->close_full(p->ctx, mv, vv);
        if (s == DT_OK) s = cl;
        return dt_whole_agree(&c->g.mp, s);
    }
    if (p->source_open) { /* streamed as a save is (every rank gets the digest) */
        dt_ckpt_source src;
        dt_status s = p->source_open(p->ctx, 0, 1, &src);
        if (s == DT_OK) s = dt_weights_digest_stream(c->m, &src, hex);
        p->source_close(p->ctx, &src);
        return s;
    }
    dt_status s = p->open_full(p->ctx, 0, 0, 1, &mv, &vv);
    if (s == DT_OK) dt_weights_digest(c->m, hex);
    dt_status cl = p->close_full(p->ctx, mv, vv);
    return s != DT_OK ? s : cl;
}
