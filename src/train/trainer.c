#include "trainer.h"

#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/ops.h"
#include "../ckpt/checkpoint.h"
#include "../ckpt/ckpt_verify.h"
#include "../ckpt/ckpt_dir.h"
#include "../core/mem.h"
#include "../core/signals.h"
#include "../core/timer.h"
#include "../data/loader.h"
#include "../data/tokenfile.h"
#include "../data/tokenizer.h"
#include "../comm/watchdog.h"
#include "../launch/heartbeat.h"
#include "../launch/threads.h"
#include "../model/gpt.h"
#include "../optim/optimizer.h"
#include "../parallel/data_parallel/data_parallel.h"
#include "../parallel/model_parallel/context_parallel.h"
#include "../parallel/layout/estimate.h"
#include "../parallel/layout/mesh.h"
#include "../parallel/model_parallel/pipeline.h"
#include "../parallel/model_parallel/tensor_parallel.h"
#include "metrics.h"
#include "progress.h"
#include "sample.h"

typedef struct {
    const dt_config *cfg; /* &run_cfg */
    dt_config run_cfg;    /* the caller's config with the micro-batch resolved for this world */
    const dt_ops *ops;
    dt_comm *world;
    dt_threads_plan threads; /* OpenMP/BLAS threads of this rank, chosen among the node's ranks */
    dt_mesh mesh;
    int rank0, dp, dp_rank;
    gpt_model model;
    dt_dp *dpe;
    dt_dcomm *dcomm; /* comm.backend nccl: the data-parallel group's device collectives */
    int failed;      /* the run ends with an error (teardown aborts the device communicator) */
    dt_pipeline *pipe;          /* parallel.pp > 1 */
    dt_schedule sched;
    double *pipe_all;              /* the final pipeline report: 3 numbers per rank, allocated up front */
    dt_adamw_hparams hp;
    dt_tokenfile train_tokens, val_tokens;
    dt_loader loader;
    uint16_t *inp, *tgt;
    int micro, accum, global_batch, T;
    int Tl;                     /* positions of each sequence this rank computes: T / parallel.cp */
    dt_train_state st;
    char resume_dir[1024];
    char val_path[DT_PATH_MAX]; /* data.val resolved ("" : no validation) */
    dt_tokenizer *tok;          /* for the final sample (loaded up front: a bad path fails at start) */
    int drop_old_run; /* rank 0: --overwrite found another run's steps, dropped after our first save */
    int saved;        /* saves done by this run */
    int async_save;   /* checkpoint.async where the layout allows it (dt_dp_set_async_save) */
    int save_pending; /* an async save not yet waited for */
    long long save_pending_step;
    double save_started;
    dt_metrics metrics;
    dt_progress progress;
    char *config_json;
    double *mem_all; /* the final memory report: 7 numbers per rank, allocated up front */
    double peak_flops; /* the whole job's peak FLOP/s, MFU's denominator (0: unknown) */
    const char *peak_source;
} trainer;

static dt_status choose_ops(const dt_config *c, const dt_ops **ops) {
    int bf16 = !strcmp(c->precision, "bf16");
    if (!strcmp(c->backend, "cuda")) DT_TRY(dt_ops_cuda(ops, bf16)); /* its GPU: dt_gpu_select */
    else if (!strcmp(c->backend, "emulated")) *ops = dt_ops_emulated(bf16 ? dt_ops_bf16_storage(dt_ops_cpu()) : dt_ops_cpu());
    else *ops = bf16 ? dt_ops_bf16_storage(dt_ops_cpu()) : dt_ops_cpu();
    if (c->log.profile) *ops = dt_ops_profiled(*ops);
    return DT_OK;
}

/* All ranks learn whether any failed (input errors win over runtime ones); only the
 * lowest failing rank reports its message, so an error prints once. */
static dt_status agree(trainer *t, dt_status s, int *report) {
    int first;
    /* a failure this rank only learnt of (an inner agreement) is not its own to report */
    int own = s != DT_OK && !dt_error_is_secondary();
    dt_status out = dt_comm_agree(t->world, own ? s : DT_OK, &first);
    if (s != DT_OK) out = s;
    if (first >= dt_comm_size(t->world)) first = 0;
    *report = out != DT_OK && dt_comm_rank(t->world) == first;
    return out;
}

static dt_status load_tokenizer(const dt_config *c, dt_tokenizer **tok) {
    if (!strcmp(c->data.tokenizer, "gpt2")) {
        if (!c->data.encoder_json[0] || !c->data.vocab_bpe[0])
            return dt_fail(DT_EINPUT, "config: data.tokenizer gpt2 needs data.encoder_json and data.vocab_bpe "
                           "(the GPT-2 BPE files) to print the sample (log.sample_tokens)");
        return dt_tokenizer_gpt2(tok, c->data.encoder_json, c->data.vocab_bpe);
    }
    return dt_tokenizer_byte(tok);
}

/* data.val "auto": PREFIX_val.bin beside a PREFIX_train.bin (what `dtrain prepare`
 * writes), if it exists; a validation file never comes from another corpus. */
static void resolve_val(const dt_config *c, char *out, size_t cap) {
    out[0] = 0;
    if (strcmp(c->data.val, "auto") != 0) {
        snprintf(out, cap, "%s", c->data.val);
        return;
    }
    static const char suffix[] = "_train.bin";
    size_t n = strlen(c->data.train), k = sizeof suffix - 1;
    if (n < k || strcmp(c->data.train + n - k, suffix) != 0 || n - k + 9 >= cap) return;
    snprintf(out, cap, "%.*s_val.bin", (int)(n - k), c->data.train);
    if (access(out, F_OK) != 0) out[0] = 0;
}

static dt_status read_data(const dt_config *c, trainer *t) {
    dt_config d;
    dt_config_defaults(&d);
    dt_status s = dt_tokenfile_read(&t->train_tokens, c->data.train, c->model.vocab_size);
    if (s != DT_OK && !strcmp(c->data.train, d.data.train) && access(c->data.train, F_OK) != 0) {
        dt_error_clear(); /* this message replaces the reader's */
        return dt_fail(DT_EINPUT, "data.train: the default corpus '%s' is not here (it is made by `make demo` in the "
                       "dtrain directory); set data.train to a token file (`dtrain prepare`)", c->data.train);
    }
    if (s != DT_OK) {
        dt_error_context("data.train");
        return s;
    }
    char note[1024];
    DT_TRY(dt_tokenfile_check(&t->train_tokens, "data.train", c->data.tokenizer, c->model.vocab_size, note,
                              sizeof note));
    if (note[0] && t->rank0) printf("dtrain: warning: %s\n", note);
    resolve_val(c, t->val_path, sizeof t->val_path);
    if (!t->val_path[0]) return DT_OK;
    s = dt_tokenfile_read(&t->val_tokens, t->val_path, c->model.vocab_size);
    if (s != DT_OK) {
        dt_error_context("data.val");
        return s;
    }
    DT_TRY(dt_tokenfile_check(&t->val_tokens, "data.val", c->data.tokenizer, c->model.vocab_size, note, sizeof note));
    if (note[0] && t->rank0) printf("dtrain: warning: %s\n", note);
    if (t->val_tokens.count < (size_t)t->T + 1)
        return dt_fail(DT_EINPUT, "data.val: '%s' is too short: %zu tokens, validation needs at least %d", t->val_path,
                       t->val_tokens.count, t->T + 1);
    return DT_OK;
}

/* Refuses a layout whose estimated memory (this rank's state, activations and the
 * largest workspace, times the ranks on this node) exceeds what the node has free:
 * better one line now than the OOM killer halfway through allocation. */
static dt_status check_memory(trainer *t, const dt_config *c) {
    /* on a GPU the state lives in device memory: an allocation failure there names the buffer */
    if (!c->train.check_memory || t->ops->on_device) return DT_OK;
    double need = dt_estimate_rank_bytes(c, t->dp) * dt_comm_local_size(t->world);
    double avail = dt_memory_available();
    if (avail <= 0 || need <= avail) return DT_OK;
    return dt_fail(DT_EINPUT, "memory: the model needs an estimated %.1f GB on this node (%d rank%s x %.1f GB; "
                   "`dtrain estimate`), but only %.1f GB is available; use a smaller model or batch, more ranks with "
                   "ZeRO, or --set train.check_memory=false to try anyway",
                   need / 1e9, dt_comm_local_size(t->world), dt_comm_local_size(t->world) > 1 ? "s" : "",
                   need / 1e9 / dt_comm_local_size(t->world), avail / 1e9);
}

/* A resumed run may change its learning-rate schedule; say so, with both. */
static dt_status note_schedule_change(trainer *t, const dt_config *c) {
    dt_config saved;
    DT_TRY(dt_ckpt_load_config(t->resume_dir, &saved));
    static const char *const keys[] = {"train.lr", "train.min_lr", "train.warmup_steps", "train.steps"};
    char buf[512];
    if (dt_config_changes(&saved, c, keys, 4, buf, sizeof buf) > 0)
        printf("dtrain: learning-rate schedule changed on resume: %s\n", buf);
    return DT_OK;
}

/* Local checks and data: no communication, so a failing rank cannot strand the others. */
static dt_status setup_local(trainer *t, const dt_config *cfg) {
    t->run_cfg = *cfg;
    t->cfg = &t->run_cfg;
    const dt_config *c = t->cfg;
    DT_TRY(dt_config_resolve_micro_batch(&t->run_cfg, dt_comm_size(t->world)));
    DT_TRY(dt_config_validate(c));
    if (c->train.freeze[0]) {
        gpt_shape fs = {c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.seq_len, c->model.vocab_size, 0};
        DT_TRY(gpt_shape_check(&fs));
        DT_TRY(gpt_freeze_check(&fs, c->train.freeze));
    }
    DT_TRY(dt_dp_check_config(c));
    dt_gpu_select(dt_comm_local_rank(t->world)); /* a GPU per rank of the node, whatever the launcher */
    DT_TRY(choose_ops(c, &t->ops));
    dt_cpu_set_threads(t->threads.threads);
    { /* the hang watchdog; its flight-recorder dumps go next to the metrics */
        char dir[DT_PATH_MAX] = "";
        const char *slash = strrchr(c->log.metrics, '/');
        if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - c->log.metrics), c->log.metrics);
        else if (c->log.metrics[0]) snprintf(dir, sizeof dir, ".");
        DT_TRY(dt_watchdog_arm(c->comm.timeout, dir));
    }
    t->T = c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len;
    t->micro = c->train.micro_batch;
    int world = dt_comm_size(t->world);
    long long model_par = (long long)c->parallel.tp * c->parallel.pp * c->parallel.cp;
    if (world % model_par != 0)
        return dt_fail(DT_EINPUT, "parallel: world size %d is not divisible by tp x pp x cp = %lld", world, model_par);
    DT_TRY(dt_cp_check_config(c));
    t->Tl = t->T / c->parallel.cp;
    DT_TRY(dt_tp_check(c));
    t->dp = world / (int)model_par;
    int per_step = t->micro * t->dp;
    t->global_batch = c->train.global_batch > 0 ? c->train.global_batch : per_step;
    if (t->global_batch % per_step != 0)
        return dt_fail(DT_EINPUT,
                       "config: train.micro_batch x data-parallel size = %d x %d does not divide train.global_batch %d",
                       t->micro, t->dp, t->global_batch);
    t->accum = t->global_batch / per_step;
    /* saved with checkpoints as it is, not as 0 ("micro x dp"): a resume on another dp
     * continues the same batches */
    t->run_cfg.train.global_batch = t->global_batch;
    t->run_cfg.train.grad_accum = 0; /* re-derived from it on a resume's dp */
    DT_TRY(dt_schedule_parse(c->parallel.schedule, &t->sched));
    DT_TRY(dt_pp_check(c, t->accum));

    if (c->log.sample_tokens > 0) DT_TRY(load_tokenizer(c, &t->tok)); /* the config's own files before the data */
    DT_TRY(read_data(c, t));
    DT_TRY(dt_loader_init(&t->loader, &t->train_tokens, t->T, t->global_batch, c->data.shuffle,
                          (uint64_t)c->train.seed));
    DT_TRY(check_memory(t, c));
    dt_rng_seed(&t->st.rng, (uint64_t)c->train.seed + 0x5eed);
    if (c->checkpoint.resume[0]) {
        DT_TRY(dt_ckpt_resolve(c->checkpoint.resume, t->resume_dir, sizeof t->resume_dir));
        DT_TRY(dt_ckpt_load_state(t->resume_dir, &t->st, NULL));
        if (t->st.data_pos % (unsigned long long)t->global_batch != 0)
            return dt_fail(DT_EINPUT, "checkpoint '%s': its data position %llu is not a whole number of global batches "
                           "of %d sequences: the run it continues used another train.global_batch (set that one)",
                           t->resume_dir, (unsigned long long)t->st.data_pos, t->global_batch);
        if (t->st.step > c->train.steps)
            return dt_fail(DT_EINPUT, "checkpoint '%s' is at step %lld, beyond train.steps %d", t->resume_dir,
                           t->st.step, c->train.steps);
        if (t->rank0) DT_TRY(note_schedule_change(t, c));
    }
    if (c->checkpoint.dir[0] && t->rank0) /* may refuse a directory in use: before any training */
        DT_TRY(dt_ckpt_prepare_dir(c->checkpoint.dir, c->checkpoint.resume[0] ? t->resume_dir : NULL,
                                   c->checkpoint.overwrite, &t->drop_old_run));
    size_t ntok = (size_t)t->micro * t->T;
    t->inp = malloc(ntok * sizeof(uint16_t));
    t->tgt = malloc(ntok * sizeof(uint16_t));
    t->mem_all = calloc((size_t)dt_comm_size(t->world) * 7, sizeof(double));
    t->pipe_all = calloc((size_t)dt_comm_size(t->world) * 3, sizeof(double));
    if (!t->inp || !t->tgt || !t->mem_all || !t->pipe_all) return dt_fail(DT_ERUNTIME, "out of memory (batch)");
    if (t->rank0) {
        DT_TRY(dt_metrics_open(&t->metrics, c->log.metrics, c->checkpoint.resume[0] != 0));
        if (c->checkpoint.resume[0]) dt_metrics_resume(&t->metrics, t->st.step, t->resume_dir);
    }
    return DT_OK;
}

/* The job's peak FLOP/s: log.peak_gflops per rank when set, else a GPU's dense bf16
 * datasheet rate, else each rank's SGEMM rate measured now with its threads, all ranks at
 * once (ranks sharing cores share them here as in training), summed over ranks. Unknown
 * on any rank (a GPU not in the table): no MFU. */
static dt_status measure_peak(trainer *t) {
    const dt_config *c = t->cfg;
    double mine = c->log.peak_gflops * 1e9;
    t->peak_source = "log.peak_gflops";
    if (mine <= 0 && !strcmp(c->backend, "cuda")) {
        mine = dt_gpu_bf16_peak();
        t->peak_source = "dense bf16 datasheet";
    } else if (mine <= 0) {
        mine = dt_cpu_sgemm_peak(0.1);
        t->peak_source = "measured SGEMM";
    }
    double v[2] = {mine, mine <= 0};
    if (dt_comm_size(t->world) > 1) DT_TRY(dt_allreduce(t->world, v, 2, DT_F64, DT_SUM));
    t->peak_flops = v[1] > 0 ? 0.0 : v[0];
    return DT_OK;
}

/* Model, engine and weights (the engine's collectives run only after all ranks agreed). */
static dt_status setup_model(trainer *t, const dt_config *c) {
    DT_TRY(dt_mesh_create(&t->mesh, t->world, c->parallel.tp, c->parallel.pp, c->parallel.cp));
    t->dp_rank = t->mesh.dp_rank;
    static const struct { int coll; size_t off; } algo_keys[] = {
        {DT_COLL_ALLREDUCE, offsetof(dt_config, comm.allreduce)},
        {DT_COLL_REDUCE_SCATTER, offsetof(dt_config, comm.reduce_scatter)},
        {DT_COLL_ALLGATHER, offsetof(dt_config, comm.allgather)},
        {DT_COLL_BCAST, offsetof(dt_config, comm.bcast)},
    };
    for (size_t i = 0; i < sizeof algo_keys / sizeof algo_keys[0]; i++) {
        dt_algo a;
        DT_TRY(dt_algo_parse((const char *)c + algo_keys[i].off, &a));
        DT_TRY(dt_comm_set_algo(t->mesh.dp_comm, (dt_coll)algo_keys[i].coll, a));
        DT_TRY(dt_comm_set_algo(t->mesh.dp_cp_comm, (dt_coll)algo_keys[i].coll, a));
    }
    gpt_shape shape = {c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.seq_len, c->model.vocab_size, 0};
    gpt_layout layout = {.tp = t->mesh.tp, .tp_rank = t->mesh.tp_rank, .sp = c->parallel.sp,
                         .recompute = !strcmp(c->train.recompute, "full")};
    if (t->mesh.pp > 1) { /* this rank's stage: its blocks (or chunks), and the activation slots its schedule needs */
        int v = c->parallel.virtual_stages;
        DT_TRY(dt_pp_layout(c->model.n_layer, t->mesh.pp, v, t->mesh.pp_rank, c->parallel.pp_split, &layout));
        layout.slots = dt_pp_slots(t->sched, t->mesh.pp, v, t->mesh.pp_rank, t->accum);
        layout.split_backward = dt_schedule_splits_backward(t->sched);
    }
    /* activations are rank-local; the data-parallel setup below is collective */
    DT_TRY(dt_comm_agree(t->world,
                         gpt_create_layout(&t->model, &shape, t->ops, t->micro, t->Tl, 0, &layout),
                         NULL));
    if (c->train.freeze[0]) gpt_freeze(&t->model, c->train.freeze, NULL);
    DT_TRY(dt_comm_agree(t->world, dt_tp_attach(&t->model, t->mesh.tp_comm), NULL));
    DT_TRY(dt_comm_agree(t->world, dt_cp_attach(&t->model, t->mesh.cp_comm, t->micro, t->T), NULL));
    t->hp = (dt_adamw_hparams){c->train.lr, c->train.min_lr, c->train.beta1, c->train.beta2, c->train.eps,
                               c->train.weight_decay, c->train.grad_clip, c->train.warmup_steps, c->train.steps};
    dt_dp_opts o = {!strcmp(c->parallel.dp_mode, "ps"), c->parallel.zero,
                    (size_t)(c->parallel.bucket_mb * 1024.0 * 1024.0), !strcmp(c->parallel.determinism, "bitwise"),
                    c->parallel.overlap, t->accum,
                    {t->mesh.tp > 1 ? t->mesh.tp_comm : NULL, t->mesh.pp > 1 ? t->mesh.pp_comm : NULL,
                     t->mesh.pp > 1 && t->mesh.in_emb ? t->mesh.emb_comm : NULL},
                    t->mesh.pp > 1, NULL};
    /* gradients are reduced over data-parallel and context-parallel ranks together */
    dt_comm *dpc = t->mesh.cp > 1 ? t->mesh.dp_cp_comm : t->mesh.dp_comm;
    if (!strcmp(c->comm.backend, "nccl")) { /* dt_dp_check_config: a device, pure data parallelism */
        if (!strcmp(c->backend, "cuda")) DT_TRY(dt_dcomm_nccl(dpc, &t->dcomm));
        else DT_TRY(dt_dcomm_emulated(dpc, dt_emulated_host, &t->dcomm));
        o.dcomm = t->dcomm;
    }
    DT_TRY(dt_dp_create(&t->dpe, dpc, &t->model, &t->hp, &o));
    t->async_save = dt_dp_set_async_save(t->dpe, c->checkpoint.async);
    if (c->checkpoint.async && !t->async_save && t->rank0)
        printf("dtrain: note: checkpoint.async applies where rank 0 writes alone (no tp, pp or cp); saving "
               "synchronously\n");
    if (t->mesh.pp > 1)
        DT_TRY(dt_pipeline_create(&t->pipe, &t->model, t->mesh.pp_comm, t->sched, c->parallel.virtual_stages, t->accum,
                                  t->micro, t->Tl));
    if (c->checkpoint.resume[0]) { /* the trainer state was read in setup_local */
        DT_TRY(dt_dp_load(t->dpe, t->resume_dir, t->st.step));
        DT_TRY(dt_loader_seek(&t->loader, t->st.data_epoch, (size_t)t->st.data_pos));
    } else {
        DT_TRY(dt_dp_init_weights(t->dpe, (uint64_t)c->train.seed, c->train.init_from));
    }
    t->config_json = dt_config_to_json(c);
    return DT_OK;
}

static void teardown(trainer *t) {
    dt_metrics_close(&t->metrics);
    dt_tokenizer_free(t->tok);
    free(t->mem_all);
    free(t->pipe_all);
    free(t->config_json);
    free(t->inp);
    free(t->tgt);
    dt_pipeline_destroy(t->pipe);
    /* collectives still queued (a failed step's) end before the buffers they use are
     * freed: drained, or aborted after a failure (a peer may never issue its side) */
    dt_dcomm_free(t->dcomm, t->failed);
    t->dcomm = NULL;
    dt_dp_destroy(t->dpe);
    dt_cp_detach(&t->model);
    dt_tp_detach(&t->model);
    gpt_destroy(&t->model);
    dt_mesh_destroy(&t->mesh);
    dt_loader_free(&t->loader);
    dt_tokenfile_free(&t->train_tokens);
    dt_tokenfile_free(&t->val_tokens);
}

/* Context parallelism: of the micro-batch's whole sequences in t->inp/t->tgt (micro x T),
 * keep this rank's positions (micro x Tl, in place: every kept entry moves left). */
static void cp_select(trainer *t) {
    const int *pos = t->model.cp_comm.positions;
    if (!pos) return;
    for (int b = 0; b < t->micro; b++)
        for (int i = 0; i < t->Tl; i++) {
            t->inp[(size_t)b * t->Tl + i] = t->inp[(size_t)b * t->T + pos[i]];
            t->tgt[(size_t)b * t->Tl + i] = t->tgt[(size_t)b * t->T + pos[i]];
        }
}

/* The pipeline runner's view of the data: validation fills t->inp/t->tgt itself (one
 * micro-batch per call); training takes micro-step mb of this data-parallel rank. */
static void fill_current(void *ctx, int mb, uint16_t *tokens, uint16_t *targets) {
    trainer *t = ctx;
    (void)mb;
    size_t n = (size_t)t->micro * t->Tl * sizeof(uint16_t);
    memcpy(tokens, t->inp, n);
    memcpy(targets, t->tgt, n);
}
static void fill_step(void *ctx, int mb, uint16_t *tokens, uint16_t *targets) {
    trainer *t = ctx;
    dt_loader_fill(&t->loader, (mb * t->dp + t->dp_rank) * t->micro, t->micro, t->inp, t->tgt);
    cp_select(t);
    size_t n = (size_t)t->micro * t->Tl * sizeof(uint16_t);
    memcpy(tokens, t->inp, n);
    memcpy(targets, t->tgt, n);
}
static void micro_step(void *ctx, int last) { dt_dp_begin_micro(((trainer *)ctx)->dpe, last); }

/* Mean loss over val_batches micro-batches of consecutive windows of the val file,
 * spread over data-parallel ranks. Every rank runs the same number of forwards (ZeRO-3
 * gathers are collective); surplus ones count for nothing. With parallel.micro_batches
 * the micro-batch depends on dp, so a validation batch is dp micro-batches (global_batch /
 * m sequences, the same in every layout). */
static dt_status validate(trainer *t, double *out) {
    size_t nwin = (t->val_tokens.count - 1) / (size_t)t->T;
    long long nb_want = (long long)t->cfg->train.val_batches * (t->cfg->parallel.micro_batches > 0 ? t->dp : 1);
    /* at most the file's distinct windows: more would count some twice, and a huge
     * val_batches would run for ever */
    long long nb_have = (long long)(nwin / (size_t)t->micro) > 0 ? (long long)(nwin / (size_t)t->micro) : 1;
    int nb = (int)(nb_want < nb_have ? nb_want : nb_have);
    int rounds = (nb + t->dp - 1) / t->dp;
    double acc[2] = {0.0, 0.0}; /* loss sum, tokens */
    for (int i = 0; i < rounds; i++) {
        int b = i * t->dp + t->dp_rank;
        size_t w = (size_t)(b < nb ? b : 0) * (size_t)t->micro;
        for (int k = 0; k < t->micro; k++, w++)
            dt_loader_window(&t->val_tokens, t->T, w % nwin, t->inp + (size_t)k * t->T, t->tgt + (size_t)k * t->T);
        cp_select(t);
        double l;
        if (t->pipe) {
            dt_pp_io io = {fill_current, NULL, t};
            DT_TRY(dt_pipeline_eval(t->pipe, &io, 1, &l));
        } else {
            DT_TRY(gpt_eval_loss(&t->model, t->inp, t->tgt, t->micro, t->Tl, &l));
        }
        if (b < nb) {
            acc[0] += l;
            acc[1] += (double)t->micro * t->Tl;
        }
    }
    DT_TRY(dt_allreduce(t->mesh.cp > 1 ? t->mesh.dp_cp_comm : t->mesh.dp_comm, acc, 2, DT_F64, DT_SUM));
    *out = acc[0] / acc[1];
    return DT_OK;
}

/* One optimizer step; *loss = mean loss over the global batch. Micro-step k of
 * data-parallel rank r takes sequences [(k·dp + r)·micro, +micro) of the global batch,
 * so the batch's content never depends on the layout. */
/* Rank 0: the batch of the coming step starts a new pass over the training file. */
static void note_epoch(trainer *t) {
    long long step = t->st.step + 1, epoch = t->loader.epoch + 1; /* both 1-based, as printed */
    dt_progress_note(&t->progress, "data: epoch %lld begins at step %lld (train file has %zu windows of %d tokens)",
                     epoch, step, t->loader.nseq, t->T);
    dt_metrics_epoch(&t->metrics, step, epoch);
}

static dt_status train_step(trainer *t, double *loss, double *grad_norm, double *lr) {
    dt_watchdog_step(t->st.step + 1, 0);
    dt_dp_begin_step(t->dpe);
    dt_loader_next_batch(&t->loader);
    if (t->rank0 && dt_loader_starts_epoch(&t->loader)) note_epoch(t);
    float grad_scale = 1.0f / ((float)t->global_batch * (float)t->T);
    double sum = 0.0;
    if (t->pipe) { /* the schedule runs every micro-step of the step */
        dt_pp_io io = {fill_step, micro_step, t};
        DT_TRY(dt_pipeline_step(t->pipe, &io, grad_scale, &sum));
    }
    for (int k = 0; !t->pipe && k < t->accum; k++) {
        dt_loader_fill(&t->loader, (k * t->dp + t->dp_rank) * t->micro, t->micro, t->inp, t->tgt);
        cp_select(t);
        dt_watchdog_micro(k);
        dt_dp_begin_micro(t->dpe, k == t->accum - 1);
        double l;
        DT_TRY(gpt_forward_backward(&t->model, t->inp, t->tgt, t->micro, t->Tl, grad_scale, &l));
        sum += l;
    }
    *lr = dt_lr_at(&t->hp, t->st.step);
    DT_TRY(dt_dp_end_step(t->dpe, *lr, grad_norm));
    DT_TRY(t->ops->sync()); /* a device failure during the step surfaces here */
    if (t->dp * t->mesh.cp > 1) /* context-parallel ranks hold the other positions */
        DT_TRY(dt_allreduce(t->mesh.cp > 1 ? t->mesh.dp_cp_comm : t->mesh.dp_comm, &sum, 1, DT_F64, DT_SUM));
    t->st.step++;
    dt_watchdog_step(t->st.step, -1); /* validation, saves: "after step N" */
    t->st.data_epoch = t->loader.epoch;
    t->st.data_pos = t->loader.pos;
    *loss = sum / ((double)t->global_batch * t->T);
    return DT_OK;
}

/* After a save has committed: --overwrite's old steps and keep_last's surplus removed
 * (rank 0 alone touches the directory; the condition is the same on every rank). */
static dt_status after_commit(trainer *t) {
    const dt_config *c = t->cfg;
    if ((c->checkpoint.overwrite && t->saved == 1) || c->checkpoint.keep_last > 0) {
        int report;
        DT_TRY(agree(t, t->rank0 ? dt_ckpt_prune(c->checkpoint.dir, c->checkpoint.keep_last, t->drop_old_run) : DT_OK,
                     &report));
        t->drop_old_run = 0;
    }
    return DT_OK;
}

/* Rank 0's line once a save has committed: its size and time. */
static void note_saved(trainer *t, long long step, double seconds, const char *how) {
    double bytes = 0;
    if (dt_ckpt_latest_bytes(t->cfg->checkpoint.dir, &bytes) != DT_OK) dt_error_clear(); /* the size is a nicety */
    dt_progress_note(&t->progress, "checkpoint: saved step %lld to %s (%.1f MB%s, %.2f s)", step,
                     t->cfg->checkpoint.dir, bytes / 1e6, how, seconds);
}

/* checkpoint.async: the save in flight, if any, finished and committed (collective). */
static dt_status finish_save(trainer *t) {
    if (!t->save_pending) return DT_OK;
    t->save_pending = 0;
    DT_TRY(dt_dp_save_wait(t->dpe));
    if (t->rank0) note_saved(t, t->save_pending_step, dt_now() - t->save_started, ", in the background");
    return after_commit(t);
}

static dt_status save(trainer *t) {
    const dt_config *c = t->cfg;
    DT_TRY(finish_save(t)); /* one save in flight at a time */
    if (t->rank0)
        dt_progress_note(&t->progress, "checkpoint: saving step %lld to %s%s", t->st.step, c->checkpoint.dir,
                         t->async_save ? " (written in the background)" : "");
    double t0 = dt_now();
    DT_TRY(dt_dp_save(t->dpe, c->checkpoint.dir, &t->st, t->config_json, c->checkpoint.shard_mb));
    t->saved++;
    if (t->async_save) { /* gathered; rank 0's child writes and commits while training goes on */
        t->save_pending = 1;
        t->save_pending_step = t->st.step;
        t->save_started = t0;
        return DT_OK;
    }
    DT_TRY(after_commit(t));
    if (t->rank0) note_saved(t, t->st.step, dt_now() - t0, "");
    return DT_OK;
}

static dt_status pipe_logits(void *ctx, const uint16_t *tokens, int T, float *logits) {
    return dt_pipeline_next_logits(ctx, tokens, T, logits);
}

/* On the first data-parallel replica: every tensor-parallel and pipeline rank of it runs
 * the model (its logits are vocabulary-parallel; a pipeline passes the sequence through
 * its stages and broadcasts the last stage's logits), drawing the same tokens; rank 0
 * prints. */
static dt_status print_sample(trainer *t) {
    dt_sample_opts o = {t->cfg->log.sample_tokens, 0.8, 40};
    dt_rng rng;
    dt_rng_seed(&rng, (uint64_t)t->cfg->train.seed);
    FILE *out = t->rank0 ? stdout : fopen("/dev/null", "w");
    if (!out) return dt_fail(DT_ERUNTIME, "cannot open /dev/null for the sample");
    if (t->rank0) printf("--- sample (%d tokens, temperature 0.8, top-k 40) ---\n", o.length);
    gpt_hooks hooks = t->model.hooks; /* the full weights are in place: no per-unit gathers */
    memset(&t->model.hooks, 0, sizeof hooks);
    dt_status s = t->pipe ? dt_generate_with(pipe_logits, t->pipe, t->model.shape.vocab_size, t->model.max_T, t->tok,
                                             "", &o, &rng, out)
                          : dt_generate(&t->model, t->tok, "", &o, &rng, out);
    t->model.hooks = hooks;
    if (t->rank0) printf("---\n");
    else fclose(out);
    return s;
}

/* Whether any rank received SIGINT/SIGTERM (every rank learns the same answer). */
static dt_status stop_requested(trainer *t, int *sig) {
    static const int sigs[3] = {SIGINT, SIGTERM, SIGUSR1};
    int mine = dt_signal_pending();
    double v[3];
    for (int i = 0; i < 3; i++) v[i] = mine == sigs[i];
    if (dt_comm_size(t->world) > 1) DT_TRY(dt_allreduce(t->world, v, 3, DT_F64, DT_SUM));
    /* decided from the reduced values only: a signal arriving during the all-reduce
     * is seen by every rank at the next step, not by this rank now */
    *sig = 0;
    for (int i = 0; i < 3; i++)
        if (v[i] > 0 && (!*sig || sigs[i] == mine)) *sig = sigs[i];
    if (*sig) dt_signal_record(*sig); /* a rank learning of another rank's signal */
    return DT_OK;
}

/* Before the model is built (a big model takes a while to allocate and initialise):
 * everything here comes from the config, the data and the layout's arithmetic. */
static void print_header(trainer *t) {
    const dt_config *c = t->cfg;
    gpt_shape shape = {c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.seq_len, c->model.vocab_size, 0};
    gpt_shape_check(&shape); /* validated in setup_local: fills padded_vocab */
    int tp = c->parallel.tp, cp = c->parallel.cp, pp = c->parallel.pp;
    char thr[256];
    dt_threads_describe(&t->threads, thr, sizeof thr);
    printf("dtrain: GPT-2 %d layers, %d heads, %d wide, seq %d, vocab %d (padded %d): %.2fM parameters\n",
           c->model.n_layer, c->model.n_head, c->model.n_embd, t->T, c->model.vocab_size, shape.padded_vocab,
           (double)gpt_shape_params(&shape) / 1e6);
    printf("dtrain: global batch %d x %d tokens (micro-batch %d x %d data-parallel x %d accumulation), %d "
           "steps, %s, %s%s, %s\n",
           t->global_batch, t->T, t->micro, t->dp, t->accum, c->train.steps, c->precision,
           !strcmp(c->parallel.dp_mode, "ps") ? "ps" : "ddp", c->parallel.zero ? " + ZeRO" : "",
           !strcmp(c->backend, "cuda") ? dt_gpu_name() : dt_cpu_blas_info());
    printf("dtrain: threads %s\n", thr); /* the count, and where it came from */
    printf("dtrain: data %s (%zu tokens), validation %s\n", c->data.train, t->train_tokens.count,
           t->val_path[0] ? t->val_path : "none");
    if (c->parallel.zero) printf("dtrain: ZeRO stage %d\n", c->parallel.zero);
    if (!strcmp(c->train.recompute, "full")) printf("dtrain: activation checkpointing: every block recomputed in its backward\n");
    if (tp > 1)
        printf("dtrain: tensor parallel %d (heads and MLP columns split%s; %d-way data parallel over the rest)\n", tp,
               c->parallel.sp ? ", sequence parallel: LayerNorm and residual rows split" : "", t->dp);
    if (cp > 1) { /* the causal work of each rank's two chunks */
        int64_t lo = INT64_MAX, hi = 0;
        for (int r = 0; r < cp; r++) {
            int64_t w = dt_cp_attention_pairs(t->T, cp, r);
            lo = w < lo ? w : lo;
            hi = w > hi ? w : hi;
        }
        printf("dtrain: context parallel %d (ring attention; each rank holds 2 of %d sequence chunks, %d positions; "
               "attention pairs per rank %lld, imbalance %.1f%%)\n", cp, 2 * cp, t->Tl, (long long)hi,
               100.0 * (double)(hi - lo) / (double)hi);
    }
    if (pp > 1) {
        int v = c->parallel.virtual_stages;
        printf("dtrain: pipeline parallel %d (%s, %d micro-batches per step), blocks per stage:", pp,
               dt_schedule_name(t->sched), t->accum);
        for (int r = 0; r < pp; r++) {
            gpt_layout lay = {0};
            if (dt_pp_layout(c->model.n_layer, pp, v, r, c->parallel.pp_split, &lay) != DT_OK) continue;
            if (v <= 1) printf(" [%d, %d)", lay.first_layer, lay.first_layer + lay.n_layers);
            for (int k = 0; v > 1 && k < v; k++)
                printf("%s[%d, %d)%s", k ? " " : " {", lay.chunk_first[k], lay.chunk_first[k] + lay.chunk_layers[k],
                       k == v - 1 ? "}" : "");
        }
        printf("\n");
    }
    if (t->st.step > 0) printf("dtrain: resumed at step %lld from %s\n", t->st.step, t->resume_dir);
    else if (c->train.init_from[0]) printf("dtrain: weights from %s (train.init_from)\n", c->train.init_from);
    printf("dtrain: building the model and %s...\n",
           t->st.step > 0 ? "loading its checkpoint" : c->train.init_from[0] ? "loading its weights" : "initialising its weights");
    fflush(stdout);
}

/* Once the model exists: what only it knows, and how long building it took. */
static void print_model_ready(trainer *t, double seconds) {
    const dt_config *c = t->cfg;
    if (c->train.freeze[0]) {
        size_t n = 0, all = 0;
        for (int i = 0; i < t->model.ntensors; i++) {
            all += t->model.tensors[i].numel;
            if (t->model.tensors[i].frozen) n += t->model.tensors[i].numel;
        }
        printf("dtrain: frozen (train.freeze %s): %zu of rank 0's %zu parameters\n", c->train.freeze, n, all);
    }
    printf("dtrain: model ready in %.1f s\n", seconds);
    fflush(stdout);
}

/* Per stage (the first data-parallel and tensor-parallel rank of each): compute and
 * waiting time per step, the measured bubble (1 - compute / time in the schedule) next to
 * the schedule's formula, and the activation bytes the stage holds. */
static void print_pipeline(const trainer *t, long long steps) {
    const dt_mesh *g = &t->mesh;
    double busy = 0, span = 0;
    printf("pipeline: %s, %d stages, %d micro-batches per step; per stage (ms/step compute, waiting; activations):",
           dt_schedule_name(t->sched), g->pp, t->accum);
    for (int r = 0; r < g->pp; r++) {
        const double *x = t->pipe_all + 3 * dt_mesh_rank_of(0, r, 0, 0, g->pp, g->cp, g->tp);
        printf(" %s%.1f, %.1f; %.1f MB", r ? "| " : "", 1e3 * x[0] / steps, 1e3 * x[1] / steps,
               t->mem_all[7 * dt_mesh_rank_of(0, r, 0, 0, g->pp, g->cp, g->tp) + 3] / 1e6);
        busy += x[0];
        span += x[2];
    }
    int zb = dt_schedule_splits_backward(t->sched), v = t->cfg->parallel.virtual_stages;
    printf("\npipeline bubble: measured %.3f, formula %s = %.3f\n", 1.0 - busy / span,
           zb ? "(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W)) with F:B:W = 1:1:1"
              : v > 1 ? "(p-1)/(v·m+p-1)" : "(p-1)/(m+p-1)",
           dt_schedule_bubble_formula(t->sched, g->pp, v, t->accum, 1.0, zb ? 1.0 : 2.0, 1.0));
}

static dt_status run(trainer *t) {
    const dt_config *c = t->cfg;
    long long steps = c->train.steps;
    double flops_tok = gpt_flops_per_token(&t->model.shape, t->T);
    dt_progress_init(&t->progress, steps, c->log.every, c->log.progress);
    double train_time = 0.0, loss = NAN;
    long long first = t->st.step, timed_steps = 0;
    double tokens_per_step = (double)t->global_batch * t->T;
    long long stop = c->train.stop_after > 0 && first + c->train.stop_after < steps ? first + c->train.stop_after : steps;
    int sig = 0;
    while (t->st.step < stop) {
        double t0 = dt_now(), c0 = dt_dp_comm_seconds(t->dpe), norm, lr;
        DT_TRY(train_step(t, &loss, &norm, &lr));
        dt_test_fault(t->st.step, dt_comm_rank(t->world));
        dt_heartbeat(t->st.step, dt_comm_rank(t->world));
        if (c->log.profile && timed_steps == 0 && t->st.step < stop) dt_ops_profile_reset();
        double dt = dt_now() - t0;
        if (!isfinite(loss)) /* the loss is all-reduced: every rank stops together */
            return dt_fail(DT_ERUNTIME, "training diverged: loss is %g at step %lld", loss, t->st.step);
        train_time += dt;
        timed_steps++;
        double tps = tokens_per_step / dt;
        double eta = train_time / (double)timed_steps * (double)(steps - t->st.step);
        if (t->rank0) {
            dt_metrics_step(&t->metrics, t->st.step, loss, lr, norm, t->st.step * (long long)tokens_per_step, tps,
                            dt * 1e3, t->dp * t->mesh.cp > 1 && !t->dcomm ? 1e3 * (dt_dp_comm_seconds(t->dpe) - c0) : -1.0,
                            t->peak_flops > 0 ? tps * flops_tok / t->peak_flops : -1.0);
            dt_progress_step(&t->progress, t->st.step, loss, lr, norm, tps, dt * 1e3, eta);
        }
        int last = t->st.step == stop;
        if (t->val_path[0] && c->train.val_every > 0 && (t->st.step % c->train.val_every == 0 || last)) {
            double vl;
            DT_TRY(validate(t, &vl));
            if (t->rank0) {
                dt_metrics_val(&t->metrics, t->st.step, vl);
                dt_progress_note(&t->progress, "val: step %lld | val_loss %.4f", t->st.step, vl);
            }
        }
        DT_TRY(stop_requested(t, &sig));
        if (sig) break;
        if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && t->st.step % c->checkpoint.every == 0 && !last)
            DT_TRY(save(t));
    }
    if (t->rank0) dt_progress_end(&t->progress);
    if (c->checkpoint.dir[0] && (t->st.step > first || !c->checkpoint.resume[0])) DT_TRY(save(t));
    DT_TRY(finish_save(t)); /* the run ends with its last checkpoint committed */
    double tps = timed_steps > 0 ? tokens_per_step * (double)timed_steps / train_time : 0.0;
    /* per-rank memory, gathered to every rank as 6 numbers each, plus rank 0's metrics status */
    int n = dt_comm_size(t->world);
    dt_mem_report mine;
    dt_dp_memory(t->dpe, &mine);
    mine.activations = t->model.act_bytes;
    if (t->mesh.cp > 1) /* the ring's K/V buffers, as the estimator counts them */
        mine.workspace += dt_cp_ring_bytes(t->micro, t->T, t->mesh.cp, t->model.shape.n_embd, t->mesh.tp);
    mine.peak_rss = dt_peak_rss();
    double me[7] = {(double)mine.params, (double)mine.grads, (double)mine.optim, (double)mine.activations,
                    (double)mine.workspace, (double)mine.peak_rss, t->rank0 && t->metrics.fail_step >= 0};
    double *all = t->mem_all;
    DT_TRY(dt_allgather(t->world, me, all, 7, DT_F64));
    if (t->pipe) { /* every stage's busy, waiting and pipeline time, for rank 0's report */
        double pt[3];
        dt_pipeline_times(t->pipe, &pt[0], &pt[1], &pt[2]);
        DT_TRY(dt_allgather(t->world, pt, t->pipe_all, 3, DT_F64));
    }
    if (all[6] != 0.0) /* rank 0's metrics could not be written: an error on every rank, reported by rank 0 */
        return t->rank0 ? dt_metrics_close(&t->metrics)
                        : dt_fail(DT_ERUNTIME, "rank 0 could not write the metrics file");
    if (t->rank0) {
        dt_mem_report mem[n];
        for (int r = 0; r < n; r++)
            mem[r] = (dt_mem_report){(size_t)all[7 * r], (size_t)all[7 * r + 1], (size_t)all[7 * r + 2],
                                     (size_t)all[7 * r + 3], (size_t)all[7 * r + 5], (size_t)all[7 * r + 4]};
        double mfu = t->peak_flops > 0 ? tps * flops_tok / t->peak_flops : -1.0;
        dt_metrics_summary(&t->metrics, t->st.step, t->st.step - first, loss, tps, mfu, mem, n);
        DT_TRY(dt_metrics_close(&t->metrics));
        char mfu_text[160] = "";
        if (mfu >= 0)
            snprintf(mfu_text, sizeof mfu_text, " (MFU %.1f%% of %.1f GFLOP/s, %s peak)", 100.0 * mfu,
                     t->peak_flops / 1e9, t->peak_source);
        if (timed_steps > 0)
            printf("summary: %lld steps (from %lld), final loss %.4f, %.0f tokens/s, %.1f GFLOP/s%s, %.1f s; "
                   "memory (rank 0): params %.1f MB, grads %.1f MB, optimizer %.1f MB, activations %.1f MB, "
                   "workspace %.1f MB, peak RSS %.1f MB\n",
                   t->st.step - first, first, loss, tps, tps * flops_tok / 1e9, mfu_text, train_time, mem[0].params / 1e6,
                   mem[0].grads / 1e6, mem[0].optim / 1e6, mem[0].activations / 1e6, mem[0].workspace / 1e6,
                   mem[0].peak_rss / 1e6);
        else
            printf("summary: nothing to train (at step %lld of %lld)\n", t->st.step, steps);
        if (!strcmp(c->backend, "cuda") && timed_steps > 0)
            printf("gpu: %s, peak device memory %.2f GB (rank 0)\n", dt_gpu_name(), (double)dt_gpu_peak_bytes() / 1e9);
        if (t->mesh.tp > 1 && timed_steps > 0)
            printf("tensor-parallel communication: %.1f ms/step (%s inside forward and backward, validation "
                   "included, rank 0)\n", 1e3 * dt_tp_comm_seconds(&t->model) / (double)timed_steps,
                   t->model.sp ? "all-gathers, reduce-scatters and all-reduces" : "all-reduces");
        if (t->pipe && timed_steps > 0) print_pipeline(t, timed_steps);
        if (t->dcomm && timed_steps > 0) /* the host only queues them: their waits are the GPU's */
            printf("communication: data-parallel collectives on the device communicator's stream (%s); exposed "
                   "time not measured\n", dt_dcomm_name(t->dcomm));
        else if (t->dp * t->mesh.cp > 1 && timed_steps > 0)
            printf("communication: %.1f ms/step exposed (waiting on gradient/parameter collectives, rank 0)\n",
                   1e3 * dt_dp_comm_seconds(t->dpe) / (double)timed_steps);
        if (c->log.profile) dt_ops_profile_report(stdout);
    }
    if (sig) /* after the summary (the metrics file ends with it), before the digest and sample */
        return dt_fail(DT_EINTERRUPTED, "stopped by %s after step %lld; %s%s%s", dt_signal_name(sig), t->st.step,
                       c->checkpoint.dir[0] ? "saved, resume with --resume " : "nothing saved (no checkpoint.dir)",
                       c->checkpoint.dir[0] ? c->checkpoint.dir : "", "");
    if (c->log.digest) {
        char hex[65];
        DT_TRY(dt_dp_digest(t->dpe, hex));
        if (t->rank0) printf("digest sha256:%s\n", hex);
    }
    if (c->log.sample_tokens > 0) {
        DT_TRY(dt_dp_gather_full(t->dpe));
        dt_status s = t->mesh.dp_rank == 0 ? print_sample(t) : DT_OK;
        dt_dp_release_full(t->dpe);
        DT_TRY(s);
    }
    return DT_OK;
}

dt_status dt_train_run(const dt_config *cfg, dt_comm *world, int *report) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.world = world;
    t.rank0 = dt_comm_rank(world) == 0;
    dt_heartbeat_start(dt_comm_rank(world)); /* the launcher's start-up watchdog: this rank is up */
    dt_test_fault(-1, dt_comm_rank(world));
    dt_status s = agree(&t, dt_threads_choose(world, cfg->threads, &t.threads), report);
    if (s == DT_OK && dt_comm_local_rank(world) == 0) { /* once per node */
        char w[512];
        dt_threads_warning(&t.threads, w, sizeof w);
        if (w[0]) fprintf(stderr, "%s\n", w);
    }
    if (s == DT_OK) s = agree(&t, setup_local(&t, cfg), report);
    if (s == DT_OK) s = agree(&t, measure_peak(&t), report);
    if (s == DT_OK && t.rank0) print_header(&t);
    double built = dt_now();
    if (s == DT_OK) s = agree(&t, setup_model(&t, t.cfg), report);
    if (s == DT_OK && t.rank0) print_model_ready(&t, dt_now() - built);
    if (s == DT_OK) {
        /* from here on a failure on one rank (I/O, divergence) is seen by all through
         * the collectives it breaks, or reported by every rank alike */
        s = run(&t);
        /* the report comes from the lowest rank whose failure is its own (the others
         * only learnt of it), or rank 0 */
        int first;
        dt_comm_agree(world, s != DT_OK && !dt_error_is_secondary() ? s : DT_OK, &first);
        if (first >= dt_comm_size(world)) first = 0;
        *report = s != DT_OK && dt_comm_rank(world) == first;
    }
    t.failed = s != DT_OK;
    teardown(&t);
    return s;
}
