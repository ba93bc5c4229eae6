# precision: bf16 on the CPU (bf16 storage of activations, parameters and gradients,
# fp32 master weights, moments and arithmetic): the loss curve tracks fp32 within 2%,
# a bf16 run resumes bitwise (the checkpoint holds the fp32 master weights), the
# estimator counts bf16 state, DDP and pipelines with bf16 follow the bf16 single-process
# run, ZeRO 1-3 with bf16 hold the seed's 16 bytes per parameter as its formulas shard
# them, and bitwise mode gives the bf16 single process's weights for every data-parallel
# mode and pipeline (its leaves are the bf16 gradients widened, its root rounded back).
source "$(dirname "$0")/lib.sh"
prepare_tiny
curves_loss() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
load = lambda p: {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "event" not in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print("max rel loss diff %.2e over %d steps" % (worst, len(a)))
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
PY
}
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/f32.jsonl" > "$TMP/f32.log" 2>&1 || fail "fp32 run"
"$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --set log.digest=true --metrics "$TMP/b16.jsonl" --save "$TMP/s" \
  > "$TMP/b16.log" 2>&1 || { cat "$TMP/b16.log"; fail "bf16 run"; }
r=$(curves_loss "$TMP/f32.jsonl" "$TMP/b16.jsonl" 0.02) && pass "bf16 loss vs fp32: $r" || fail "bf16 vs fp32: $r"
r=$(curves_loss "$TMP/f32.jsonl" "$TMP/b16.jsonl" 1e-7) && fail "bf16 equals fp32 exactly: not bf16 ($r)" ||
  pass "bf16 differs from fp32 (it is rounding)"
"$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --set train.stop_after=10 --save "$TMP/h" > /dev/null 2>&1 &&
  "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/h" --set log.digest=true > "$TMP/h.log" 2>&1 || fail "bf16 halves"
[ -n "$(digest_of "$TMP/b16.log")" ] && [ "$(digest_of "$TMP/b16.log")" = "$(digest_of "$TMP/h.log")" ] &&
  pass "bf16 resume is bitwise the straight run" || fail "bf16 resume: $(digest_of "$TMP/b16.log") vs $(digest_of "$TMP/h.log")"
grep -q "precision bf16\|bf16" "$TMP/h.log" && pass "resume keeps precision bf16" || fail "resume lost precision"
e=$("$DTRAIN" estimate --config "$SRC/tests/data/tiny.json" --set precision=bf16 2>&1)
echo "$e" | grep -q "bf16" && pass "estimate reports bf16 activations" || fail "estimate: $e"

# bf16 layouts train the bf16 single-process model: DDP (gradients widened to fp32, reduced,
# rounded back), pipelines (bf16 activations sent as they are, the tied wte summed over
# the end stages) and tensor parallelism (bf16 partial sums reduced as bf16, the
# vocabulary-parallel cross-entropy's statistics in fp32). Rounding happens at other points than in one process (per rank's
# accumulation, the stages' partial sums), so within 0.1% of its losses, not bit for bit
# (measured: at most 9e-5; bf16 against fp32 is 2e-4).
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
  for lay in "dp2:2:" "pp2:2:--set parallel.pp=2" "dp2_pp2:4:--set parallel.pp=2" "tp2:2:--set parallel.tp=2" \
             "tp2_sp:2:--set parallel.tp=2 --set parallel.sp=true" "pp2_tp2:4:--set parallel.pp=2 --set parallel.tp=2" \
             "z1:2:--set parallel.zero=1" "z2:2:--set parallel.zero=2" "z3:2:--set parallel.zero=3" \
             "pp2_z3:4:--set parallel.pp=2 --set parallel.zero=3" "tp2_z1:4:--set parallel.tp=2 --set parallel.zero=1" \
             "pp2_zbh1:2:--set parallel.pp=2 --set parallel.schedule=zb-h1"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    # (pp2_zbh1: the weight gradients computed apart from the input gradients, without the weights)
    case $name in dp2|dp2_pp2|pp2_tp2|z1|pp2_zbh1) ;; *) full || continue ;; esac
    "${MPI[@]}" -np $np "$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 $args --metrics "$TMP/$name.jsonl" \
      > "$TMP/$name.log" 2>&1 || fail "bf16 $name run: $(grep -v '^\[' "$TMP/$name.log" | tail -2)"
    r=$(curves_loss "$TMP/b16.jsonl" "$TMP/$name.jsonl" 1e-3) && pass "bf16 $name = bf16 single process: $r" ||
      fail "bf16 $name: $r"
  done
  # DDP's fp32 copy of the bf16 gradients is reported
  python3 - "$TMP/dp2_pp2.jsonl" <<'PY' && pass "bf16 DDP reports its fp32 gradient copy as workspace" ||
import json, sys
m = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "summary"][0]["mem"][0]
print(m)
sys.exit(0 if m["workspace"] == 2 * m["grads"] > 0 else 1)   # an fp32 copy of the bf16 gradients
PY
    fail "bf16 dp2 pp2 memory report"
  # ZeRO-1 reduces the same fp32 sums as DDP (per unit instead of per bucket) and rounds
  # them alike: the same weights bit for bit
  r=$(curves_loss "$TMP/dp2.jsonl" "$TMP/z1.jsonl" 0) && pass "bf16 ZeRO-1 = bf16 DDP exactly: $r" ||
    fail "bf16 ZeRO-1 vs DDP: $r"
  # ZeRO with bf16: what each rank allocates is the estimate to the byte, and its state
  # the seed's 16psi, 4psi + 12psi/N, 2psi + 14psi/N, 16psi/N (within 2%: padding)
  MEM=(--set model.n_embd=64 --set train.micro_batch=2 --set train.global_batch=8 --steps 2 --set precision=bf16)
  for z in 1 2 3; do
    [ $z = 3 ] || full || continue
    "${MPI[@]}" -np 2 "$DTRAIN" train "${TINY[@]}" "${MEM[@]}" --set parallel.zero=$z --metrics "$TMP/mz$z.jsonl" \
      > "$TMP/mz.log" 2>&1 || { fail "bf16 zero $z memory run: $(tail -2 "$TMP/mz.log")"; continue; }
    "$DTRAIN" estimate "${TINY[@]}" "${MEM[@]}" --set parallel.zero=$z -n 2 --json > "$TMP/ez$z.json" ||
      fail "estimate bf16 zero $z"
    r=$(python3 - "$TMP/mz$z.jsonl" "$TMP/ez$z.json" $z <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
est, z = json.load(open(sys.argv[2])), int(sys.argv[3])
psi, n = est["psi"], est["n"]
formula = [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][z]
for m in summ["mem"]:
    state = m["params"] + m["grads"] + m["optim"]
    total = state + m["activations"] + m["workspace"]
    if total != est["stages"][0]["rank_bytes"]:
        print("rank %d allocates %d, the estimate says %d" % (m["rank"], total, est["stages"][0]["rank_bytes"])); sys.exit(1)
    if abs(state - formula) > 0.02 * formula:
        print("rank %d state %d, the formula %.0f" % (m["rank"], state, formula)); sys.exit(1)
print("state %d bytes (formula %.0f), allocation = estimate" % (state, formula))
PY
) && pass "bf16 zero $z memory: $r" || fail "bf16 zero $z memory: $r"
  done
  # a bf16 pipeline's checkpoint holds the fp32 master weights: resumed on the pipeline it
  # lands on the straight run's weights bit for bit, and it resumes in one process
  PP=(--set precision=bf16 --set parallel.pp=2 --set log.digest=true)
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${PP[@]}" > "$TMP/pstraight.log" 2>&1 || fail "bf16 pp2 straight run"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${PP[@]}" --set train.stop_after=10 --save "$TMP/ph" > /dev/null 2>&1 &&
    "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${PP[@]}" --resume "$TMP/ph" > "$TMP/ph.log" 2>&1 ||
    fail "bf16 pp2 halves: $(tail -2 "$TMP/ph.log")"
  [ -n "$(digest_of "$TMP/pstraight.log")" ] && [ "$(digest_of "$TMP/pstraight.log")" = "$(digest_of "$TMP/ph.log")" ] &&
    pass "bf16 pp2 resume is bitwise the straight pp2 run" ||
    fail "bf16 pp2 resume: $(digest_of "$TMP/pstraight.log") vs $(digest_of "$TMP/ph.log")"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --set parallel.pp=2 --set train.stop_after=10 \
    --save "$TMP/p10" --metrics "$TMP/p10.jsonl" > "$TMP/p10.log" 2>&1 || fail "bf16 pp2 first half: $(tail -2 "$TMP/p10.log")"
  "$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --resume "$TMP/p10" --metrics "$TMP/p10.jsonl" > "$TMP/p10r.log" 2>&1 ||
    fail "bf16 single resumes a pp2 checkpoint: $(tail -2 "$TMP/p10r.log")"
  r=$(curves_loss "$TMP/b16.jsonl" "$TMP/p10.jsonl" 1e-3) && pass "bf16 pp2 save + single resume: $r" ||
    fail "bf16 pp2 -> single: $r"
  # the central rank: fp32 reduction to rank 0, its bf16 parameters broadcast
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --set parallel.dp_mode=ps \
    --metrics "$TMP/ps.jsonl" > "$TMP/ps.log" 2>&1 || fail "bf16 ps run: $(grep -v '^\[' "$TMP/ps.log" | tail -2)"
  r=$(curves_loss "$TMP/b16.jsonl" "$TMP/ps.jsonl" 1e-3) && pass "bf16 ps dp2 = bf16 single process: $r" ||
    fail "bf16 ps dp2: $r"
  # bitwise mode in bf16: each micro-batch's bf16 gradients widened into a leaf, the fixed
  # tree in fp32, the root rounded to bf16 where the mode keeps its gradients and the norm
  # read from that: the bf16 single process's weights bit for bit, for any dp size, mode
  # and pipeline, any thread count, and each rank allocates the estimate to the byte
  BWB=("${DP_RUN[@]}" --set precision=bf16 --set parallel.determinism=bitwise --digest)
  "$DTRAIN" train "${BWB[@]}" > "$TMP/bwb1.log" 2>&1 || fail "bf16 bitwise single: $(tail -2 "$TMP/bwb1.log")"
  ref=$(digest_of "$TMP/bwb1.log")
  [ -n "$ref" ] && [ "$ref" != "$(digest_of "$TMP/b16.log")" ] && pass "bf16 bitwise single process: $ref" ||
    fail "bf16 bitwise single process: no digest, or fast mode's ($ref)"
  for lay in "ddp:2:" "z1:4:--set parallel.zero=1" "z2:2:--set parallel.zero=2" "z3:4:--set parallel.zero=3" \
             "ps:2:--set parallel.dp_mode=ps" "pp2:2:--set parallel.pp=2" "dp2_pp2_z1:4:--set parallel.pp=2 --set parallel.zero=1" \
             "pp2_zbh1:2:--set parallel.pp=2 --set parallel.schedule=zb-h1" \
             "hsdp_z3:4:--set parallel.zero=3 --set parallel.dp_shard=2" "threads2:1:--threads 2"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    case $name in ddp|z3) ;; *) full || continue ;; esac
    cmd=("$DTRAIN" train "${BWB[@]}" $args)
    [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
    OMP_NUM_THREADS=$([ $name = threads2 ] && echo 2 || echo 1) "${cmd[@]}" > "$TMP/bwb.log" 2>&1
    [ "$(digest_of "$TMP/bwb.log")" = "$ref" ] && pass "bf16 bitwise $name: the single process's digest" ||
      fail "bf16 bitwise $name: $(digest_of "$TMP/bwb.log") $(grep -m1 error "$TMP/bwb.log")"
  done
  for z in 0 2; do
    [ $z = 2 ] || full || continue
    "${MPI[@]}" -np 2 "$DTRAIN" train "${TINY[@]}" "${MEM[@]}" --set parallel.zero=$z --set parallel.determinism=bitwise \
      --metrics "$TMP/bwm$z.jsonl" > "$TMP/bwm.log" 2>&1 || { fail "bf16 bitwise zero $z memory run"; continue; }
    "$DTRAIN" estimate "${TINY[@]}" "${MEM[@]}" --set parallel.zero=$z --set parallel.determinism=bitwise -n 2 --json \
      > "$TMP/bwe$z.json" || fail "estimate bf16 bitwise zero $z"
    r=$(python3 - "$TMP/bwm$z.jsonl" "$TMP/bwe$z.json" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
want = json.load(open(sys.argv[2]))["stages"][0]["rank_bytes"]
got = [m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"] for m in summ["mem"]]
print("allocated %s, estimate %d" % (got, want))
sys.exit(0 if all(g == want for g in got) else 1)
PY
) && pass "bf16 bitwise zero $z: $r" || fail "bf16 bitwise zero $z memory: $r"
  done
fi
out=$("$DTRAIN" train "${DP_RUN[@]}" --set backend=cuda --set parallel.determinism=bitwise 2>&1)
[ $? -eq 2 ] && [ "$(echo "$out" | grep -c '^dtrain: error')" = 1 ] && echo "$out" | grep -q "CPU and emulated backends" &&
  pass "bitwise mode on a GPU refused: $out" || fail "bitwise on a GPU: $out"
finish
