/* dtrain command line: train, sample, prepare, config. Every error travels up as a
 * dt_status with one message; this file alone prints it and picks the exit code. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/ops.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_verify.h"
#include "ckpt/export.h"
#include "comm/bench_comm.h"
#include "comm/comm.h"
#include "core/config.h"
#include "core/deepspeed.h"
#include "core/signals.h"
#include "core/status.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "launch/launch.h"
#include "model/gpt.h"
#include "parallel/layout/estimate.h"
#include "parallel/layout/layout.h"
#include "parallel/layout/mesh.h"
#include "parallel/layout/plan.h"
#include "report/report.h"
#include "train/sample.h"
#include "train/trainer.h"

#define DT_VERSION "0.3.0"

static const char *USAGE =
    "usage: dtrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train     train a GPT-2 model (built-in demo config when no --config is given)\n"
    "  launch    run `train` under mpirun with restarts from the latest checkpoint (elastic, watchdog)\n"
    "  sample    generate text from a checkpoint\n"
    "  prepare   turn text files into token files\n"
    "  export    a checkpoint as a Hugging Face GPT-2 directory (`export CKPT OUT`)\n"
    "  config    print the effective config as JSON, or every key (--doc)\n"
    "  estimate  per-rank memory for each ZeRO stage (`-n N` ranks)\n"
    "  plan      every dp x pp x cp x tp layout of `-n N` ranks that fits, ranked by predicted step time\n"
    "  bench     `bench comm`: collective bandwidth per algorithm and message size\n"
    "  report    one HTML page plotting metrics files (`report A.jsonl [B.jsonl ...] --out F.html`)\n"
    "\n"
    "`dtrain <command> --help` describes each command's options; `dtrain --version` prints the version.\n";

static const char *TRAIN_USAGE =
    "usage: dtrain train [--deepspeed DS.json] [--config FILE.json] [--set key.path=value]... [flags]\n"
    "  --deepspeed FILE a DeepSpeed config, translated (docs/coming-from.md); --config and --set override it\n"
    "  --config FILE    JSON config; keys and defaults: docs/config.md (`dtrain config --doc`)\n"
    "  --set K=V        override any key, e.g. --set model.n_layer=6 (repeatable)\n"
    "  --steps N        train.steps          --seed N        train.seed\n"
    "  --metrics FILE   log.metrics (JSON Lines)\n"
    "  --save DIR       checkpoint.dir       --save-every N  checkpoint.every\n"
    "  --resume DIR     checkpoint.resume    --digest        log.digest\n"
    "  --threads N      threads              --overwrite     checkpoint.overwrite\n";

static const char *SAMPLE_USAGE =
    "usage: dtrain sample --checkpoint DIR [--prompt TEXT] [--length N] [--temperature T] [--top-k K] [--seed S]\n"
    "                     [--echo] [--set K=V]...\n"
    "  prints the generated continuation (not the prompt) on stdout\n"
    "  --checkpoint DIR  checkpoint directory (a step directory, or a --save directory with `latest`)\n"
    "  --prompt TEXT     text to continue (default: start of a new document)\n"
    "  --echo            print the prompt before the continuation\n"
    "  --set K=V         override a key of the checkpoint's config, e.g. data.encoder_json=PATH\n"
    "  --length N        tokens to generate (default 200)\n"
    "  --temperature T   softmax temperature, 0 = greedy (default 0.8)\n"
    "  --top-k K         sample among the K most likely tokens, 0 = all (default 40)\n"
    "  --seed S          sampling seed (default 1)\n";

static const char *PREPARE_USAGE =
    "usage: dtrain prepare --input FILE [--input FILE]... --out PREFIX [options]\n"
    "  writes PREFIX_train.bin and PREFIX_val.bin: token files of documents (docs/config.md#token-files)\n"
    "  --format F    what the inputs hold (default text): text (a file is a document), fortune (an entry ended by\n"
    "                a line '%' is one; --fortune), jsonl (a line, its field --field, default text), prompt (lines\n"
    "                of prompt/completion: the completion in the loss), chat (lines of messages [{role, content}]:\n"
    "                the assistant's in the loss)\n"
    "  --tokenizer byte|gpt2|PATH/tokenizer.json (default byte); gpt2 needs --encoder-json FILE --vocab-bpe FILE;\n"
    "    a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2, SmolLM) trains with data.tokenizer hf\n"
    "  --val-fraction F   the last fraction of tokens held out for validation, at a document boundary (0.1)\n"
    "  a document ends with <|endoftext|> (gpt2), or a newline where it does not end in one (byte)\n";

static const char *CONFIG_USAGE =
    "usage: dtrain config [--deepspeed DS.json] [--config FILE] [--set K=V]... [--doc] [-n WORLD]\n"
    "  prints the effective config as JSON (with --deepspeed: the DeepSpeed file translated);\n"
    "  --doc prints every key as a markdown table;\n"
    "  -n WORLD (up to 4096) also prints the resolved layout on WORLD ranks: each rank's coordinates\n"
    "  (dp, pp, cp, tp) and the ranks of each of its process groups\n";

static int wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

static dt_status need_value(int i, int argc, char **argv) {
    if (i + 1 >= argc) return dt_fail(DT_EINPUT, "option %s needs a value", argv[i]);
    return DT_OK;
}

static dt_status parse_long(const char *opt, const char *v, long long lo, long long hi, long long *out) {
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        return dt_fail(DT_EINPUT, "option %s: '%s' is not an integer in [%lld, %lld]", opt, v, lo, hi);
    *out = x;
    return DT_OK;
}

/* The DeepSpeed keys the last --deepspeed file set to no effect ("" when none). */
static char g_ds_ignored[2048];

/* --deepspeed FILE, then --config FILE, then --set and the shorthand flags, on top of c's
 * current values. */
static dt_status apply_config_args(dt_config *c, int argc, char **argv) {
    g_ds_ignored[0] = 0;
    for (int i = 0; i < argc; i++) /* the translation first: dtrain's own keys override it */
        if (!strcmp(argv[i], "--deepspeed")) {
            DT_TRY(need_value(i, argc, argv));
            DT_TRY(dt_deepspeed_load_file(c, argv[++i], g_ds_ignored, sizeof g_ds_ignored));
        }
    for (int i = 0; i < argc; i++) /* the file first, so --set and flags override it whatever their order */
        if (!strcmp(argv[i], "--config")) {
            DT_TRY(need_value(i, argc, argv));
            DT_TRY(dt_config_load_file(c, argv[++i]));
        }
    static const struct { const char *flag, *key; } shorthands[] = {
        {"--steps", "train.steps"},   {"--seed", "train.seed"},         {"--metrics", "log.metrics"},
        {"--save", "checkpoint.dir"}, {"--resume", "checkpoint.resume"}, {"--threads", "threads"},
        {"--save-every", "checkpoint.every"},
    };
    char buf[DT_PATH_MAX + 64];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config") || !strcmp(a, "--deepspeed")) {
            i++;
            continue;
        }
        if (!strcmp(a, "--set")) {
            DT_TRY(need_value(i, argc, argv));
            DT_TRY(dt_config_set(c, argv[++i]));
            continue;
        }
        if (!strcmp(a, "--digest")) {
            DT_TRY(dt_config_set(c, "log.digest=true"));
            continue;
        }
        if (!strcmp(a, "--overwrite")) {
            DT_TRY(dt_config_set(c, "checkpoint.overwrite=true"));
            continue;
        }
        int matched = 0;
        for (size_t k = 0; k < sizeof shorthands / sizeof shorthands[0]; k++)
            if (!strcmp(a, shorthands[k].flag)) {
                DT_TRY(need_value(i, argc, argv));
                snprintf(buf, sizeof buf, "%s=%s", shorthands[k].key, argv[++i]);
                DT_TRY(dt_config_set(c, buf));
                matched = 1;
                break;
            }
        if (!matched) return dt_fail(DT_EINPUT, "unknown option '%s' (see --help)", a);
    }
    return DT_OK;
}

/* The config a checkpoint was trained with, and its step directory. */
static dt_status checkpoint_config(const char *ckpt, dt_config *c, char *dir, size_t cap) {
    DT_TRY(dt_ckpt_resolve(ckpt, dir, cap));
    return dt_ckpt_load_config(dir, c);
}

/* The effective config of train, config and estimate: defaults; on --resume the
 * checkpoint's saved config (all but the per-invocation keys); then --config FILE;
 * then --set and flags. A resume may not change the model shape or tokenizer. */
static dt_status parse_config_args(dt_config *c, int argc, char **argv) {
    dt_config_defaults(c);
    DT_TRY(apply_config_args(c, argc, argv));
    if (!c->checkpoint.resume[0]) return dt_hf_apply_config(c); /* a Hugging Face init_from: its model keys */
    dt_config saved;
    char dir[1024], resume[DT_PATH_MAX];
    snprintf(resume, sizeof resume, "%s", c->checkpoint.resume);
    DT_TRY(checkpoint_config(resume, &saved, dir, sizeof dir));
    dt_config_defaults(c);
    dt_config_restore(c, &saved);
    DT_TRY(apply_config_args(c, argc, argv));
    return dt_config_check_resume(c, &saved, resume);
}

/* Lists once what a --deepspeed file set that has no effect here. */
static void note_ds_ignored(void) {
    if (g_ds_ignored[0]) fprintf(stderr, "dtrain: deepspeed config: ignored keys: %s\n", g_ds_ignored);
}

/* Set by commands that run on many ranks: whether this rank prints the error. */
static int g_report = 1;

static dt_status cmd_train(dt_comm *world, int argc, char **argv) {
    if (wants_help(argc, argv)) {
        if (dt_comm_rank(world) == 0) fputs(TRAIN_USAGE, stdout);
        return DT_OK;
    }
    dt_config c;
    dt_ckpt_resolve_report(dt_comm_rank(world) == 0); /* a skipped damaged step: said once */
    dt_status s = parse_config_args(&c, argc, argv);
    if (s != DT_OK) { /* identical on every rank: report once */
        g_report = dt_comm_rank(world) == 0;
        return s;
    }
    if (dt_comm_rank(world) == 0) note_ds_ignored();
    dt_signals_install(dt_comm_rank(world) != 0);
    return dt_train_run(&c, world, &g_report);
}

static dt_status cmd_bench(dt_comm *world, int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "comm") != 0) {
        g_report = dt_comm_rank(world) == 0;
        return dt_fail(DT_EINPUT, "bench: expected `dtrain bench comm [options]`");
    }
    return dt_bench_comm(world, argc - 1, argv + 1);
}

static dt_status cmd_config(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(CONFIG_USAGE, stdout);
        return DT_OK;
    }
    int doc = 0, n = 0;
    long long world = 0;
    dt_status s = DT_OK;
    char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!rest) return dt_fail(DT_ERUNTIME, "out of memory");
    for (int i = 0; i < argc && s == DT_OK; i++) {
        if (!strcmp(argv[i], "--doc")) doc = 1;
        else if (!strcmp(argv[i], "-n")) {
            if ((s = need_value(i, argc, argv)) == DT_OK) s = parse_long("-n", argv[++i], 1, 4096, &world);
        } else rest[n++] = argv[i];
    }
    dt_config c;
    if (s == DT_OK) s = parse_config_args(&c, n, rest);
    free(rest);
    DT_TRY(s);
    note_ds_ignored();
    if (doc) {
        dt_config_write_doc(stdout);
        return DT_OK;
    }
    dt_layout L;
    DT_TRY(dt_layout_build(&L, &c, (int)world));
    DT_TRY(dt_layout_check(&L, DT_CHECK_CONFIG | DT_CHECK_WORLD));
    if (world > 0) c = L.cfg; /* the batch keys as this world resolves them */
    char *js = dt_config_to_json(&c);
    if (!js) return dt_fail(DT_ERUNTIME, "out of memory");
    printf("%s\n", js);
    free(js);
    if (world > 0) dt_mesh_print(stdout, L.dp, L.pp, L.cp, L.tp);
    return DT_OK;
}

static const char *ESTIMATE_USAGE =
    "usage: dtrain estimate [--deepspeed DS.json] [--config FILE] [--set K=V]... -n N [--json]\n"
    "  per-rank memory of parameters, gradients and optimizer state for each ZeRO stage\n"
    "  over N data-parallel ranks (seed-003 formulas, bf16 and fp32), plus activations;\n"
    "  with offload.*: device, host and NVMe bytes per rank and the I/O per step\n";

static dt_status cmd_estimate(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(ESTIMATE_USAGE, stdout);
        return DT_OK;
    }
    long long n = 1;
    int json = 0, k = 0;
    char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!rest) return dt_fail(DT_ERUNTIME, "out of memory");
    dt_status s = DT_OK;
    for (int i = 0; i < argc && s == DT_OK; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "-n")) {
            if ((s = need_value(i, argc, argv)) == DT_OK) s = parse_long("-n", argv[++i], 1, 1 << 24, &n);
        } else rest[k++] = argv[i];
    }
    dt_config c;
    if (s == DT_OK) s = parse_config_args(&c, k, rest);
    free(rest);
    DT_TRY(s);
    note_ds_ignored();
    /* -n is the data-parallel size here, not the world */
    long long world = n * c.parallel.tp * c.parallel.pp * c.parallel.cp;
    if (world > 1 << 30) return dt_fail(DT_EINPUT, "estimate: -n %lld x tp x pp x cp is too large", n);
    dt_layout L;
    DT_TRY(dt_layout_build(&L, &c, (int)world));
    return dt_estimate_print(&L, json, stdout);
}

static const char *PLAN_USAGE =
    "usage: dtrain plan [--deepspeed DS.json] [--config FILE] [--set K=V]... -n WORLD [--ranks-per-node R]\n"
    "                   [--cores C | --load N] [--memory GB] [--flops F] [--intra ALPHA:GBPS] [--inter ALPHA:GBPS]\n"
    "                   [--top K] [--json] [--any-feature]\n"
    "  every dp x pp x cp x tp layout (and ZeRO stage) of WORLD ranks that fits in memory, ranked by\n"
    "  predicted step time (docs/parallelism.md, the planner): compute at F FLOP/s per rank (default:\n"
    "  measured here, with --threads, for each rank's shard shape of the config's model, and the\n"
    "  optimizer's time per parameter), the ranks of a node sharing its C cores (default: a core\n"
    "  each; --load N: measured with N copies at once, the processes that will share this machine's\n"
    "  cores, so the rate is a loaded rank's), communication by the alpha-beta model of each group's\n"
    "  link (inside a node of R ranks: --intra, default 5e-6:10; across: --inter, default 2e-5:1.25;\n"
    "  seconds per message : GB/s), memory by the estimator (default limit: this machine's available\n"
    "  memory over R); --any-feature: also layouts this build refuses for a feature (cp with\n"
    "  bf16, ...), for planning on paper\n";

static dt_status parse_link(const char *opt, const char *v, dt_link *l) {
    char *end;
    double a = strtod(v, &end), b = *end == ':' ? strtod(end + 1, &end) : -1;
    if (*end || !(a >= 0) || !(b > 0)) return dt_fail(DT_EINPUT, "plan: %s %s is not ALPHA:GBPS", opt, v);
    l->alpha = a;
    l->beta = b * 1e9;
    return DT_OK;
}

static dt_status cmd_plan(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(PLAN_USAGE, stdout);
        return DT_OK;
    }
    long long world = 0, rpn = 0, top = 10, cores = 0, load = 0;
    double mem_gb = 0, flops = 0;
    int json = 0, k = 0;
    dt_machine mc = {.intra = {5e-6, 10e9}, .inter = {2e-5, 1.25e9}};
    char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!rest) return dt_fail(DT_ERUNTIME, "out of memory");
    dt_status s = DT_OK;
    for (int i = 0; i < argc && s == DT_OK; i++) {
        const char *a = argv[i];
        int val = !strcmp(a, "-n") || !strcmp(a, "--ranks-per-node") || !strcmp(a, "--memory") ||
                  !strcmp(a, "--cores") || !strcmp(a, "--load") ||
                  !strcmp(a, "--flops") || !strcmp(a, "--intra") || !strcmp(a, "--inter") || !strcmp(a, "--top");
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--any-feature")) mc.any_feature = 1;
        else if (!val) rest[k++] = argv[i];
        else if ((s = need_value(i, argc, argv)) == DT_OK) {
            const char *v = argv[++i];
            char *end;
            if (!strcmp(a, "-n")) s = parse_long("-n", v, 1, 1 << 20, &world);
            else if (!strcmp(a, "--ranks-per-node")) s = parse_long(a, v, 1, 1 << 20, &rpn);
            else if (!strcmp(a, "--top")) s = parse_long(a, v, 1, 1 << 20, &top);
            else if (!strcmp(a, "--cores")) s = parse_long(a, v, 1, 1 << 20, &cores);
            else if (!strcmp(a, "--load")) s = parse_long(a, v, 1, 4096, &load);
            else if (!strcmp(a, "--intra")) s = parse_link(a, v, &mc.intra);
            else if (!strcmp(a, "--inter")) s = parse_link(a, v, &mc.inter);
            else {
                double x = strtod(v, &end);
                if (*end || !(x > 0)) s = dt_fail(DT_EINPUT, "plan: %s %s is not a positive number", a, v);
                if (!strcmp(a, "--memory")) mem_gb = x;
                else flops = x;
            }
        }
    }
    dt_config c;
    if (s == DT_OK) s = parse_config_args(&c, k, rest);
    free(rest);
    DT_TRY(s);
    note_ds_ignored();
    dt_layout L;
    DT_TRY(dt_layout_build(&L, &c, 0));
    DT_TRY(dt_layout_check(&L, DT_CHECK_CONFIG));
    if (world < 1) return dt_fail(DT_EINPUT, "plan: -n WORLD is required");
    if (load && (cores || flops > 0))
        return dt_fail(DT_EINPUT, "plan: --load measures the rate under the node's load: not with --cores or --flops");
    mc.world = (int)world;
    mc.ranks_per_node = rpn > 0 ? (int)rpn : (int)world;
    mc.memory = mem_gb > 0 ? mem_gb * 1e9 : dt_memory_available() / mc.ranks_per_node;
    dt_cpu_set_threads(c.threads);
    mc.cores = (int)cores;
    if (flops <= 0) DT_TRY(dt_plan_calibrate_machine(&c, &mc, (int)load)); /* every shard shape of the world */
    else mc.flops = flops;
    enum { CAP = 1 << 16 }; /* layouts x ZeRO stages: a few thousand for any world up to 2^20 */
    dt_plan_entry *e = malloc(sizeof *e * CAP);
    if (!e) return dt_fail(DT_ERUNTIME, "out of memory");
    int n = dt_plan_all(&c, &mc, e, CAP);
    if (!json) {
        char cores[32] = "";
        if (mc.cores) snprintf(cores, sizeof cores, ", %d cores", mc.cores);
        printf("plan: %d ranks (%d per node%s), %.1f GB per rank, %.3g FLOP/s per rank, links intra %.2g s + "
               "%.3g GB/s, inter %.2g s + %.3g GB/s: %d layouts fit\n", mc.world, mc.ranks_per_node, cores,
               mc.memory / 1e9, mc.flops, mc.intra.alpha, mc.intra.beta / 1e9, mc.inter.alpha, mc.inter.beta / 1e9, n);
    }
    if (n > 0) dt_plan_print(stdout, e, n < top ? n : (int)top, json);
    free(e);
    if (n == 0) { /* what comes nearest, and what would make a layout fit */
        dt_plan_advice a;
        dt_plan_advise(&c, &mc, &a);
        dt_plan_print_advice(stdout, &a, &mc, json);
        fflush(stdout);
    }
    if (n == 0) return dt_fail(DT_EINPUT, "plan: no layout of %d ranks fits in %.1f GB per rank", mc.world, mc.memory / 1e9);
    return DT_OK;
}

static dt_status load_tokenizer(const dt_config *c, dt_tokenizer **tok) {
    dt_layout L;
    dt_layout_derive(&L, c, 1);
    if (L.tokenizer == DT_TOKENIZER_GPT2) return dt_tokenizer_gpt2(tok, c->data.encoder_json, c->data.vocab_bpe);
    return L.tokenizer == DT_TOKENIZER_HF ? dt_tokenizer_hf(tok, c->data.tokenizer_json) : dt_tokenizer_byte(tok);
}

static dt_status cmd_sample(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(SAMPLE_USAGE, stdout);
        return DT_OK;
    }
    const char *ckpt = NULL, *prompt = "";
    dt_sample_opts o = {200, 0.8, 40};
    long long seed = 1, v;
    int echo = 0;
    for (int i = 0; i < argc; i++) { /* first pass: the checkpoint, whose config --set applies to */
        if (!strcmp(argv[i], "--echo")) continue;
        DT_TRY(need_value(i, argc, argv));
        if (!strcmp(argv[i], "--checkpoint")) ckpt = argv[i + 1];
        i++;
    }
    if (!ckpt) return dt_fail(DT_EINPUT, "sample: --checkpoint DIR is required");
    char dir[1024];
    dt_config c, saved;
    DT_TRY(checkpoint_config(ckpt, &saved, dir, sizeof dir));
    c = saved;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--echo")) {
            echo = 1;
            continue;
        }
        DT_TRY(need_value(i, argc, argv));
        const char *val = argv[++i];
        if (!strcmp(a, "--checkpoint")) continue;
        else if (!strcmp(a, "--prompt")) prompt = val;
        else if (!strcmp(a, "--set")) DT_TRY(dt_config_set(&c, val));
        else if (!strcmp(a, "--length")) {
            DT_TRY(parse_long(a, val, 0, 1000000, &v));
            o.length = (int)v;
        } else if (!strcmp(a, "--top-k")) {
            DT_TRY(parse_long(a, val, 0, 1 << 20, &v));
            o.top_k = (int)v;
        } else if (!strcmp(a, "--seed")) {
            DT_TRY(parse_long(a, val, 0, (long long)9e15, &seed));
        } else if (!strcmp(a, "--temperature")) {
            char *end = NULL;
            o.temperature = strtod(val, &end);
            if (!*val || *end || !(o.temperature >= 0 && o.temperature <= 100))
                return dt_fail(DT_EINPUT, "option --temperature: '%s' is not a number in [0, 100]", val);
        } else {
            return dt_fail(DT_EINPUT, "unknown option '%s' (see dtrain sample --help)", a);
        }
    }
    DT_TRY(dt_config_check_resume(&c, &saved, ckpt));
    dt_cpu_set_threads(c.threads);
    dt_layout L; /* one process: the checkpoint's model whole */
    dt_layout_derive(&L, &c, 1);
    gpt_shape shape = L.shape;
    gpt_model m;
    dt_tokenizer *tok = NULL;
    dt_status s = load_tokenizer(&c, &tok); /* before the model: a missing BPE file fails fast */
    if (s != DT_OK) return s;
    s = gpt_create(&m, &shape, dt_ops_cpu(), 1, c.model.seq_len);
    if (s == DT_OK) s = dt_ckpt_load_weights(dir, &m); /* model.safetensors or its index */
    if (s == DT_OK) {
        dt_rng rng;
        dt_rng_seed(&rng, (uint64_t)seed);
        if (echo) fputs(prompt, stdout);
        s = dt_generate(&m, tok, prompt, &o, &rng, stdout);
    }
    dt_tokenizer_free(tok);
    gpt_destroy(&m);
    return s;
}

static const char *EXPORT_USAGE =
    "usage: dtrain export CKPT OUT [--force]\n"
    "  writes OUT/model.safetensors, config.json, generation_config.json (+ GPT-2 tokenizer files\n"
    "  for BPE runs) for transformers' GPT2LMHeadModel.from_pretrained(OUT); see docs/checkpoints.md\n"
    "  CKPT     a step directory, or a --save directory with `latest` (sharded ones too: one file is written)\n"
    "  --force  write into a non-empty OUT (replacing the exported files)\n";

static const char *LAUNCH_USAGE =
    "usage: dtrain launch -n N [options] -- train [train options]\n"
    "  runs `mpirun -np N dtrain train ...` and supervises it: after a failure (a rank that\n"
    "  died, a lost host, a hang) it restarts the job from checkpoint.dir's latest step\n"
    "  -n N                    ranks to start\n"
    "  --max-restarts R        restarts after failures before giving up (default 3)\n"
    "  --restart-delay S       seconds between a failure and its restart (default 1)\n"
    "  --replicas K            parallel.sync local_sgd/diloco: K jobs of N/K ranks, one replica each,\n"
    "                          meeting at the launcher; a failed one restarts alone, the others go on\n"
    "  --outer-addr A          with --replicas: this host's address as theirs reach it (default its name)\n"
    "  --hostfile FILE         Open MPI hostfile, read again before every start: a restart runs on\n"
    "                          the slots it then lists (elastic)\n"
    "  --min-ranks M           smallest world a restart may use (default N); the global batch\n"
    "                          stays that of N ranks, gradient accumulation makes up the rest\n"
    "  --wait-timeout S        when the hostfile offers fewer than M slots, wait up to S seconds\n"
    "                          for more (default 600; 0: fail at once)\n"
    "  --grow                  when the hostfile offers more slots (up to N) while the job runs,\n"
    "                          restart it on them from its next checkpoint (needs --hostfile,\n"
    "                          --save and --save-every)\n"
    "  --heartbeat-timeout S   kill and restart a job one of whose ranks finished no step for S\n"
    "                          seconds (0: off; counted from each rank's first step)\n"
    "  --startup-timeout S     kill and restart a job one of whose ranks finished no first step\n"
    "                          within S seconds of the start (default max(600, 10 x the heartbeat\n"
    "                          timeout) when that is on, else 0: off)\n"
    "  --stop-timeout S        on SIGINT/SIGTERM the job saves and stops; kill it if it has not\n"
    "                          exited S seconds later (default max(300, the heartbeat timeout));\n"
    "                          a second signal kills it at once\n"
    "  --mpirun CMD            the MPI launcher (default mpirun)\n"
    "  --mpi-arg ARG           pass ARG to mpirun (repeatable), e.g. --mpi-arg --oversubscribe\n"
    "  Exit code: the job's (0, 2 for bad input: never restarted), 128 + N when stopped by\n"
    "  signal N (forwarded to the job as SIGUSR1: the ranks save and exit), else the last\n"
    "  failure's after the restarts ran out.\n";

static int cmd_launch(int argc, char **argv) {
    if (argc > 0 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        fputs(LAUNCH_USAGE, stdout);
        return 0;
    }
    dt_launch_opts o;
    int used = 0;
    dt_status s = dt_launch_parse(&o, argc, argv, &used);
    if (s == DT_OK && (used >= argc || strcmp(argv[used], "train")))
        s = dt_fail(DT_EINPUT, "launch: expected `-- train [train options]`, got `-- %s`", used < argc ? argv[used] : "");
    dt_config c;
    int targc = argc - used - 1;
    char **targv = argv + used + 1;
    /* the job's config, checked here so bad input fails once, before any rank starts */
    if (s == DT_OK) s = parse_config_args(&c, targc, targv);
    dt_layout L;
    if (s == DT_OK) s = dt_layout_build(&L, &c, o.nproc);
    /* the ranks check the world they get (an elastic restart may take fewer) */
    if (s == DT_OK) s = dt_layout_check(&L, DT_CHECK_CONFIG | DT_CHECK_FEATURES);
    char self[DT_PATH_MAX];
    ssize_t n = s == DT_OK ? readlink("/proc/self/exe", self, sizeof self - 1) : 0;
    if (s == DT_OK && n <= 0) s = dt_fail(DT_ERUNTIME, "launch: cannot find this program (/proc/self/exe)");
    if (s != DT_OK) {
        fprintf(stderr, "dtrain: error: %s\n", dt_error_message());
        return (int)s;
    }
    self[n] = 0;
    return dt_launch_run(&o, &L.cfg, self, targc, targv);
}

static dt_status cmd_export(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(EXPORT_USAGE, stdout);
        return DT_OK;
    }
    const char *pos[2] = {NULL, NULL};
    int npos = 0, force = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--force")) force = 1;
        else if (argv[i][0] == '-' || npos == 2)
            return dt_fail(DT_EINPUT, "export: unexpected argument '%s' (see dtrain export --help)", argv[i]);
        else pos[npos++] = argv[i];
    }
    if (npos != 2) return dt_fail(DT_EINPUT, "export: expected CKPT OUT (see dtrain export --help)");
    dt_export_info info;
    DT_TRY(dt_export(pos[0], pos[1], force, &info));
    printf("export: step %lld from %s -> %s (model.safetensors, config.json, generation_config.json%s)\n", info.step,
           info.step_dir, pos[1], info.tokenizer_files ? ", GPT-2 tokenizer files" : "");
    if (!info.tokenizer_files)
        printf("export: note: byte-tokenizer run: no Hugging Face tokenizer files written (token id = byte value)\n");
    return DT_OK;
}

static dt_status cmd_prepare(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(PREPARE_USAGE, stdout);
        return DT_OK;
    }
    const char **inputs = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!inputs) return dt_fail(DT_ERUNTIME, "out of memory");
    int nin = 0;
    const char *out = NULL, *kind = "byte", *enc = "", *bpe = "";
    dt_prep_opts po = {.format = DT_PREP_TEXT, .field = NULL, .val_fraction = 0.1};
    dt_status s = DT_OK;
    for (int i = 0; i < argc && s == DT_OK; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--fortune")) { /* the one flag without a value */
            po.format = DT_PREP_FORTUNE;
            continue;
        }
        if (strcmp(a, "--input") && strcmp(a, "--out") && strcmp(a, "--tokenizer") && strcmp(a, "--encoder-json") &&
            strcmp(a, "--vocab-bpe") && strcmp(a, "--val-fraction") && strcmp(a, "--format") && strcmp(a, "--field")) {
            s = dt_fail(DT_EINPUT, "%s '%s' (see dtrain prepare --help)", a[0] == '-' ? "unknown option" : "unexpected argument", a);
            break;
        }
        if ((s = need_value(i, argc, argv)) != DT_OK) break;
        const char *val = argv[++i];
        if (!strcmp(a, "--input")) inputs[nin++] = val;
        else if (!strcmp(a, "--out")) out = val;
        else if (!strcmp(a, "--tokenizer")) kind = val;
        else if (!strcmp(a, "--encoder-json")) enc = val;
        else if (!strcmp(a, "--vocab-bpe")) bpe = val;
        else if (!strcmp(a, "--field")) po.field = val;
        else if (!strcmp(a, "--format")) {
            if (dt_prep_format_of(val, &po.format) != 0)
                s = dt_fail(DT_EINPUT, "option --format: '%s' is not one of text, fortune, jsonl, prompt, chat", val);
        } else if (!strcmp(a, "--val-fraction")) {
            char *end = NULL;
            double valf = strtod(val, &end);
            po.val_fraction = valf;
            if (!*val || *end || !(valf >= 0 && valf < 1))
                s = dt_fail(DT_EINPUT, "option --val-fraction: '%s' is not a number in [0, 1)", val);
        } else s = dt_fail(DT_EINPUT, "unknown option '%s' (see dtrain prepare --help)", a);
    }
    if (s == DT_OK && (!nin || !out)) s = dt_fail(DT_EINPUT, "prepare: --input FILE and --out PREFIX are required");
    if (s == DT_OK && po.field && po.format != DT_PREP_JSONL)
        s = dt_fail(DT_EINPUT, "prepare: --field is for --format jsonl (prompt and chat have fixed fields)");
    size_t kl = strlen(kind);
    int hf = kl > 5 && !strcmp(kind + kl - 5, ".json"); /* a Hugging Face tokenizer.json */
    if (s == DT_OK && strcmp(kind, "byte") && strcmp(kind, "gpt2") && !hf)
        s = dt_fail(DT_EINPUT, "prepare: --tokenizer '%s' is not one of byte, gpt2, PATH/tokenizer.json", kind);
    if (s == DT_OK && !strcmp(kind, "gpt2") && (!enc[0] || !bpe[0]))
        s = dt_fail(DT_EINPUT, "prepare: --tokenizer gpt2 needs --encoder-json FILE and --vocab-bpe FILE");
    dt_tokenizer *tok = NULL;
    if (s == DT_OK) s = dt_prepare_check_out(out);
    if (s == DT_OK)
        s = hf ? dt_tokenizer_hf(&tok, kind) : !strcmp(kind, "gpt2") ? dt_tokenizer_gpt2(&tok, enc, bpe)
                                                                      : dt_tokenizer_byte(&tok);
    size_t ntrain = 0, nval = 0, ndocs = 0;
    if (s == DT_OK) s = dt_prepare(tok, inputs, nin, out, &po, &ntrain, &nval, &ndocs);
    char vtext[DT_PATH_MAX + 64] = "no validation file";
    if (s == DT_OK && nval > 0) snprintf(vtext, sizeof vtext, "%zu validation tokens -> %s_val.bin", nval, out);
    if (s == DT_OK)
        printf("prepare: %zu documents; %zu training tokens -> %s_train.bin, %s (vocab %d)\n", ndocs, ntrain, out, vtext,
               dt_tokenizer_vocab(tok));
    dt_tokenizer_free(tok);
    free(inputs);
    return s;
}

/* A command's result on stdout is the point of it (`dtrain config > my.json`): a write
 * that failed (a full disk, a closed pipe) is exit 1, not 0 and an empty file. stdio
 * keeps the unwritten bytes, so the flush here fails again and errno says why. A
 * command that failed already keeps its own error and code. */
static int check_stdout(int code) {
    errno = 0;
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (!bad || code != 0) return code;
    fprintf(stderr, "dtrain: error: writing standard output: %s\n", e ? strerror(e) : "write error");
    return DT_ERUNTIME;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return check_stdout(argc < 2 ? DT_EINPUT : 0);
    }
    const char *cmd = argv[1];
    dt_status s;
    if (!strcmp(cmd, "train") || !strcmp(cmd, "bench")) {
        /* the commands that run on many ranks (under mpirun; one rank otherwise) */
        dt_comm *world = NULL;
        dt_signals_die_with_parent(); /* no rank outlives its mpirun */
        s = dt_comm_init(&world, &argc, &argv);
        if (s == DT_OK) {
            s = !strcmp(cmd, "train") ? cmd_train(world, argc - 2, argv + 2) : cmd_bench(world, argc - 2, argv + 2);
            if (s == DT_EINTERRUPTED && g_report) fprintf(stderr, "dtrain: %s\n", dt_error_message());
            else if (s != DT_OK && g_report) fprintf(stderr, "dtrain: error: %s\n", dt_error_message());
            /* bench's table is its result; train's stdout is progress, its results are files */
            if (!strcmp(cmd, "bench")) s = (dt_status)check_stdout((int)s);
            else fflush(stdout);
            dt_comm_finalize(world);
        } else {
            fprintf(stderr, "dtrain: error: %s\n", dt_error_message());
        }
        return s == DT_EINTERRUPTED ? 128 + dt_signal_pending() : (int)s;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("dtrain %s\n", DT_VERSION);
        return check_stdout(0);
    }
    if (!strcmp(cmd, "launch")) return check_stdout(cmd_launch(argc - 2, argv + 2));
    if (!strcmp(cmd, "sample")) s = cmd_sample(argc - 2, argv + 2);
    else if (!strcmp(cmd, "prepare")) s = cmd_prepare(argc - 2, argv + 2);
    else if (!strcmp(cmd, "export")) s = cmd_export(argc - 2, argv + 2);
    else if (!strcmp(cmd, "config")) s = cmd_config(argc - 2, argv + 2);
    else if (!strcmp(cmd, "estimate")) s = cmd_estimate(argc - 2, argv + 2);
    else if (!strcmp(cmd, "plan")) s = cmd_plan(argc - 2, argv + 2);
    else if (!strcmp(cmd, "report")) s = dt_report_cmd(argc - 2, argv + 2);
    else s = dt_fail(DT_EINPUT, "unknown command '%s' (see dtrain --help)", cmd);
    if (s != DT_OK) fprintf(stderr, "dtrain: error: %s\n", dt_error_message());
    return check_stdout((int)s);
}
