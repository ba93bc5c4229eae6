# Training on the GPU against the CPU backend: the same run (20 steps, gradient
# accumulation, validation) gives the same losses and gradient norms within 1e-4
# relative in fp32; a checkpoint saved on the GPU resumes on the CPU and the other way
# round; bf16 tracks fp32; packed and padded documents follow the CPU. Several ranks on the one GPU (host-staged MPI): DDP, the
# central rank, tp (with sp), pp, dp x pp, pp x tp, ZeRO 1-3 give the single-process GPU curve, in
# fp32 within 1e-5 and bf16 within 1e-2; a pp x tp checkpoint resumes on the CPU. The Llama
# family follows the CPU (fp32 within 1e-4, bf16 storage within 1e-2), and tp2 its GPU run.
# Without a GPU: `backend: cuda` is a one-line error with exit 2, then skip (77).
source "$(dirname "$0")/lib.sh"
prepare_tiny
out=$("$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --steps 1 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q -E "no usable GPU|built without CUDA"; then
  [ $rc -eq 2 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && pass "no GPU: one line, exit 2 ($out)" ||
    fail "no GPU: rc $rc, output: $out"
  finish || exit 1
  echo "skip: no GPU"
  exit 77
fi

# curves A B TOL [KEYS]: per-step loss and grad norm (or KEYS, comma-separated), and
# val losses, within TOL relative
curves() {
  python3 - "$1" "$2" "$3" "${4:-loss,grad_norm}" <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p)]
    return {r["step"]: r for r in rows if "event" not in r}, [r["val_loss"] for r in rows if r.get("event") == "val"]
(ref, rv), (got, gv) = load(sys.argv[1]), load(sys.argv[2])
assert sorted(got) == sorted(ref), (sorted(got), sorted(ref))
worst = 0.0
for s in ref:
    for k in sys.argv[4].split(","):
        worst = max(worst, abs(got[s][k] - ref[s][k]) / abs(ref[s][k]))
for a, b in zip(rv, gv):
    worst = max(worst, abs(a - b) / abs(a))
assert len(rv) == len(gv), (rv, gv)
print("max rel diff %.2e over %d steps" % (worst, len(ref)))
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
PY
}

"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/cpu.jsonl" > "$TMP/cpu.log" 2>&1 || fail "cpu run"
"$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --metrics "$TMP/gpu.jsonl" > "$TMP/gpu.log" 2>&1 ||
  { cat "$TMP/gpu.log"; fail "gpu run"; }
grep -m1 "GPU\|H100\|H200\|NVIDIA" "$TMP/gpu.log" >/dev/null && pass "the header names the GPU" ||
  fail "the header names no GPU: $(head -3 "$TMP/gpu.log")"
r=$(curves "$TMP/cpu.jsonl" "$TMP/gpu.jsonl" 1e-4) && pass "gpu = cpu training curve: $r" || fail "gpu vs cpu: $r"

# checkpoints cross backends: 10 steps on one, 10 more on the other, against the straight cpu run
"$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set train.stop_after=10 --save "$TMP/g10" \
  --metrics "$TMP/g10.jsonl" > /dev/null 2>&1 || fail "gpu first half"
"$DTRAIN" train "${DP_RUN[@]}" --set backend=cpu --resume "$TMP/g10" --metrics "$TMP/g10.jsonl" > /dev/null 2>&1 ||
  fail "cpu resumes a gpu checkpoint"
r=$(curves "$TMP/cpu.jsonl" "$TMP/g10.jsonl" 1e-4) && pass "gpu save -> cpu resume: $r" || fail "gpu -> cpu: $r"
"$DTRAIN" train "${DP_RUN[@]}" --set train.stop_after=10 --save "$TMP/c10" --metrics "$TMP/c10.jsonl" \
  > /dev/null 2>&1 || fail "cpu first half"
"$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --resume "$TMP/c10" --metrics "$TMP/c10.jsonl" > /dev/null 2>&1 ||
  fail "gpu resumes a cpu checkpoint"
r=$(curves "$TMP/cpu.jsonl" "$TMP/c10.jsonl" 1e-4) && pass "cpu save -> gpu resume: $r" || fail "cpu -> gpu: $r"

# bf16 on the GPU tracks the fp32 curve (acceptance: within 2%), and the CPU's bf16
"$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set precision=bf16 --metrics "$TMP/gpu16.jsonl" \
  > "$TMP/gpu16.log" 2>&1 || { tail -3 "$TMP/gpu16.log"; fail "gpu bf16 run"; }
r=$(curves "$TMP/cpu.jsonl" "$TMP/gpu16.jsonl" 0.02 loss) && pass "gpu bf16 loss vs fp32: $r" ||
  fail "gpu bf16 vs fp32: $r"
"$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --metrics "$TMP/cpu16.jsonl" > /dev/null 2>&1 ||
  fail "cpu bf16 run"
r=$(curves "$TMP/cpu16.jsonl" "$TMP/gpu16.jsonl" 0.01) && pass "gpu bf16 vs cpu bf16 storage: $r" ||
  fail "gpu bf16 vs cpu bf16: $r"

# documents on the GPU (data.layout pack and pad: the attention kernels skip the keys of
# earlier documents): the CPU's curve in fp32, bf16 within 2%
prepare_prompt_docs
for rows in pack pad; do
  DOCS=(--set "data.train=$TMP/d_train.bin" --set "data.val=$TMP/d_val.bin" --set data.layout=$rows)
  "$DTRAIN" train "${DP_RUN[@]}" "${DOCS[@]}" --metrics "$TMP/c$rows.jsonl" >/dev/null 2>&1 || fail "cpu $rows run"
  for prec in fp32 bf16; do
    "$DTRAIN" train "${DP_RUN[@]}" "${DOCS[@]}" --set backend=cuda --set precision=$prec \
      --metrics "$TMP/g$rows$prec.jsonl" >"$TMP/g$rows$prec.log" 2>&1 ||
      { tail -3 "$TMP/g$rows$prec.log"; fail "gpu $rows $prec run"; }
    [ $prec = fp32 ] && tol=1e-4 keys=loss,grad_norm || tol=0.02 keys=loss
    r=$(curves "$TMP/c$rows.jsonl" "$TMP/g$rows$prec.jsonl" $tol $keys) &&
      pass "gpu $rows $prec = cpu $rows curve: $r" || fail "gpu $rows $prec: $r"
  done
done

# data parallelism on one GPU: two ranks (DDP over MPI, gradients staged through the
# host) train the single-process run's model
if command -v mpirun > /dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --metrics "$TMP/gdp2.jsonl" > "$TMP/gdp2.log" 2>&1 ||
    { tail -3 "$TMP/gdp2.log"; fail "gpu dp2 run"; }
  r=$(curves "$TMP/gpu.jsonl" "$TMP/gdp2.jsonl" 1e-5) && pass "gpu dp2 = gpu single process: $r" ||
    fail "gpu dp2: $r"
  # the central rank on one GPU: gradients reduced to rank 0 through the host, its update broadcast
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set parallel.dp_mode=ps --metrics "$TMP/gps2.jsonl" \
    > "$TMP/gps2.log" 2>&1 || { tail -3 "$TMP/gps2.log"; fail "gpu ps dp2 run"; }
  r=$(curves "$TMP/gpu.jsonl" "$TMP/gps2.jsonl" 1e-5) && pass "gpu ps dp2 = gpu single process: $r" ||
    fail "gpu ps dp2: $r"
  # tensor parallelism on one GPU: two ranks, each half of every block and of the vocabulary
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set parallel.tp=2 --metrics "$TMP/gtp2.jsonl" \
    > "$TMP/gtp2.log" 2>&1 || { tail -3 "$TMP/gtp2.log"; fail "gpu tp2 run"; }
  r=$(curves "$TMP/gpu.jsonl" "$TMP/gtp2.jsonl" 1e-5) && pass "gpu tp2 = gpu single process: $r" ||
    fail "gpu tp2: $r"
  # and with sequence parallelism (host-staged all-gather / reduce-scatter)
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set parallel.tp=2 --set parallel.sp=true \
    --metrics "$TMP/gsp2.jsonl" > "$TMP/gsp2.log" 2>&1 || { tail -3 "$TMP/gsp2.log"; fail "gpu tp2 sp run"; }
  r=$(curves "$TMP/gpu.jsonl" "$TMP/gsp2.jsonl" 1e-5) && pass "gpu tp2 sp = gpu single process: $r" ||
    fail "gpu tp2 sp: $r"
  # pipeline parallelism on one GPU: two stages (activations and gradients staged
  # through host buffers, the tied wte summed over both ends), alone and with dp 2
  # ZeRO 1-3 on one GPU: shards in device memory, each unit's reduce-scatter and all-gather
  # staged through the host
  for lay in "pp2:2:--set parallel.pp=2" "dp2_pp2:4:--set parallel.pp=2" \
             "pp2_tp2:4:--set parallel.pp=2 --set parallel.tp=2" "dp2_z1:2:--set parallel.zero=1" \
             "dp2_z2:2:--set parallel.zero=2" "dp2_z3:2:--set parallel.zero=3" \
             "dp2_pp2_z3:4:--set parallel.pp=2 --set parallel.zero=3"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np $np \
      "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda $args --metrics "$TMP/g$name.jsonl" > "$TMP/g$name.log" 2>&1 ||
      { tail -3 "$TMP/g$name.log"; fail "gpu $name run"; }
    r=$(curves "$TMP/gpu.jsonl" "$TMP/g$name.jsonl" 1e-5) && pass "gpu $name = gpu single process: $r" ||
      fail "gpu $name: $r"
  done
  # bf16 layouts on one GPU follow the bf16 single-process GPU run
  for lay in "dp2:2:" "tp2:2:--set parallel.tp=2" "pp2:2:--set parallel.pp=2" "z1:2:--set parallel.zero=1" \
             "z3:2:--set parallel.zero=3"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np $np \
      "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set precision=bf16 $args --metrics "$TMP/g16$name.jsonl" \
      > "$TMP/g16$name.log" 2>&1 || { tail -3 "$TMP/g16$name.log"; fail "gpu bf16 $name run"; }
    r=$(curves "$TMP/gpu16.jsonl" "$TMP/g16$name.jsonl" 1e-2 loss) && pass "gpu bf16 $name = gpu bf16 single process: $r" ||
      fail "gpu bf16 $name: $r"
  done
  # a model-parallel checkpoint from the GPU (pieces gathered from host copies) resumes in one CPU process
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 4 \
    "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set parallel.pp=2 --set parallel.tp=2 \
    --set train.stop_after=10 --save "$TMP/gmp" --metrics "$TMP/gmp.jsonl" > "$TMP/gmp.log" 2>&1 ||
    { tail -3 "$TMP/gmp.log"; fail "gpu pp2 tp2 first half"; }
  "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/gmp" --metrics "$TMP/gmp.jsonl" > /dev/null 2>&1 ||
    fail "cpu resumes a gpu pp2 tp2 checkpoint"
  r=$(curves "$TMP/cpu.jsonl" "$TMP/gmp.jsonl" 1e-4) && pass "gpu pp2 tp2 save -> cpu resume: $r" ||
    fail "gpu pp2 tp2 -> cpu: $r"
  # NCCL wants a GPU per rank: two ranks on the one GPU are refused, one line, exit 2
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set comm.backend=nccl 2>&1)
  [ $? -eq 2 ] && echo "$out" | grep -q "GPU per rank" && pass "nccl with 2 ranks on 1 GPU refused" ||
    fail "nccl 2 ranks on 1 GPU: $(echo "$out" | tail -2)"
else
  echo "note: no mpirun on this machine, dp2 on the GPU not run"
fi
# NCCL on one GPU: a world of one runs ZeRO's reduce-scatters and all-gathers through
# NCCL on its own stream (events against the compute stream): the single-process curve
for lay in "z3:--set parallel.zero=3:gpu:1e-5" "z1_bf16:--set parallel.zero=1 --set precision=bf16:gpu16:1e-2"; do
  name=${lay%%:*}; rest=${lay#*:}; args=${rest%%:*}; rest=${rest#*:}; ref=${rest%%:*}; tol=${rest#*:}
  "$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set comm.backend=nccl $args --metrics "$TMP/n$name.jsonl" \
    > "$TMP/n$name.log" 2>&1 || { tail -3 "$TMP/n$name.log"; fail "gpu nccl $name run"; }
  r=$(curves "$TMP/$ref.jsonl" "$TMP/n$name.jsonl" $tol loss) && pass "gpu nccl $name = gpu single process: $r" ||
    fail "gpu nccl $name: $r"
done

# the Llama family (RMSNorm, SwiGLU, rotary embeddings; test_llama_layouts' model: 4 heads
# over 2 key/value heads, untied head, q/k/v biases): the CPU's curve in fp32, the CPU's
# bf16 storage in bf16, and tp2 (the key/value heads split) the single GPU process's
LLAMA=(--set model.family=llama --set model.n_head=4 --set model.n_kv_head=2 --set model.n_embd=32
       --set model.intermediate_size=64 --set model.tie_embeddings=false --set model.qkv_bias=true
       --set model.rope_theta=500000 --set model.n_layer=4)
"$DTRAIN" train "${DP_RUN[@]}" "${LLAMA[@]}" --metrics "$TMP/lcpu.jsonl" > /dev/null 2>&1 || fail "cpu llama run"
"$DTRAIN" train "${DP_RUN[@]}" "${LLAMA[@]}" --set backend=cuda --metrics "$TMP/lgpu.jsonl" > "$TMP/lgpu.log" 2>&1 ||
  { tail -3 "$TMP/lgpu.log"; fail "gpu llama run"; }
r=$(curves "$TMP/lcpu.jsonl" "$TMP/lgpu.jsonl" 1e-4) && pass "gpu llama = cpu llama curve: $r" || fail "gpu llama: $r"
"$DTRAIN" train "${DP_RUN[@]}" "${LLAMA[@]}" --set precision=bf16 --metrics "$TMP/lcpu16.jsonl" > /dev/null 2>&1 ||
  fail "cpu llama bf16 run"
"$DTRAIN" train "${DP_RUN[@]}" "${LLAMA[@]}" --set backend=cuda --set precision=bf16 --metrics "$TMP/lgpu16.jsonl" \
  > "$TMP/lgpu16.log" 2>&1 || { tail -3 "$TMP/lgpu16.log"; fail "gpu llama bf16 run"; }
r=$(curves "$TMP/lcpu16.jsonl" "$TMP/lgpu16.jsonl" 0.01) && pass "gpu llama bf16 vs cpu llama bf16 storage: $r" ||
  fail "gpu llama bf16 vs cpu bf16: $r"
if command -v mpirun > /dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$DTRAIN" train "${DP_RUN[@]}" "${LLAMA[@]}" --set backend=cuda --set parallel.tp=2 --metrics "$TMP/ltp2.jsonl" \
    > "$TMP/ltp2.log" 2>&1 || { tail -3 "$TMP/ltp2.log"; fail "gpu llama tp2 run"; }
  r=$(curves "$TMP/lgpu.jsonl" "$TMP/ltp2.jsonl" 1e-5) && pass "gpu llama tp2 = gpu llama single process: $r" ||
    fail "gpu llama tp2: $r"
fi

# what the GPU backend does not run yet is refused before any work
out=$("$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set parallel.determinism=bitwise 2>&1)
[ $? -eq 2 ] && pass "gpu + bitwise mode refused: $out" || fail "gpu + bitwise: $out"
finish
