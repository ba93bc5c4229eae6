#include "trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/ops.h"
#include "../ckpt/checkpoint.h"
#include "../core/mem.h"
#include "../core/timer.h"
#include "../data/loader.h"
#include "../data/tokenfile.h"
#include "../data/tokenizer.h"
#include "../model/gpt.h"
#include "../optim/optimizer.h"
#include "metrics.h"
#include "progress.h"
#include "sample.h"

typedef struct {
    const dt_config *cfg;
    const dt_ops *ops;
    gpt_model model;
    dt_adamw opt;
    dt_tokenfile train_tokens, val_tokens;
    dt_loader loader;
    uint16_t *inp, *tgt;
    int micro, accum, global_batch, T;
    dt_train_state st;
    dt_metrics metrics;
    dt_progress progress;
    char *config_json;
} trainer;

static dt_status check_supported(const dt_config *c) {
    if (strcmp(c->backend, "cpu") != 0)
        return dt_fail(DT_EINPUT, "config: backend '%s' is not available in this build (cpu only)", c->backend);
    if (strcmp(c->precision, "fp32") != 0)
        return dt_fail(DT_EINPUT, "config: precision '%s' is not supported by the cpu backend (fp32 only)",
                       c->precision);
    long long model_par = (long long)c->parallel.tp * c->parallel.pp * c->parallel.cp;
    if (model_par != 1)
        return dt_fail(DT_EINPUT, "config: parallel.tp x pp x cp = %lld does not divide the world size 1", model_par);
    return DT_OK;
}

static dt_status setup(trainer *t, const dt_config *c) {
    t->cfg = c;
    t->ops = c->log.profile ? dt_ops_profiled(dt_ops_cpu()) : dt_ops_cpu();
    DT_TRY(dt_config_validate(c));
    DT_TRY(check_supported(c));
    dt_cpu_set_threads(c->threads);
    t->T = c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len;
    t->micro = c->train.micro_batch;
    t->global_batch = c->train.global_batch > 0 ? c->train.global_batch : t->micro;
    t->accum = t->global_batch / t->micro;

    DT_TRY(dt_tokenfile_read(&t->train_tokens, c->data.train, c->model.vocab_size));
    if (c->data.val[0]) {
        DT_TRY(dt_tokenfile_read(&t->val_tokens, c->data.val, c->model.vocab_size));
        if (t->val_tokens.count < (size_t)t->T + 1)
            return dt_fail(DT_EINPUT, "data file '%s' is too short: %zu tokens, validation needs at least %d",
                           c->data.val, t->val_tokens.count, t->T + 1);
    }
    DT_TRY(dt_loader_init(&t->loader, &t->train_tokens, t->T, t->global_batch, c->data.shuffle,
                          (uint64_t)c->train.seed));
    if (c->checkpoint.dir[0]) DT_TRY(dt_ckpt_prepare_dir(c->checkpoint.dir));

    gpt_shape shape = {c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.seq_len, c->model.vocab_size, 0};
    DT_TRY(gpt_create(&t->model, &shape, t->ops, t->micro, t->T));
    dt_adamw_hparams hp = {c->train.lr, c->train.min_lr, c->train.beta1, c->train.beta2, c->train.eps,
                           c->train.weight_decay, c->train.grad_clip, c->train.warmup_steps, c->train.steps};
    DT_TRY(dt_adamw_create(&t->opt, &hp, t->model.nparams));
    size_t ntok = (size_t)t->micro * t->T;
    t->inp = malloc(ntok * sizeof(uint16_t));
    t->tgt = malloc(ntok * sizeof(uint16_t));
    if (!t->inp || !t->tgt) return dt_fail(DT_ERUNTIME, "out of memory (batch)");
    dt_rng_seed(&t->st.rng, (uint64_t)c->train.seed + 0x5eed);

    if (c->checkpoint.resume[0]) {
        char dir[1024];
        DT_TRY(dt_ckpt_resolve(c->checkpoint.resume, dir, sizeof dir));
        DT_TRY(dt_ckpt_load_state(dir, &t->st, NULL));
        char path[1100];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        DT_TRY(dt_ckpt_load_weights(path, &t->model));
        DT_TRY(dt_ckpt_load_optimizer(dir, &t->model, &t->opt));
        t->opt.step = t->st.step;
        DT_TRY(dt_loader_seek(&t->loader, t->st.data_epoch, (size_t)t->st.data_pos));
        if (t->st.step > c->train.steps)
            return dt_fail(DT_EINPUT, "checkpoint '%s' is at step %lld, beyond train.steps %d", dir, t->st.step,
                           c->train.steps);
    } else if (c->train.init_from[0]) {
        DT_TRY(dt_ckpt_load_weights(c->train.init_from, &t->model));
    } else {
        gpt_init(&t->model, (uint64_t)c->train.seed);
    }
    t->config_json = dt_config_to_json(c);
    DT_TRY(dt_metrics_open(&t->metrics, c->log.metrics, c->checkpoint.resume[0] != 0));
    return DT_OK;
}

static void teardown(trainer *t) {
    dt_metrics_close(&t->metrics);
    free(t->config_json);
    free(t->inp);
    free(t->tgt);
    dt_adamw_destroy(&t->opt);
    gpt_destroy(&t->model);
    dt_loader_free(&t->loader);
    dt_tokenfile_free(&t->train_tokens);
    dt_tokenfile_free(&t->val_tokens);
}

/* Mean loss over val_batches micro-batches of consecutive windows of the val file. */
static double validate(trainer *t) {
    size_t nwin = (t->val_tokens.count - 1) / (size_t)t->T, w = 0;
    double sum = 0.0;
    size_t ntok = 0;
    for (int b = 0; b < t->cfg->train.val_batches; b++) {
        for (int k = 0; k < t->micro; k++, w++)
            dt_loader_window(&t->val_tokens, t->T, w % nwin, t->inp + (size_t)k * t->T, t->tgt + (size_t)k * t->T);
        sum += gpt_eval_loss(&t->model, t->inp, t->tgt, t->micro, t->T);
        ntok += (size_t)t->micro * t->T;
    }
    return sum / (double)ntok;
}

/* One optimizer step; returns the mean loss over the global batch. */
static double train_step(trainer *t, double *grad_norm, double *lr) {
    gpt_zero_grad(&t->model);
    dt_loader_next_batch(&t->loader);
    float grad_scale = 1.0f / ((float)t->global_batch * (float)t->T);
    double loss = 0.0;
    for (int k = 0; k < t->accum; k++) {
        dt_loader_fill(&t->loader, k * t->micro, t->micro, t->inp, t->tgt);
        loss += gpt_forward_backward(&t->model, t->inp, t->tgt, t->micro, t->T, grad_scale);
    }
    *grad_norm = dt_grad_norm(t->ops, t->model.grads, t->model.nparams);
    dt_clip_grads(t->ops, t->model.grads, t->model.nparams, *grad_norm, t->cfg->train.grad_clip);
    *lr = dt_lr_at(&t->opt.hp, t->st.step);
    dt_adamw_step(&t->opt, t->ops, &t->model, *lr);
    t->st.step++;
    t->st.data_epoch = t->loader.epoch;
    t->st.data_pos = t->loader.pos;
    return loss / ((double)t->global_batch * t->T);
}

static dt_status save(trainer *t) {
    double t0 = dt_now();
    DT_TRY(dt_ckpt_save(t->cfg->checkpoint.dir, &t->model, &t->opt, &t->st, t->config_json));
    dt_progress_note(&t->progress, "checkpoint: saved step %lld to %s (%.2f s)", t->st.step, t->cfg->checkpoint.dir,
                     dt_now() - t0);
    return DT_OK;
}

static dt_status print_sample(trainer *t) {
    const dt_config *c = t->cfg;
    dt_tokenizer *tok = NULL;
    if (!strcmp(c->data.tokenizer, "gpt2")) DT_TRY(dt_tokenizer_gpt2(&tok, c->data.encoder_json, c->data.vocab_bpe));
    else DT_TRY(dt_tokenizer_byte(&tok));
    dt_sample_opts o = {c->log.sample_tokens, 0.8, 40};
    dt_rng rng;
    dt_rng_seed(&rng, (uint64_t)c->train.seed);
    printf("--- sample (%d tokens, temperature 0.8, top-k 40) ---\n", o.length);
    dt_status s = dt_generate(&t->model, tok, "", &o, &rng, stdout);
    printf("---\n");
    dt_tokenizer_free(tok);
    return s;
}

static dt_status run(trainer *t) {
    const dt_config *c = t->cfg;
    long long steps = c->train.steps;
    double flops_tok = gpt_flops_per_token(&t->model.shape, t->T);
    printf("dtrain: GPT-2 %d layers, %d heads, %d wide, seq %d, vocab %d (padded %d): %.2fM parameters\n",
           c->model.n_layer, c->model.n_head, c->model.n_embd, t->T, c->model.vocab_size, t->model.shape.padded_vocab,
           (double)gpt_num_params(&t->model) / 1e6);
    printf("dtrain: global batch %d x %d tokens (micro-batch %d x %d accumulation steps), %lld steps, %d threads, %s\n",
           t->global_batch, t->T, t->micro, t->accum, steps, dt_cpu_threads(), dt_cpu_blas_info());
    if (t->st.step > 0) printf("dtrain: resumed at step %lld\n", t->st.step);
    dt_progress_init(&t->progress, steps, c->log.every);
    double train_time = 0.0, loss = NAN;
    long long first = t->st.step, timed_steps = 0;
    double tokens_per_step = (double)t->global_batch * t->T;
    long long stop = c->train.stop_after > 0 && first + c->train.stop_after < steps ? first + c->train.stop_after : steps;
    while (t->st.step < stop) {
        double t0 = dt_now(), norm, lr;
        loss = train_step(t, &norm, &lr);
        double dt = dt_now() - t0;
        if (!isfinite(loss))
            return dt_fail(DT_ERUNTIME, "training diverged: loss is %g at step %lld", loss, t->st.step);
        train_time += dt;
        timed_steps++;
        double tps = tokens_per_step / dt;
        double eta = train_time / (double)timed_steps * (double)(steps - t->st.step);
        dt_metrics_step(&t->metrics, t->st.step, loss, lr, norm, tps, dt * 1e3);
        dt_progress_step(&t->progress, t->st.step, loss, lr, norm, tps, dt * 1e3, eta);
        int last = t->st.step == stop;
        if (c->data.val[0] && c->train.val_every > 0 && (t->st.step % c->train.val_every == 0 || last)) {
            double vl = validate(t);
            dt_metrics_val(&t->metrics, t->st.step, vl);
            dt_progress_note(&t->progress, "val: step %lld | val_loss %.4f", t->st.step, vl);
        }
        if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && t->st.step % c->checkpoint.every == 0 && !last)
            DT_TRY(save(t));
    }
    dt_progress_end(&t->progress);
    if (c->checkpoint.dir[0]) DT_TRY(save(t));
    double tps = timed_steps > 0 ? tokens_per_step * (double)timed_steps / train_time : 0.0;
    dt_mem_report mem = {t->model.nparams * sizeof(float), t->model.nparams * sizeof(float),
                         2 * t->opt.n * sizeof(float), t->model.act_bytes, dt_peak_rss()};
    dt_metrics_summary(&t->metrics, t->st.step, loss, tps, &mem, 1);
    if (timed_steps > 0)
        printf("summary: %lld steps (from %lld), final loss %.4f, %.0f tokens/s, %.1f GFLOP/s, %.1f s; "
               "memory: params %.1f MB, grads %.1f MB, optimizer %.1f MB, activations %.1f MB, peak RSS %.1f MB\n",
               t->st.step - first, first, loss, tps, tps * flops_tok / 1e9, train_time, mem.params / 1e6,
               mem.grads / 1e6, mem.optim / 1e6, mem.activations / 1e6, mem.peak_rss / 1e6);
    if (c->log.profile) dt_ops_profile_report(stdout);
    if (c->log.digest) {
        char hex[65];
        dt_weights_digest(&t->model, hex);
        printf("digest sha256:%s\n", hex);
    }
    if (c->log.sample_tokens > 0) DT_TRY(print_sample(t));
    return DT_OK;
}

dt_status dt_train_run(const dt_config *cfg) {
    trainer t;
    memset(&t, 0, sizeof t);
    dt_status s = setup(&t, cfg);
    if (s == DT_OK) s = run(&t);
    teardown(&t);
    return s;
}
