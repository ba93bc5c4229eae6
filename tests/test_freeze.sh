# Frozen parameter groups (train.freeze, the VLM notes' frozen encoder): the tensors the
# globs name keep their initial bytes, every other one trains; the grad norm covers the
# trainable ones only; every layout (ZeRO-3, tp + sp, pp with 1f1b and zb-h1, cp, dp x pp
# with ZeRO-2, bitwise mode) trains the same model; a glob that matches nothing is exit 2.
source "$(dirname "$0")/lib.sh"
prepare_tiny
FZ=wte.weight,wpe.weight,h.0.*
RUN=("${TINY[@]}" --steps 5 --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8
     --set model.n_layer=3 --set train.val_every=5 --set log.sample_tokens=0 --set "train.freeze=$FZ")
"$DTRAIN" train "${RUN[@]}" --steps 0 --save "$TMP/s0" >/dev/null 2>&1 || fail "initial save"
"$DTRAIN" train "${RUN[@]}" --save "$TMP/s1" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "frozen run"
r=$(python3 "$SRC/tests/frozen_check.py" "$TMP/s0/step_00000000/model.safetensors" "$TMP/s1/step_00000005/model.safetensors" "$FZ") &&
  pass "train.freeze $FZ: $r" || fail "frozen tensors: $r"
grep -q "frozen (train.freeze $FZ)" "$TMP/ref.out" && pass "the header names the frozen groups" || fail "header: $(head -5 "$TMP/ref.out")"
# the norm is over the trainable gradients only: smaller than the whole model's
"$DTRAIN" train "${RUN[@]}" --set train.freeze= --metrics "$TMP/all.jsonl" >/dev/null 2>&1 || fail "unfrozen run"
python3 - "$TMP/ref.jsonl" "$TMP/all.jsonl" <<'PY' && pass "step 1's grad norm: trainable tensors only" || fail "grad norm"
import json, sys
f, a = ([r for r in map(json.loads, open(p)) if r.get("step") == 1 and "event" not in r][0] for p in sys.argv[1:3])
assert 0 < f["grad_norm"] < a["grad_norm"] and f["loss"] == a["loss"], (f, a)
PY
out=$("$DTRAIN" train "${RUN[@]}" --set train.freeze=wte.weight,h.9.* 2>&1)
[ $? -eq 2 ] && [ "$(echo "$out" | grep -c '^dtrain: error')" -eq 1 ] && echo "$out" | grep -q "'h.9.\*' matches no tensor" &&
  pass "a glob matching nothing: $(echo "$out" | grep error)" || fail "bad glob: $out"
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
  curve() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "event" not in r] for p in sys.argv[1:3])
assert len(a) == len(b) == 5
w = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
print("max rel diff %.1e" % w)
sys.exit(0 if w <= 1e-5 else 1)
PY
  }
  for lay in "zero3:2:--set parallel.zero=3" "tp2_sp:2:--set parallel.tp=2 --set parallel.sp=true" \
             "pp2:2:--set parallel.pp=2" "pp2_zbh1:2:--set parallel.pp=2 --set parallel.schedule=zb-h1" \
             "cp2:2:--set parallel.cp=2" "dp2_pp2_zero2:4:--set parallel.pp=2 --set parallel.zero=2"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    case $name in pp2|tp2_sp) ;; *) full || continue ;; esac
    "${MPI[@]}" -np $np "$DTRAIN" train "${RUN[@]}" $args --save "$TMP/$name" --metrics "$TMP/$name.jsonl" \
      >"$TMP/$name.out" 2>&1 || fail "$name run: $(grep error "$TMP/$name.out")"
    r=$(curve "$TMP/ref.jsonl" "$TMP/$name.jsonl") && r2=$(python3 "$SRC/tests/frozen_check.py" \
      "$TMP/s0/step_00000000/model.safetensors" "$TMP/$name/step_00000005" "$FZ") &&
      pass "$name with frozen groups: the single-process curve ($r), $r2" || fail "$name: $r $r2"
  done
  # bitwise mode: the layouts' weights are the single process's, bit for bit
  "$DTRAIN" train "${RUN[@]}" --set parallel.determinism=bitwise --digest >"$TMP/bw1.out" 2>&1 || fail "bitwise single"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set parallel.determinism=bitwise --set parallel.zero=2 --digest \
    >"$TMP/bw2.out" 2>&1 || fail "bitwise dp2"
  [ -n "$(digest_of "$TMP/bw1.out")" ] && [ "$(digest_of "$TMP/bw2.out")" = "$(digest_of "$TMP/bw1.out")" ] &&
    pass "bitwise mode, dp 2 ZeRO-2 with frozen groups: the single process's weights" ||
    fail "bitwise frozen: $(digest_of "$TMP/bw2.out") vs $(digest_of "$TMP/bw1.out")"
fi
finish
