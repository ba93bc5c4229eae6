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
#include "../ckpt/rank_state.h"
#include "async_ps.h"
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
#include "../parallel/layout/estimate.h"
#include "../parallel/layout/layout.h"
#include "../parallel/parallelize.h"
#include "metrics.h"
#include "progress.h"
#include "sample.h"

/* the final memory report's numbers per rank (dt_mem_report's, rank 0's metrics status) */
enum { MEM_NUMBERS = 9 };

typedef struct {
    const dt_config *cfg; /* &L.cfg: the caller's config with the batch keys resolved for this world */
    dt_layout L;
    const dt_ops *ops;
    dt_comm *world;
    dt_threads_plan threads; /* OpenMP/BLAS threads of this rank, chosen among the node's ranks */
    int rank0;
    dt_par *par; /* the model, its parallel layout, the data-parallel engine */
    int failed;  /* the run ends with an error (teardown aborts queued device collectives) */
    dt_tokenfile train_tokens, val_tokens;
    dt_loader loader;
    size_t val_window; /* validation: the first window of the micro-batch being filled */
    dt_train_state st;
    char resume_dir[1024];
    char val_path[DT_PATH_MAX]; /* data.val resolved ("" : no validation) */
    dt_tokenizer *tok;          /* for the final sample (loaded up front: a bad path fails at start) */
    int drop_old_run; /* rank 0: --overwrite found another run's steps, dropped after our first save */
    int saved;        /* saves done by this run */
    int save_pending; /* an async save not yet waited for */
    long long save_pending_step;
    long long loss_tokens; /* the current step's targets in the loss (its token-exact divisor) */
    long long real_tokens; /* and its input tokens that are data, not padding (tokens/s, MFU) */
    dt_rows rows;          /* data.layout */
    double save_started;
    dt_metrics metrics;
    dt_progress progress;
    char *config_json;
    double *mem_all; /* the final memory report: MEM_NUMBERS per rank, allocated up front */
    double peak_flops; /* the whole job's peak FLOP/s, MFU's denominator (0: unknown) */
    const char *peak_source;
    long long async_at; /* dp_mode ps-async: the global step whose batch the loader holds */
    double async_loss;  /* and the last step's training loss the server reported */
    dt_async_ps *aps;   /* its server and workers */
} trainer;

static dt_status choose_ops(const dt_layout *L, const dt_ops **ops) {
    int bf16 = dt_layout_bf16(L);
    const dt_ops *cpu = dt_layout_fixed_kernels(L) ? dt_ops_cpu_fixed() : dt_ops_cpu();
    if (L->backend == DT_BACKEND_CUDA) DT_TRY(dt_ops_cuda(ops, bf16)); /* its GPU: dt_gpu_select */
    else if (L->backend == DT_BACKEND_EMULATED) *ops = dt_ops_emulated(bf16 ? dt_ops_bf16_storage(cpu) : cpu);
    else *ops = bf16 ? dt_ops_bf16_storage(cpu) : cpu;
    if (L->cfg.log.profile) *ops = dt_ops_profiled(*ops);
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

static dt_status load_tokenizer(const dt_layout *L, dt_tokenizer **tok) {
    const dt_config *c = &L->cfg;
    if (L->tokenizer == DT_TOKENIZER_GPT2) {
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
    if (t->val_tokens.count < (size_t)t->L.T + 1)
        return dt_fail(DT_EINPUT, "data.val: '%s' is too short: %zu tokens, validation needs at least %d", t->val_path,
                       t->val_tokens.count, t->L.T + 1);
    return DT_OK;
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
    DT_TRY(dt_layout_build(&t->L, cfg, dt_comm_size(t->world)));
    t->cfg = &t->L.cfg;
    const dt_config *c = t->cfg;
    const dt_layout *L = &t->L;
    DT_TRY(dt_layout_check(L, DT_CHECK_RUN));
    /* saved with checkpoints as it is, not as 0 ("micro x dp"): a resume on another dp
     * continues the same batches; the accumulation is re-derived from it there */
    t->L.cfg.train.global_batch = L->global_batch;
    t->L.cfg.train.grad_accum = 0;
    dt_gpu_select(dt_comm_local_rank(t->world)); /* a GPU per rank of the node, whatever the launcher */
    DT_TRY(choose_ops(L, &t->ops));
    dt_cpu_set_threads(t->threads.threads);
    { /* the hang watchdog; its flight-recorder dumps go next to the metrics */
        char dir[DT_PATH_MAX] = "";
        const char *slash = strrchr(c->log.metrics, '/');
        if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - c->log.metrics), c->log.metrics);
        else if (c->log.metrics[0]) snprintf(dir, sizeof dir, ".");
        DT_TRY(dt_watchdog_arm(c->comm.timeout, dir));
    }
    if (c->log.sample_tokens > 0) DT_TRY(load_tokenizer(L, &t->tok)); /* the config's own files before the data */
    DT_TRY(read_data(c, t));
    t->rows = (dt_rows)dt_rows_parse(c->data.layout); /* the config's enum: one of them */
    DT_TRY(dt_loader_init(&t->loader, &t->train_tokens, t->rows, L->T, L->global_batch, c->data.shuffle,
                          (uint64_t)c->train.seed, dt_uneven_parse(c->data.uneven), L->dp, L->micro));
    if (c->train.epochs > 0) { /* finite data: the epochs set the steps (every rank the same) */
        double steps = (double)c->train.epochs * (double)dt_loader_batches_per_epoch(&t->loader);
        if (steps > 1e9) return dt_fail(DT_EINPUT, "train.epochs %d: %.0f steps, more than 1e9", c->train.epochs, steps);
        t->L.cfg.train.steps = (int)steps;
    }
    if (c->train.check_memory && !t->ops->on_device) /* on a GPU an allocation failure names the buffer */
        DT_TRY(dt_estimate_check_node(L, dt_comm_local_size(t->world), dt_memory_available()));
    dt_rng_seed(&t->st.rng, (uint64_t)c->train.seed + 0x5eed);
    if (c->checkpoint.resume[0]) {
        DT_TRY(dt_ckpt_resolve(c->checkpoint.resume, t->resume_dir, sizeof t->resume_dir));
        DT_TRY(dt_ckpt_load_state(t->resume_dir, &t->st, NULL));
        if (t->st.data_pos % (unsigned long long)L->global_batch != 0)
            return dt_fail(DT_EINPUT, "checkpoint '%s': its data position %llu is not a whole number of global batches "
                           "of %d sequences: the run it continues used another train.global_batch (set that one)",
                           t->resume_dir, (unsigned long long)t->st.data_pos, L->global_batch);
        if (t->st.step > c->train.steps)
            return dt_fail(DT_EINPUT, "checkpoint '%s' is at step %lld, beyond train.steps %d", t->resume_dir,
                           t->st.step, c->train.steps);
        if (t->rank0) DT_TRY(note_schedule_change(t, c));
    }
    if (c->checkpoint.dir[0] && t->rank0) /* may refuse a directory in use: before any training */
        DT_TRY(dt_ckpt_prepare_dir(c->checkpoint.dir, c->checkpoint.resume[0] ? t->resume_dir : NULL,
                                   c->checkpoint.overwrite, &t->drop_old_run));
    t->mem_all = calloc((size_t)dt_comm_size(t->world) * MEM_NUMBERS, sizeof(double));
    if (!t->mem_all) return dt_fail(DT_ERUNTIME, "out of memory (batch)");
    if (t->rank0) {
        DT_TRY(dt_metrics_open(&t->metrics, c->log.metrics, c->checkpoint.resume[0] != 0));
        if (c->checkpoint.resume[0]) dt_metrics_resume(&t->metrics, t->st.step, t->resume_dir);
    }
    return DT_OK;
}

/* The loader on to the batches after step `to` (from those after `from`), the state with it. */
static void seek_steps(trainer *t, long long from, long long to) {
    for (; from < to; from++) dt_loader_next_batch(&t->loader);
    t->st.data_epoch = t->loader.epoch;
    t->st.data_pos = t->loader.pos;
}

/* Model, engine and weights (the engine's collectives run only after all ranks agreed). */
static dt_status setup_async(trainer *t);
static dt_status setup_model(trainer *t, const dt_config *c) {
    DT_TRY(dt_parallelize(&t->par, &t->L, t->world, t->ops));
    DT_TRY(setup_async(t));
    if (c->checkpoint.resume[0]) { /* the trainer state was read in setup_local */
        DT_TRY(dt_par_load(t->par, t->resume_dir, t->st.step));
        DT_TRY(dt_loader_seek(&t->loader, t->st.data_epoch, (size_t)t->st.data_pos));
    } else {
        DT_TRY(dt_par_init_weights(t->par, (uint64_t)c->train.seed, c->train.init_from));
    }
    long long at; /* a restarted replica job joins the others where they are: their data and schedule */
    DT_TRY(dt_par_join(t->par, t->st.step, &at));
    if (at > t->st.step && t->rank0) printf("dtrain: replica %d joins the others at step %lld\n", t->L.jobs.me, at);
    if (at > t->st.step) seek_steps(t, t->st.step, at);
    t->st.step = at;
    t->config_json = dt_config_to_json(c);
    return DT_OK;
}

static void teardown(trainer *t) {
    dt_metrics_close(&t->metrics);
    dt_tokenizer_free(t->tok);
    free(t->mem_all);
    free(t->config_json);
    dt_async_ps_free(t->aps);
    dt_par_destroy(t->par, t->failed);
    dt_loader_free(&t->loader);
    dt_tokenfile_free(&t->train_tokens);
    dt_tokenfile_free(&t->val_tokens);
}

/* The step's sequences [seq0, seq0 + micro) of the global batch. */
static void fill_train(void *ctx, int seq0, dt_token *tokens, dt_token *targets, int *seg) {
    trainer *t = ctx;
    dt_loader_fill(&t->loader, seq0, t->L.micro, tokens, targets, seg);
}

/* A validation micro-batch: consecutive rows of the val file from t->val_window. */
static void fill_val(void *ctx, int seq0, dt_token *tokens, dt_token *targets, int *seg) {
    trainer *t = ctx;
    size_t nwin = dt_rows_count(&t->val_tokens, t->L.T, t->rows), w = t->val_window, T = (size_t)t->L.T;
    (void)seq0;
    for (int k = 0; k < t->L.micro; k++, w++)
        dt_rows_build(&t->val_tokens, t->L.T, t->rows, w % nwin, tokens + k * T, targets + k * T, seg + k * T);
}

/* Mean loss over val_batches micro-batches of consecutive windows of the val file,
 * spread over data-parallel ranks. Every rank runs the same number of forwards (sharded
 * weights are gathered collectively); surplus ones count for nothing. With
 * parallel.micro_batches the micro-batch depends on dp, so a validation batch is dp
 * micro-batches (global_batch / m sequences, the same in every layout). */
static dt_status validate(trainer *t, double *out) {
    const dt_layout *L = &t->L;
    size_t nwin = dt_rows_count(&t->val_tokens, L->T, t->rows);
    long long nb_want = (long long)t->cfg->train.val_batches * (t->cfg->parallel.micro_batches > 0 ? L->dp : 1);
    /* at most the file's distinct windows: more would count some twice, and a huge
     * val_batches would run for ever */
    long long nb_have = (long long)(nwin / (size_t)L->micro) > 0 ? (long long)(nwin / (size_t)L->micro) : 1;
    int nb = (int)(nb_want < nb_have ? nb_want : nb_have);
    int dp = dt_layout_job_dp(L); /* a replica job validates its own weights on all of it */
    int rounds = (nb + dp - 1) / dp;
    double acc[2] = {0.0, 0.0}; /* loss sum, tokens */
    for (int i = 0; i < rounds; i++) {
        int b = i * dp + dt_par_dp_rank(t->par);
        t->val_window = (size_t)(b < nb ? b : 0) * (size_t)L->micro;
        double l, n;
        DT_TRY(dt_par_eval(t->par, fill_val, t, &l, &n));
        if (b < nb) {
            acc[0] += l;
            acc[1] += n;
        }
    }
    DT_TRY(dt_par_allreduce_data(t->par, acc, 2));
    *out = acc[0] / acc[1];
    return DT_OK;
}

/* A validation now, in the metrics and the progress. */
static dt_status validate_logged(trainer *t) {
    double vl;
    DT_TRY(validate(t, &vl));
    if (t->rank0) {
        dt_metrics_val(&t->metrics, t->st.step, vl);
        dt_progress_note(&t->progress, "val: step %lld | val_loss %.4f", t->st.step, vl);
    }
    return DT_OK;
}

/* Rank 0: the batch of the coming step starts a new pass over the training file. */
static void note_epoch(trainer *t) {
    long long step = t->st.step + 1, epoch = t->loader.epoch + 1; /* both 1-based, as printed */
    dt_progress_note(&t->progress, "data: epoch %lld begins at step %lld (train file has %zu windows of %d tokens)",
                     epoch, step, t->loader.nseq, t->L.T);
    dt_metrics_epoch(&t->metrics, step, epoch);
}

/* One optimizer step; *loss = mean loss over the global batch. settle: a checkpoint or the
 * run's end follows (offload.delayed_update runs this step's update at once). */
static dt_status train_step(trainer *t, int settle, double *loss, double *grad_norm, double *lr) {
    dt_watchdog_step(t->st.step + 1, 0);
    dt_loader_next_batch(&t->loader);
    if (t->rank0 && dt_loader_starts_epoch(&t->loader)) note_epoch(t);
    if (dt_loader_step_uneven(&t->loader) && t->loader.uneven == DT_UNEVEN_ERROR) /* every rank sees it */
        return dt_fail(DT_EINPUT, "step %lld: the data-parallel ranks' documents fill different numbers of "
                       "micro-batches under the token budget; data.uneven is error: use join or drop",
                       t->st.step + 1);
    t->loss_tokens = dt_loader_loss_tokens(&t->loader);
    t->real_tokens = dt_loader_real_tokens(&t->loader);
    DT_TRY(dt_par_step(t->par, t->st.step, settle, fill_train, t, t->loss_tokens, dt_loader_micro_steps(&t->loader),
                       loss, grad_norm, lr));
    t->st.step++;
    dt_watchdog_step(t->st.step, -1); /* validation, saves: "after step N" */
    t->st.data_epoch = t->loader.epoch;
    t->st.data_pos = t->loader.pos;
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
    if (t->rank0) dt_rank_state_prune(c->checkpoint.dir); /* per-rank state of steps no longer there */
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
    DT_TRY(dt_par_save_wait(t->par));
    if (t->rank0) note_saved(t, t->save_pending_step, dt_now() - t->save_started, ", in the background");
    return after_commit(t);
}

static dt_status save(trainer *t) {
    const dt_config *c = t->cfg;
    DT_TRY(finish_save(t)); /* one save in flight at a time */
    if (t->rank0)
        dt_progress_note(&t->progress, "checkpoint: saving step %lld to %s%s", t->st.step, c->checkpoint.dir,
                         dt_par_async_save(t->par) ? " (written in the background)" : "");
    double t0 = dt_now();
    DT_TRY(dt_par_save(t->par, c->checkpoint.dir, &t->st, t->config_json, c->checkpoint.shard_mb));
    t->saved++;
    if (dt_par_async_save(t->par)) { /* gathered; rank 0's child writes and commits while training goes on */
        t->save_pending = 1;
        t->save_pending_step = t->st.step;
        t->save_started = t0;
        return DT_OK;
    }
    DT_TRY(after_commit(t));
    if (t->rank0) note_saved(t, t->st.step, dt_now() - t0, "");
    return DT_OK;
}

/* On the first data-parallel replica: every model-parallel rank of it runs the model
 * (dt_par_next_logits), drawing the same tokens; rank 0 prints. */
static dt_status print_sample(trainer *t) {
    dt_sample_opts o = {t->cfg->log.sample_tokens, 0.8, 40};
    dt_rng rng;
    dt_rng_seed(&rng, (uint64_t)t->cfg->train.seed);
    FILE *out = t->rank0 ? stdout : fopen("/dev/null", "w");
    if (!out) return dt_fail(DT_ERUNTIME, "cannot open /dev/null for the sample");
    if (t->rank0) printf("--- sample (%d tokens, temperature 0.8, top-k 40) ---\n", o.length);
    const gpt_model *m = dt_par_model(t->par);
    dt_status s = dt_generate_with(dt_par_next_logits, t->par, m->shape.vocab_size, m->max_T, t->tok, "", &o, &rng, out);
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
    const dt_layout *L = &t->L;
    char thr[256];
    dt_threads_describe(&t->threads, thr, sizeof thr);
    gpt_shape_print(&L->shape, L->T, stdout);
    dt_layout_print_batch(L, L->backend == DT_BACKEND_CUDA ? dt_gpu_name() : dt_cpu_blas_info(), stdout);
    printf("dtrain: threads %s\n", thr); /* the count, and where it came from */
    printf("dtrain: data %s (%zu tokens), validation %s\n", c->data.train, t->train_tokens.count,
           t->val_path[0] ? t->val_path : "none");
    dt_layout_print(L, stdout);
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
        const gpt_model *m = dt_par_model(t->par);
        for (int i = 0; i < m->ntensors; i++) {
            all += m->tensors[i].numel;
            if (m->tensors[i].frozen) n += m->tensors[i].numel;
        }
        printf("dtrain: frozen (train.freeze %s): %zu of rank 0's %zu parameters (no gradients, reductions or "
               "optimizer moments for them)\n", c->train.freeze, n, all);
    }
    printf("dtrain: model ready in %.1f s\n", seconds);
    fflush(stdout);
}

/* ---- dp_mode ps-async (async_ps.h): its own loop over the same loader and metrics ---- */

static void async_seek(void *ctx, long long step) {
    trainer *t = ctx;
    seek_steps(t, t->async_at, step);
    if (t->async_at < step) t->async_at = step;
}

static void async_report(void *ctx, const dt_async_step *a) {
    trainer *t = ctx;
    double tps = a->seconds > 0 ? a->tokens / a->seconds : 0.0;
    t->async_loss = a->loss;
    dt_metrics_step(&t->metrics, a->step, a->loss, a->lr, a->grad_norm, a->step * (long long)t->L.global_batch * t->L.T,
                    (long long)a->tokens, tps, a->seconds * 1e3, -1.0, -1.0, NULL, NULL);
    dt_progress_step(&t->progress, a->step, a->loss, a->lr, a->grad_norm, tps, a->seconds * 1e3, 0.0);
    if (a->step % (t->cfg->log.every > 0 ? t->cfg->log.every : 1) == 0)
        dt_progress_note(&t->progress, "async: step %lld | staleness mean %.2f max %d", a->step, a->staleness_mean,
                         a->staleness_max);
}

static int async_stopping(void *ctx) { return ctx && dt_signal_pending() != 0; }

/* Before a resume's load: the server's state is part of the checkpoint. */
static dt_status setup_async(trainer *t) {
    if (!dt_layout_ps_async(&t->L)) return DT_OK;
    dt_async_opts o = {t->par, t->world, t->cfg->train.steps, t->cfg->parallel.staleness, dt_layout_async_inverse_lr(&t->L),
                       dt_layout_async_fixed_order(&t->L), fill_train, t, async_seek, t->rank0 ? async_report : NULL,
                       async_stopping};
    DT_TRY(dt_async_ps_create(&t->aps, &o));
    dt_par_set_rank_state(t->par, &(dt_par_rank_state){dt_async_ps_save, dt_async_ps_load, t->aps});
    return DT_OK;
}

/* The next step after `at` that is a multiple of `every` (none: stop). */
static long long next_multiple(long long at, int every, long long stop) {
    return every > 0 && (at / every + 1) * every < stop ? (at / every + 1) * every : stop;
}

/* Steps first .. stop under the parameter server, in runs that end where a validation or
 * a checkpoint is due; the loss and time for the summary. */
static dt_status run_async(trainer *t, long long stop, double *loss, double *seconds, double *tokens, long long *steps,
                           int *sig) {
    const dt_config *c = t->cfg;
    t->async_at = t->st.step - 1;
    *seconds = *tokens = 0.0, *steps = 0;
    while (t->st.step < stop) {
        long long at = t->st.step, end = stop, n;
        if (t->val_path[0]) end = next_multiple(at, c->train.val_every, end);
        if (c->checkpoint.dir[0]) end = next_multiple(at, c->checkpoint.every, end);
        double sec, tok;
        DT_TRY(dt_async_ps_run(t->aps, at, end, &n, &sec, &tok));
        t->st.step += n, *steps += n;
        *seconds += sec, *tokens += tok;
        *loss = t->async_loss; /* rank 0's (the summary's) */
        int last = t->st.step == stop || t->st.step < end;
        if (t->val_path[0] && ((c->train.val_every > 0 && t->st.step % c->train.val_every == 0) || last))
            DT_TRY(validate_logged(t)); /* every rank has the server's weights */
        DT_TRY(stop_requested(t, sig));
        if (*sig || last) break;
        if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && t->st.step % c->checkpoint.every == 0) DT_TRY(save(t));
    }
    return DT_OK;
}

static dt_status run(trainer *t) {
    const dt_config *c = t->cfg;
    long long steps = c->train.steps;
    double flops_tok = gpt_flops_per_token(&t->L.shape, t->L.T);
    dt_progress_init(&t->progress, steps, c->log.every, c->log.progress);
    double train_time = 0.0, loss = NAN;
    long long first = t->st.step, timed_steps = 0;
    double tokens_per_step = (double)t->L.global_batch * t->L.T, real_total = 0.0; /* positions; data tokens */
    long long stop = c->train.stop_after > 0 && first + c->train.stop_after < steps ? first + c->train.stop_after : steps;
    int sig = 0;
    if (dt_layout_ps_async(&t->L)) DT_TRY(run_async(t, stop, &loss, &train_time, &real_total, &timed_steps, &sig));
    while (!dt_layout_ps_async(&t->L) && t->st.step < stop) {
        double t0 = dt_now(), c0 = dt_par_comm_seconds(t->par), norm, lr, io0[DT_OFFLOAD_IO_N], io1[DT_OFFLOAD_IO_N];
        dt_metrics_io io = {.on = dt_par_offload_io(t->par, io0)};
        dt_metrics_traffic tr = {1, 0, 0, 0}, tr0 = tr;
        dt_par_traffic(t->par, &tr0.grad_comm_bytes, &tr0.param_comm_bytes, &tr0.dw_gemms_skipped);
        long long next = t->st.step + 1;
        /* the state read after the step (checkpoint, validation, the end): its update not delayed */
        int settle = next == stop || (c->checkpoint.dir[0] && c->checkpoint.every > 0 && next % c->checkpoint.every == 0) ||
                     (t->val_path[0] && c->train.val_every > 0 && next % c->train.val_every == 0);
        DT_TRY(train_step(t, settle, &loss, &norm, &lr));
        dt_test_fault(t->st.step, t->L.jobs.me * dt_comm_size(t->world) + dt_comm_rank(t->world)); /* the run's rank */
        dt_heartbeat(t->st.step, dt_comm_rank(t->world));
        if (c->log.profile && timed_steps == 0 && t->st.step < stop) dt_ops_profile_reset();
        double dt = dt_now() - t0;
        if (io.on && dt_par_offload_io(t->par, io1))
            io = (dt_metrics_io){1, (io1[0] - io0[0]) / 1e6, (io1[1] - io0[1]) / 1e6, (io1[2] - io0[2]) * 1e3,
                                 (io1[3] - io0[3]) * 1e3, (io1[4] - io0[4]) / 1e6, (io1[5] - io0[5]) / 1e6};
        dt_par_traffic(t->par, &tr.grad_comm_bytes, &tr.param_comm_bytes, &tr.dw_gemms_skipped);
        tr.grad_comm_bytes -= tr0.grad_comm_bytes, tr.dw_gemms_skipped -= tr0.dw_gemms_skipped;
        tr.param_comm_bytes -= tr0.param_comm_bytes;
        if (!isfinite(loss)) /* the loss is all-reduced: every rank stops together */
            return dt_fail(DT_ERUNTIME, "training diverged: loss is %g at step %lld", loss, t->st.step);
        train_time += dt;
        timed_steps++;
        double tps = (double)t->real_tokens / dt; /* padding is not throughput */
        real_total += (double)t->real_tokens;
        double eta = train_time / (double)timed_steps * (double)(steps - t->st.step);
        if (t->rank0) {
            dt_metrics_step(&t->metrics, t->st.step, loss, lr, norm, t->st.step * (long long)tokens_per_step,
                            t->loss_tokens, tps, dt * 1e3, c0 >= 0 ? 1e3 * (dt_par_comm_seconds(t->par) - c0) : -1.0,
                            t->peak_flops > 0 ? tps * flops_tok / t->peak_flops : -1.0, &io, &tr);
            dt_progress_step(&t->progress, t->st.step, loss, lr, norm, tps, dt * 1e3, eta);
        }
        int last = t->st.step == stop;
        if (t->val_path[0] && c->train.val_every > 0 && (t->st.step % c->train.val_every == 0 || last))
            DT_TRY(validate_logged(t));
        DT_TRY(stop_requested(t, &sig));
        if (sig) break;
        if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && t->st.step % c->checkpoint.every == 0 && !last)
            DT_TRY(save(t));
    }
    if (t->rank0) dt_progress_end(&t->progress);
    if (c->checkpoint.dir[0] && (t->st.step > first || !c->checkpoint.resume[0])) DT_TRY(save(t));
    DT_TRY(finish_save(t)); /* the run ends with its last checkpoint committed */
    double tps = timed_steps > 0 ? real_total / train_time : 0.0;
    /* per-rank memory, gathered to every rank as 8 numbers each, plus rank 0's metrics status */
    int n = dt_comm_size(t->world);
    dt_mem_report mine;
    dt_par_memory(t->par, &mine);
    mine.peak_rss = dt_peak_rss();
    double me[MEM_NUMBERS] = {(double)mine.params, (double)mine.grads, (double)mine.optim,
                              (double)mine.activations, (double)mine.workspace, (double)mine.peak_rss,
                              t->rank0 && t->metrics.fail_step >= 0, (double)mine.offload_host,
                              (double)mine.offload_file};
    double *all = t->mem_all;
    DT_TRY(dt_allgather(t->world, me, all, MEM_NUMBERS, DT_F64));
    DT_TRY(dt_par_gather_report(t->par));
    if (all[6] != 0.0) /* rank 0's metrics could not be written: an error on every rank, reported by rank 0 */
        return t->rank0 ? dt_metrics_close(&t->metrics)
                        : dt_fail(DT_ERUNTIME, "rank 0 could not write the metrics file");
    if (t->rank0) {
        dt_mem_report mem[n];
        for (int r = 0; r < n; r++)
            mem[r] = (dt_mem_report){(size_t)all[MEM_NUMBERS * r], (size_t)all[MEM_NUMBERS * r + 1],
                                     (size_t)all[MEM_NUMBERS * r + 2], (size_t)all[MEM_NUMBERS * r + 3],
                                     (size_t)all[MEM_NUMBERS * r + 5], (size_t)all[MEM_NUMBERS * r + 4],
                                     (size_t)all[MEM_NUMBERS * r + 7], (size_t)all[MEM_NUMBERS * r + 8]};
        double mfu = t->peak_flops > 0 ? tps * flops_tok / t->peak_flops : -1.0;
        dt_metrics_summary(&t->metrics, t->st.step, t->st.step - first, loss, tps, mfu, mem, n);
        DT_TRY(dt_metrics_close(&t->metrics));
        char mfu_text[160] = "";
        if (mfu >= 0)
            snprintf(mfu_text, sizeof mfu_text, " (MFU %.1f%% of %.1f GFLOP/s, %s peak)", 100.0 * mfu,
                     t->peak_flops / 1e9, t->peak_source);
        char off_text[120] = ""; /* offloaded state: host memory (NVMe: its buffers), the file */
        if (mem[0].offload_host || mem[0].offload_file)
            snprintf(off_text, sizeof off_text, ", offloaded %.1f MB in host memory and %.1f MB on disk",
                     mem[0].offload_host / 1e6, mem[0].offload_file / 1e6);
        if (timed_steps > 0)
            printf("summary: %lld steps (from %lld), final loss %.4f, %.0f tokens/s, %.1f GFLOP/s%s, %.1f s; "
                   "memory (rank 0): params %.1f MB, grads %.1f MB, optimizer %.1f MB, activations %.1f MB, "
                   "workspace %.1f MB, peak RSS %.1f MB%s\n",
                   t->st.step - first, first, loss, tps, tps * flops_tok / 1e9, mfu_text, train_time, mem[0].params / 1e6,
                   mem[0].grads / 1e6, mem[0].optim / 1e6, mem[0].activations / 1e6, mem[0].workspace / 1e6,
                   mem[0].peak_rss / 1e6, off_text);
        else
            printf("summary: nothing to train (at step %lld of %lld)\n", t->st.step, steps);
        if (t->L.backend == DT_BACKEND_CUDA && timed_steps > 0)
            printf("gpu: %s, peak device memory %.2f GB (rank 0)\n", dt_gpu_name(), (double)dt_gpu_peak_bytes() / 1e9);
        dt_par_print_report(t->par, timed_steps, all, stdout);
        if (c->log.profile) dt_ops_profile_report(stdout);
    }
    if (sig) /* after the summary (the metrics file ends with it), before the digest and sample */
        return dt_fail(DT_EINTERRUPTED, "stopped by %s after step %lld; %s%s%s", dt_signal_name(sig), t->st.step,
                       c->checkpoint.dir[0] ? "saved, resume with --resume " : "nothing saved (no checkpoint.dir)",
                       c->checkpoint.dir[0] ? c->checkpoint.dir : "", "");
    if (c->log.digest) {
        char hex[65];
        DT_TRY(dt_par_digest(t->par, hex));
        if (t->rank0) printf("digest sha256:%s\n", hex);
    }
    if (c->log.sample_tokens > 0) {
        DT_TRY(dt_par_gather_full(t->par));
        dt_status s = dt_par_dp_rank(t->par) == 0 ? print_sample(t) : DT_OK;
        dt_par_release_full(t->par);
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
    if (s == DT_OK) s = agree(&t, dt_metrics_peak_flops(t.cfg, t.L.backend == DT_BACKEND_CUDA, t.world, &t.peak_flops, &t.peak_source), report);
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
