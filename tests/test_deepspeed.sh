# DeepSpeed configs (--deepspeed FILE): the design notes' ZeRO-2, ZeRO-3 and ZeRO-3 +
# CPU offload files (configs/deepspeed/) translate to the dtrain config they mean (dtrain
# config shows it), train to the same weights as that config written by hand on 2 ranks
# (parity of --digest), the offload one translates onto offload.*; "auto" keeps dtrain's value,
# the batch triple is checked against the world size, wrong types and math-changing keys
# are exit 2 naming the key, no-op keys are listed once. train.grad_accum, the dtrain key,
# gives the weights of the derived accumulation and refuses a contradicting global batch.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
DS="$SRC/configs/deepspeed"
# the tiny model by --set only: a --config file would override the DeepSpeed keys
MODEL=(--set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32
       --set model.vocab_size=300 --set "data.train=$TMP/c_train.bin" --set "data.val=$TMP/c_val.bin"
       --set train.val_every=0 --set train.micro_batch=2 --threads 1)
RUN=("${MODEL[@]}" --steps 2 --digest)
# key FILE K...: the values of dotted keys K in the JSON object that starts FILE (config -n adds the mesh after it)
key() { python3 -c "import json,sys; c=json.JSONDecoder().raw_decode(open(sys.argv[1]).read())[0]; [print(eval('c' + ''.join('[%r]' % p for p in k.split('.')))) for k in sys.argv[2:]]" "$@" | tr '\n' ' ' | sed 's/ $//'; }
# exit2 NAME PATTERN ARGS...: `dtrain ARGS` exits 2 with one error line matching PATTERN
exit2() {
  local name=$1 pat=$2; shift 2
  "$DTRAIN" "$@" >"$TMP/x.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/x.out")" -eq 1 ] && grep -q "$pat" "$TMP/x.out" \
    && pass "$name: $(grep '^dtrain: error' "$TMP/x.out" | cut -c1-200)" || fail "$name: rc $rc: $(tail -2 "$TMP/x.out")"
}
ds() { printf '%s\n' "$2" >"$TMP/$1.json"; }
# dsf JSON: a DeepSpeed file holding JSON; prints its path
dsf() { local f; f=$(mktemp "$TMP/dsXXXXXX.json"); printf '%s\n' "$1" >"$f"; echo "$f"; }

# --- the effective config of each design-notes file ---------------------------------------
"$DTRAIN" config --deepspeed "$DS/zero2.json" "${MODEL[@]}" -n 2 >"$TMP/z2.json" 2>"$TMP/z2.err" || fail "config zero2"
got=$(key "$TMP/z2.json" precision parallel.zero parallel.overlap train.grad_clip train.grad_accum train.micro_batch \
      train.global_batch parallel.bucket_mb)
[ "$got" = "bf16 2 True 1 4 2 16 953.67431640625" ] \
  && pass "zero2.json -> bf16, zero 2, overlap, clip 1, accumulation 4, global batch 2 x 2 ranks x 4, bucket 5e8 bf16 elements = 954 MiB" \
  || fail "zero2 effective config: $got"
grep -q "ignored keys: zero_optimization.contiguous_gradients, zero_optimization.allgather_bucket_size$" "$TMP/z2.err" \
  && pass "zero2.json: $(cat "$TMP/z2.err")" || fail "zero2 ignored list: $(cat "$TMP/z2.err")"
"$DTRAIN" config --deepspeed "$DS/zero3.json" "${MODEL[@]}" >"$TMP/z3.json" 2>"$TMP/z3.err" || fail "config zero3"
got=$(key "$TMP/z3.json" precision parallel.zero train.grad_accum train.global_batch)
[ "$got" = "bf16 3 4 0" ] && pass "zero3.json -> bf16, zero 3, accumulation 4 (global batch 0 until the world is known)" \
  || fail "zero3 effective config: $got"
n=$(grep -o 'stage3_[a-z_]*' "$TMP/z3.err" | tr '\n' ' ')
[ "$n" = "stage3_prefetch_bucket_size stage3_param_persistence_threshold stage3_max_live_parameters stage3_max_reuse_distance " ] \
  && ! grep -q gather_16bit "$TMP/z3.err" && pass "zero3.json: tuning knobs listed, gather_16bit_weights (dtrain's saves are whole) not" \
  || fail "zero3 ignored list: $(cat "$TMP/z3.err")"
"$DTRAIN" config --deepspeed "$DS/zero2.json" --set parallel.zero=1 --set precision=fp32 >"$TMP/o.json" 2>/dev/null
[ "$(key "$TMP/o.json" parallel.zero precision)" = "1 fp32" ] && pass "--set overrides the DeepSpeed file" \
  || fail "override order: $(key "$TMP/o.json" parallel.zero precision)"
"$DTRAIN" estimate --deepspeed "$DS/zero3.json" "${MODEL[@]}" -n 2 >"$TMP/o" 2>&1 && grep -q "activations (micro-batch 2 x 32 tokens, bf16)" "$TMP/o" \
  && pass "estimate --deepspeed (bf16 activations)" || fail "estimate --deepspeed: $(tail -2 "$TMP/o")"
"$DTRAIN" plan --deepspeed "$DS/zero3.json" "${MODEL[@]}" -n 2 --flops 1e9 --memory 1 >"$TMP/o" 2>&1 \
  && pass "plan --deepspeed" || fail "plan --deepspeed: $(tail -2 "$TMP/o")"

# --- parity: the DeepSpeed file and the dtrain config it means give the same weights ------
HAND=(--set precision=bf16 --set train.grad_clip=1 --set train.global_batch=16 --set parallel.bucket_mb=953.67431640625)
for z in 2 3; do
  "${MPI[@]}" -np 2 "$DTRAIN" train --deepspeed "$DS/zero$z.json" "${RUN[@]}" >"$TMP/ds$z.out" 2>&1 || fail "zero$z ds run"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${HAND[@]}" --set parallel.zero=$z >"$TMP/hand$z.out" 2>&1 || fail "zero$z hand run"
  a=$(digest_of "$TMP/ds$z.out"); b=$(digest_of "$TMP/hand$z.out")
  [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "micro-batch 2 x 2 data-parallel x 4 accumulation" "$TMP/ds$z.out" \
    && grep -q "ZeRO stage $z" "$TMP/ds$z.out" \
    && pass "zero$z.json on 2 ranks = its hand-written dtrain config (4 accumulation, ZeRO $z): $a" \
    || fail "zero$z parity: '$a' vs '$b': $(grep 'global batch' "$TMP/ds$z.out")"
  [ "$(grep -c 'deepspeed config: ignored keys' "$TMP/ds$z.out")" -eq 1 ] && pass "zero$z: ignored keys listed once on 2 ranks" \
    || fail "zero$z: ignored-keys lines: $(grep -c 'ignored keys' "$TMP/ds$z.out")"
done

# --- the offload file: translated onto offload.* (docs/offload.md) -------------------------
"$DTRAIN" config --deepspeed "$DS/zero3_offload.json" "${MODEL[@]}" -n 2 >"$TMP/off.json" 2>"$TMP/off.err" \
  || fail "config zero3_offload: $(cat "$TMP/off.err")"
got=$(key "$TMP/off.json" parallel.zero offload.optimizer offload.param offload.pin_memory precision train.grad_accum)
[ "$got" = "3 cpu cpu True bf16 8" ] && ! grep -q offload "$TMP/off.err" \
  && pass "zero3_offload.json -> zero 3, offload.optimizer cpu, offload.param cpu, pin_memory, bf16, accumulation 8" \
  || fail "zero3_offload effective config: $got: $(cat "$TMP/off.err")"
ds offnone '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none", "pin_memory": true}}}'
"$DTRAIN" config --deepspeed "$TMP/offnone.json" >"$TMP/o.json" 2>&1 && [ "$(key "$TMP/o.json" offload.optimizer)" = none ] \
  && pass "offload device none is accepted" || fail "device none"
"$DTRAIN" config --deepspeed "$(dsf '{"zero_optimization": {"stage": 2, "cpu_offload": true}}')" >"$TMP/o.json" 2>/dev/null
[ "$(key "$TMP/o.json" offload.optimizer parallel.zero)" = "cpu 2" ] && pass "legacy cpu_offload: true -> offload.optimizer cpu" \
  || fail "legacy cpu_offload: $(key "$TMP/o.json" offload.optimizer parallel.zero)"
ds nvme '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 4},
 "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_size": 1e8}}, "aio": {"block_size": 1048576, "queue_depth": 8}}'
"$DTRAIN" config --deepspeed "$TMP/nvme.json" >"$TMP/o.json" 2>"$TMP/e"
[ "$(key "$TMP/o.json" offload.optimizer offload.param offload.nvme_path offload.block_mb offload.buffer_count)" = "nvme nvme /local_nvme 1 4" ] \
  && grep -q "ignored keys: zero_optimization.offload_param.buffer_size (dtrain sizes its buffers from offload.block_mb), aio.queue_depth" "$TMP/e" \
  && pass "ZeRO-Infinity nvme file -> offload.* = nvme, one directory, block_size 1 MiB; $(cat "$TMP/e")" \
  || fail "nvme translation: $(key "$TMP/o.json" offload.optimizer offload.param offload.nvme_path offload.block_mb offload.buffer_count): $(cat "$TMP/e")"
exit2 "two offload directories" "offload_optimizer.nvme_path '/a' and zero_optimization.offload_param.nvme_path '/b' differ" \
  config --deepspeed "$(dsf '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/a"}, "offload_param": {"device": "nvme", "nvme_path": "/b"}}}')"
exit2 "partial offload" "offload_optimizer.ratio: partial offload is not supported" \
  config --deepspeed "$(dsf '{"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.3}}}')"
# the translated keys meet the trainer's rules: parameter offload is ZeRO-3's, as in DeepSpeed
exit2 "offload_param below ZeRO-3" "offload.param cpu needs parallel.zero=3" \
  train --deepspeed "$(dsf '{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}')" "${RUN[@]}"

# --- auto and the batch triple -----------------------------------------------------------
ds auto '{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"}}'
"$DTRAIN" config --deepspeed "$TMP/auto.json" --set train.micro_batch=3 -n 2 >"$TMP/a.json" 2>/dev/null
[ "$(key "$TMP/a.json" train.micro_batch train.global_batch train.grad_accum train.grad_clip precision)" = "3 0 0 1 fp32" ] \
  && pass "\"auto\" everywhere keeps dtrain's values" || fail "auto: $(key "$TMP/a.json" train.micro_batch train.global_batch train.grad_accum train.grad_clip precision)"
ds tbs '{"train_batch_size": 16, "gradient_accumulation_steps": 2}'
"$DTRAIN" config --deepspeed "$TMP/tbs.json" -n 2 >"$TMP/a.json" 2>/dev/null
[ "$(key "$TMP/a.json" train.micro_batch train.global_batch)" = "4 16" ] \
  && pass "train_batch_size 16 + accumulation 2 on 2 ranks: micro-batch 4, as DeepSpeed derives it" \
  || fail "derived micro: $(key "$TMP/a.json" train.micro_batch train.global_batch)"
ds triple '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}'
"${MPI[@]}" -np 2 "$DTRAIN" train --deepspeed "$TMP/triple.json" "${RUN[@]}" >"$TMP/t.out" 2>&1 \
  || fail "triple run"
grep -q "global batch 16 x 32 tokens (micro-batch 2 x 2 data-parallel x 4 accumulation)" "$TMP/t.out" \
  && pass "16 = 2 x 4 x 2 ranks: consistent triple runs" || fail "triple: $(tail -2 "$TMP/t.out")"
timeout 120 "${MPI[@]}" -np 3 "$DTRAIN" train --deepspeed "$TMP/triple.json" "${RUN[@]}" >"$TMP/t3.out" 2>&1; rc=$?
[ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/t3.out")" -eq 1 ] \
  && grep -q "train.global_batch 16 is not train.micro_batch 2 x data-parallel size 3 x train.grad_accum 4" "$TMP/t3.out" \
  && pass "the same triple on 3 ranks: $(grep '^dtrain: error' "$TMP/t3.out")" || fail "triple on 3 ranks: rc $rc: $(tail -2 "$TMP/t3.out")"
exit2 "train_batch_size not a multiple of micro x accumulation" "train_batch_size 10 is not train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 4" \
  config --deepspeed "$(dsf '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}')"

# --- types, refusals, ignored and unknown keys -------------------------------------------
exit2 "a string where a number belongs" "gradient_clipping must be a number or \"auto\", not a string" \
  config --deepspeed "$(dsf '{"gradient_clipping": "1.0"}')"
exit2 "a string ZeRO stage" "zero_optimization.stage must be a number or \"auto\", not a string" \
  config --deepspeed "$(dsf '{"zero_optimization": {"stage": "3"}}')"
exit2 "bf16.enabled not a boolean" "bf16.enabled must be true, false or \"auto\", not a number" \
  config --deepspeed "$(dsf '{"bf16": {"enabled": 1}}')"
exit2 "fp16 enabled" "fp16.enabled: fp16 with loss scaling is not implemented" \
  config --deepspeed "$(dsf '{"fp16": {"enabled": true, "loss_scale": 0}}')"
"$DTRAIN" config --deepspeed "$(dsf '{"fp16": {"enabled": false, "loss_scale": 0}}')" >/dev/null 2>"$TMP/e" \
  && grep -q "ignored keys: fp16.loss_scale$" "$TMP/e" && pass "fp16 disabled: accepted, its loss scale listed as ignored" \
  || fail "fp16 disabled: $(cat "$TMP/e")"
exit2 "unknown ZeRO key (DeepSpeed refuses it too)" "unknown key zero_optimization.stgae" \
  config --deepspeed "$(dsf '{"zero_optimization": {"stgae": 3}}')"
exit2 "quantized ZeRO" "zero_quantized_gradients: quantized ZeRO" \
  config --deepspeed "$(dsf '{"zero_optimization": {"stage": 3, "zero_quantized_gradients": true}}')"
exit2 "curriculum learning" "curriculum_learning.enabled" config --deepspeed "$(dsf '{"curriculum_learning": {"enabled": true}}')"
"$DTRAIN" config --deepspeed "$(dsf '{"steps_per_print": 5, "wall_clock_breakdown": false, "zero_allow_untested_optimizer": true, "tensorboard": {"enabled": false}, "my_key": 1}')" \
  >"$TMP/o.json" 2>"$TMP/e"
[ "$(key "$TMP/o.json" log.every)" = 5 ] && grep -q "ignored keys: zero_allow_untested_optimizer, tensorboard, my_key (not a DeepSpeed key)$" "$TMP/e" \
  && pass "steps_per_print -> log.every; $(cat "$TMP/e")" || fail "ignored/unknown top-level keys: $(cat "$TMP/e")"
exit2 "--config with a DeepSpeed file" "is a DeepSpeed config (it has 'bf16'): pass it with --deepspeed FILE" \
  config --config "$DS/zero2.json"

# --- optimizer and scheduler blocks ------------------------------------------------------
ds opt '{"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.05}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 40, "warmup_num_steps": 4, "warmup_type": "linear", "cos_min_ratio": 0.1}}}'
"$DTRAIN" config --deepspeed "$TMP/opt.json" >"$TMP/o.json" 2>/dev/null
got=$(key "$TMP/o.json" train.lr train.beta1 train.beta2 train.eps train.weight_decay train.steps train.warmup_steps train.min_lr)
[ "$got" = "0.001 0.8 0.99 1e-06 0.05 40 4 0.0001" ] && pass "AdamW + WarmupCosineLR (linear) -> lr, betas, eps, decay, steps, warmup, min_lr = 0.1 x lr" \
  || fail "optimizer/scheduler: $got"
ds wlr '{"optimizer": {"type": "Adam", "params": {"lr": "auto", "weight_decay": 0.01}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 5e-3, "warmup_num_steps": 3, "warmup_type": "linear"}}}'
"$DTRAIN" config --deepspeed "$TMP/wlr.json" >"$TMP/o.json" 2>/dev/null
[ "$(key "$TMP/o.json" train.lr train.min_lr train.warmup_steps train.weight_decay)" = "0.005 0.005 3 0.01" ] \
  && pass "Adam (adam_w_mode: AdamW) + WarmupLR -> constant lr after the warmup (min_lr = lr)" \
  || fail "WarmupLR: $(key "$TMP/o.json" train.lr train.min_lr train.warmup_steps train.weight_decay)"
exit2 "log warmup (DeepSpeed's default)" "scheduler.params.warmup_type = 'log' (DeepSpeed's default): dtrain's warmup is linear" \
  config --deepspeed "$(dsf '{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}')"
exit2 "WarmupDecayLR" "scheduler.type = 'WarmupDecayLR'.*decays linearly" \
  config --deepspeed "$(dsf '{"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10}}}')"
exit2 "another optimizer" "optimizer.type = 'Lamb': dtrain implements AdamW only" \
  config --deepspeed "$(dsf '{"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}')"
exit2 "Adam with L2 decay" "adam_w_mode: false with weight_decay is Adam with L2" \
  config --deepspeed "$(dsf '{"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0.1}}}')"
exit2 "betas of the wrong type" "optimizer.params.betas must be an array of two numbers" \
  config --deepspeed "$(dsf '{"optimizer": {"type": "AdamW", "params": {"betas": 0.9}}}')"
# the file's schedule (40 steps, 4 of warmup) stopped after 2 steps: train.stop_after, not --steps
"$DTRAIN" train --deepspeed "$TMP/opt.json" "${MODEL[@]}" --set train.stop_after=2 --digest >"$TMP/opt.out" 2>&1 || fail "opt run"
"$DTRAIN" train "${MODEL[@]}" --set train.lr=1e-3 --set train.beta1=0.8 --set train.beta2=0.99 --set train.eps=1e-6 \
  --set train.weight_decay=0.05 --set train.warmup_steps=4 --set train.min_lr=1e-4 --set train.steps=40 \
  --set train.stop_after=2 --digest >"$TMP/opth.out" 2>&1
[ -n "$(digest_of "$TMP/opt.out")" ] && [ "$(digest_of "$TMP/opt.out")" = "$(digest_of "$TMP/opth.out")" ] \
  && pass "optimizer + scheduler file = its hand-written config (digest)" || fail "optimizer parity: $(tail -2 "$TMP/opt.out")"

# --- train.grad_accum, the dtrain key ----------------------------------------------------
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set train.grad_accum=3 >"$TMP/ga.out" 2>&1 || fail "grad_accum run"
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set train.global_batch=12 >"$TMP/gb.out" 2>&1 || fail "derived run"
a=$(digest_of "$TMP/ga.out"); b=$(digest_of "$TMP/gb.out")
[ -n "$a" ] && [ "$a" = "$b" ] && grep -q "global batch 12 x 32 tokens (micro-batch 2 x 2 data-parallel x 3 accumulation)" "$TMP/ga.out" \
  && pass "train.grad_accum=3 (global batch 0) = global_batch 12 derived, on 2 ranks: $a" || fail "grad_accum parity: '$a' vs '$b'"
# a checkpoint keeps the global batch, not the accumulation: resuming on 1 rank re-derives it
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set train.grad_accum=3 --set train.stop_after=1 --save "$TMP/ck" >/dev/null 2>&1 \
  || fail "grad_accum save"
"$DTRAIN" train --resume "$TMP/ck" --threads 1 >"$TMP/r.out" 2>&1 \
  && grep -q "global batch 12 x 32 tokens (micro-batch 2 x 1 data-parallel x 6 accumulation)" "$TMP/r.out" \
  && pass "train.grad_accum=3 on 2 ranks, resumed on 1: the global batch 12 kept, accumulation 6" \
  || fail "grad_accum resume: $(grep 'error\|global batch' "$TMP/r.out")"
"$DTRAIN" config "${MODEL[@]}" --set train.grad_accum=3 --set train.global_batch=12 -n 2 >/dev/null 2>&1 \
  && pass "grad_accum 3 with a global batch 12 that agrees" || fail "agreeing grad_accum"
exit2 "grad_accum contradicting global_batch" "train.global_batch 8 is not train.micro_batch 2 x data-parallel size 2 x train.grad_accum 3" \
  config "${MODEL[@]}" --set train.grad_accum=3 --set train.global_batch=8 -n 2
exit2 "grad_accum contradicting parallel.micro_batches" "train.grad_accum 3 and parallel.micro_batches 2 disagree" \
  config "${MODEL[@]}" --set train.grad_accum=3 --set parallel.micro_batches=2 --set train.global_batch=12 -n 2
finish
