# ZeRO-Offload's one-step delayed parameter update (offload.delayed_update, docs/offload.md):
# the first delayed_update_warmup steps are exact; after them step s+1 computes with the
# weights without step s's update (the losses equal the exact run's up to warmup + 1 and
# differ from warmup + 2 on); every layout trains the same model with it (bitwise mode:
# one process, DDP, ZeRO-1/2/3 on 2 ranks, dp2 x pp2 give the same weights); a checkpoint
# step runs its update at once, so a run resumed from it lands on the uninterrupted run's
# weights; the estimate counts its host copies; what it cannot do is refused.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
NV="$BUILD/delayed-test.$$"
mkdir -p "$NV"
trap 'rm -rf "$TMP" "$NV"' EXIT
CPU=(--set offload.optimizer=cpu)
NVME=(--set offload.optimizer=nvme --set offload.nvme_path="$NV" --set offload.block_mb=0.0625)
DPU=(--set offload.delayed_update=true --set offload.delayed_update_warmup=3)
BW=(--set parallel.determinism=bitwise)

run() { dp_run "$@"; }
# losses NAME: the per-step training losses, space-separated
losses() {
  python3 -c "
import json, sys
print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"step\"' in l and '\"event\"' not in l))" \
    "$TMP/$1.jsonl"
}

# the delay itself: steps 1-4 as the exact run (1-3 exact updates, 4 computed with step 3's
# weights, its own update delayed), step 5 on without step 4's update: a different loss
exact=$(run exact 1 "${CPU[@]}")
delayed=$(run delayed 1 "${CPU[@]}" "${DPU[@]}")
read -r -a le <<<"$(losses exact)"
read -r -a ld <<<"$(losses delayed)"
same4=1; for i in 0 1 2 3; do [ "${le[$i]}" = "${ld[$i]}" ] || same4=0; done
if [ ${#ld[@]} -eq 20 ] && [ $same4 = 1 ] && [ "${le[4]}" != "${ld[4]}" ] && [ -n "$delayed" ] && [ "$delayed" != "$exact" ]; then
  pass "delayed update after 3 warmup steps: losses of steps 1-4 as the exact run's, step 5 on differs (${le[4]} exact, ${ld[4]} delayed)"
else
  fail "delayed update: losses exact '${le[*]:0:6}' delayed '${ld[*]:0:6}', digests '$exact' '$delayed': $(grep -m1 error "$TMP/delayed.out")"
fi
late=$(run late 1 "${CPU[@]}" --set offload.delayed_update=true --set offload.delayed_update_warmup=20)
[ -n "$late" ] && [ "$late" = "$exact" ] && pass "warmup as long as the run: nothing delayed, the exact run's weights" ||
  fail "warmup 20: '$late' vs '$exact'"
# close to the exact run still (one step of staleness at a small learning rate)
python3 - "$TMP/exact.jsonl" "$TMP/delayed.jsonl" <<'PY' && pass "delayed: final loss within 2% of the exact run's" || fail "delayed: final loss far from the exact run's"
import json, sys
last = [[json.loads(l)['loss'] for l in open(f) if '"step"' in l and '"event"' not in l][-1] for f in sys.argv[1:]]
print("final loss: exact %.5f, delayed %.5f" % tuple(last))
sys.exit(0 if abs(last[1] - last[0]) <= 0.02 * last[0] else 1)
PY

# every layout trains the same model with the delay (bitwise mode), the state in host memory or on NVMe
ref=$(run dpu-single 1 "${BW[@]}" "${CPU[@]}" "${DPU[@]}")
layout() {
  local label=$1 np=$2; shift 2
  local got; got=$(run "dpu-$label" "$np" "${BW[@]}" "${DPU[@]}" "$@")
  [ -n "$ref" ] && [ "$got" = "$ref" ] && pass "delayed update, $label: the single process's weights" ||
    fail "delayed update, $label: '$got' vs '$ref': $(grep -m1 error "$TMP/dpu-$label.out")"
}
layout "DDP dp2, nvme" 2 "${NVME[@]}"
layout "ZeRO-1 dp2, cpu" 2 --set parallel.zero=1 "${CPU[@]}"
layout "ZeRO-2 dp2, nvme" 2 --set parallel.zero=2 "${NVME[@]}"
layout "ZeRO-3 dp2, cpu" 2 --set parallel.zero=3 "${CPU[@]}"
if full; then
  layout "dp2 x pp2, cpu" 4 --set parallel.pp=2 "${CPU[@]}"
  layout "ZeRO-1 dp2 without overlap, nvme" 2 --set parallel.zero=1 --set parallel.overlap=false "${NVME[@]}"
fi

# tensor parallelism splits the GEMMs (not bitwise): tp2 with the delay follows the single
# process's delayed run within 1e-5
run dpu-tp2 2 --set parallel.tp=2 "${CPU[@]}" "${DPU[@]}" >/dev/null
worst=$(compare_curves "$TMP/delayed.jsonl" "$TMP/dpu-tp2.jsonl") &&
  pass "delayed update, tp2: the single process's delayed run, $worst" || fail "delayed update, tp2: $worst"

# bf16 on the emulated device: the update's weights cross back as bf16 (no bitwise mode
# there): the delay as on the CPU, the loss curve within bf16's tolerance of one process's
if full; then
  a=$(run bf16-single 1 --set precision=bf16 "${CPU[@]}" "${DPU[@]}")
  b=$(run bf16-emu-dp2 2 --set precision=bf16 --set backend=emulated --set parallel.zero=2 "${NVME[@]}" "${DPU[@]}")
  python3 - "$TMP/bf16-single.jsonl" "$TMP/bf16-emu-dp2.jsonl" <<'PY' && pass "bf16, emulated ZeRO-2 dp2 with the delay on NVMe: the single process's losses within 1e-2" || fail "bf16 delayed: losses differ"
import json, sys
r = [[json.loads(l)['loss'] for l in open(f) if '"step"' in l and '"event"' not in l] for f in sys.argv[1:]]
sys.exit(0 if len(r[0]) == len(r[1]) == 20 and all(abs(a - b) <= 1e-2 * a for a, b in zip(*r)) else 1)
PY
fi

# a checkpoint step's update runs at once: saved at step 10 and resumed (on another
# layout) lands on the uninterrupted run's weights, which also saved at step 10
straight=$(run dpu-straight 1 "${BW[@]}" "${CPU[@]}" "${DPU[@]}" --set checkpoint.every=10 --save "$TMP/ck0")
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${BW[@]}" "${NVME[@]}" "${DPU[@]}" --set parallel.zero=2 \
  --set train.stop_after=10 --save "$TMP/ck1" >"$TMP/ck1.out" 2>&1 || fail "save with the delay: $(tail -2 "$TMP/ck1.out")"
got=$(run dpu-resume 1 "${BW[@]}" "${CPU[@]}" "${DPU[@]}" --set checkpoint.every=10 --resume "$TMP/ck1")
[ -n "$straight" ] && [ "$got" = "$straight" ] &&
  pass "saved at step 10 with the delay (ZeRO-2 dp2, NVMe), resumed by one process: the uninterrupted run's weights" ||
  fail "delayed resume: '$got' vs '$straight': $(tail -2 "$TMP/dpu-resume.out")"

# a save the run did not plan (SIGUSR1, which mpirun forwards to every rank) with an update in flight: under ZeRO-1 on 2 ranks
# (each rank's weights are its slice of the full parameters) the update is applied and the
# parameters all-gathered first: the checkpoint is the one a run stopped at that step by
# train.stop_after writes (which updates that step at once), tensor for tensor
LONG=(--steps 200000 --set train.val_every=0 --set log.every=1000000 --set parallel.zero=1 "${CPU[@]}" "${DPU[@]}")
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${LONG[@]}" --save "$TMP/sig" --metrics "$TMP/sig.jsonl" \
  >"$TMP/sig.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q '"step": 6,' "$TMP/sig.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -USR1 $pid; wait $pid
step=$(python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "event" not in r][-1]["step"])' "$TMP/sig.jsonl")
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${LONG[@]}" --set train.stop_after="$step" --save "$TMP/nosig" \
  >"$TMP/nosig.out" 2>&1 || fail "stop_after $step: $(tail -2 "$TMP/nosig.out")"
python3 - "$TMP/sig/step_$(printf %08d "$step")" "$TMP/nosig/step_$(printf %08d "$step")" <<'PY' &&
import json, struct, sys
def tensors(d, f):
    b = open("%s/%s" % (d, f), "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
for f in ("model.safetensors", "optimizer.safetensors"):
    a, b = tensors(sys.argv[1], f), tensors(sys.argv[2], f)
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), f
PY
  pass "SIGUSR1 after step $step with the update in flight (ZeRO-1 dp2): the checkpoint of a run stopped there" ||
  fail "signal save with the delay: the checkpoints at step $step differ ($(tail -1 "$TMP/sig.out"))"

# the estimate counts the two host copies (gradients, weights), as the run holds them
want=$("$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.zero=2 "${CPU[@]}" "${DPU[@]}" -n 2 --json | python3 -c "
import json, sys; print('%.0f' % json.load(sys.stdin)['offload']['host'])")
run est 2 --set parallel.zero=2 "${CPU[@]}" "${DPU[@]}" >/dev/null
got=$(python3 -c "
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '\"summary\"' in l][-1]; print(s['mem'][0]['offload_host'])" "$TMP/est.jsonl")
[ -n "$want" ] && [ "$want" = "$got" ] && pass "estimate with the delay: host bytes $want, as measured" ||
  fail "estimate with the delay: '$want' estimated, '$got' measured"

# refused: one line, exit 2
bad() {
  local label=$1 pat=$2; shift 2
  timeout 60 "$DTRAIN" train "${DP_RUN[@]}" "$@" >"$TMP/bad.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/bad.out")" -eq 1 ] && grep -q "$pat" "$TMP/bad.out" &&
    pass "$label: $(grep '^dtrain: error' "$TMP/bad.out")" || fail "$label: rc $rc: $(tail -2 "$TMP/bad.out")"
}
bad "delayed update without offload" "needs offload.optimizer" --set offload.delayed_update=true
bad "delayed update with parameter offload" "offload.param" --set offload.delayed_update=true --set parallel.zero=3 \
  --set offload.optimizer=cpu --set offload.param=cpu
finish
