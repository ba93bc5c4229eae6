# Frozen parameter groups (train.freeze, the VLM notes' frozen encoder): the tensors the
# globs name keep their initial bytes, every other one trains; the grad norm covers the
# trainable ones only; every layout (ZeRO-3, tp + sp, pp with 1f1b and zb-h1, cp, dp x pp
# with ZeRO-2, bitwise mode) trains the same model; a glob that matches nothing is exit 2.
# Half the blocks frozen (issue 30): the curve of the single process in every layout (dp2
# DDP and ZeRO-1/2/3 bit for bit in bitwise mode, tp2, pp2, HSDP dp4 over shard groups of
# 2 within 1e-5), the moments and the gradient bytes reduced fall by the frozen share, the
# weight-gradient GEMMs of the frozen blocks are skipped, and `dtrain estimate` is the
# allocation to the byte; a checkpoint saved with one freeze set resumes with another.
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
  # ---- half the blocks frozen (4 blocks, the embeddings and blocks 0-1) ----
  HF=wte.weight,wpe.weight,h.0.*,h.1.*
  HALF=("${TINY[@]}" --steps 3 --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8
        --set model.n_layer=4 --set model.n_embd=64 --set train.val_every=0 --set log.sample_tokens=0)
  "$DTRAIN" train "${HALF[@]}" --set "train.freeze=$HF" --metrics "$TMP/h1.jsonl" --digest >"$TMP/h1.out" 2>&1 ||
    fail "half frozen, single: $(tail -2 "$TMP/h1.out")"
  "$DTRAIN" train "${HALF[@]}" --set "train.freeze=$HF" --set parallel.determinism=bitwise --digest >"$TMP/hb1.out" 2>&1 ||
    fail "half frozen, single bitwise"
  for z in 0 1 2 3; do
    "${MPI[@]}" -np 2 "$DTRAIN" train "${HALF[@]}" --set "train.freeze=$HF" --set parallel.zero=$z \
      --set parallel.determinism=bitwise --digest >"$TMP/hb$z.out" 2>&1 || fail "bitwise zero $z: $(tail -2 "$TMP/hb$z.out")"
    [ -n "$(digest_of "$TMP/hb1.out")" ] && [ "$(digest_of "$TMP/hb$z.out")" = "$(digest_of "$TMP/hb1.out")" ] &&
      pass "half frozen, dp2 ZeRO-$z bitwise: the single process's weights" || fail "half frozen zero $z: $(digest_of "$TMP/hb$z.out")"
  done
  for lay in "tp2:2:--set parallel.tp=2" "pp2:2:--set parallel.pp=2" \
             "hsdp:4:--set parallel.zero=3 --set parallel.dp_shard=2" "ddp:2:" "zero2:2:--set parallel.zero=2"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    "${MPI[@]}" -np $np "$DTRAIN" train "${HALF[@]}" --set "train.freeze=$HF" $args --metrics "$TMP/h_$name.jsonl" \
      >"$TMP/h_$name.out" 2>&1 || { fail "half frozen $name: $(tail -2 "$TMP/h_$name.out")"; continue; }
    r=$(python3 - "$TMP/h1.jsonl" "$TMP/h_$name.jsonl" <<'PY'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "event" not in r] for p in sys.argv[1:3])
w = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
print("max rel diff %.1e" % w)
sys.exit(0 if len(a) == len(b) == 3 and w <= 1e-5 else 1)
PY
) && pass "half frozen, $name: the single-process curve ($r)" || fail "half frozen $name: $r"
  done
  # moments and reduced gradient bytes fall by the frozen share; the frozen blocks' GEMMs skipped
  for name in ddp zero2; do
    args=; [ $name = zero2 ] && args="--set parallel.zero=2"
    "${MPI[@]}" -np 2 "$DTRAIN" train "${HALF[@]}" $args --metrics "$TMP/a_$name.jsonl" >"$TMP/a_$name.out" 2>&1 ||
      fail "unfrozen $name"
    r=$(python3 - "$TMP/a_$name.jsonl" "$TMP/h_$name.jsonl" "$TMP/h_$name.out" $name <<'PY'
import json, re, sys
def load(p):
    L = [json.loads(l) for l in open(p)]
    return [r for r in L if "event" not in r][-1], [r for r in L if r.get("event") == "summary"][-1]["mem"]
(sa, ma), (sf, mf) = load(sys.argv[1]), load(sys.argv[2])
frozen, total = map(int, re.search(r"frozen \(train.freeze [^)]*\): (\d+) of rank 0's (\d+)", open(sys.argv[3]).read()).groups())
share = (total - frozen) / total
mom = [f["optim"] / a["optim"] for a, f in zip(ma, mf)]
com = sf["grad_comm_bytes"] / sa["grad_comm_bytes"]
# micro-steps x (2 frozen blocks x 4 weight matrices + the tied head's wte)
ok = sf["dw_gemms_skipped"] == 2 * (2 * 4 + 1) and sa["dw_gemms_skipped"] == 0
if sys.argv[4] == "ddp":  # exact: the flat layout's trainable tensors
    ok = ok and all(f["optim"] == 8 * (total - frozen) for f in mf) and sf["grad_comm_bytes"] == 4 * (total - frozen)
ok = ok and all(abs(x - share) < 0.03 for x in mom) and abs(com - share) < 0.03
print("trainable share %.3f: moments x%s, gradient bytes x%.3f (%d of %d), %d GEMMs skipped" %
      (share, ",".join("%.3f" % x for x in mom), com, sf["grad_comm_bytes"], sa["grad_comm_bytes"], sf["dw_gemms_skipped"]))
sys.exit(0 if ok else 1)
PY
) && pass "half frozen, $name: $r" || fail "half frozen traffic $name: $r"
  done
  # the estimate is the allocation, to the byte, with the frozen moments gone
  MEMF=("${HALF[@]}" --steps 1 --set "train.freeze=$HF")
  for lay in "z0:2:" "z1:2:--set parallel.zero=1" "z2:2:--set parallel.zero=2" "z3:2:--set parallel.zero=3" \
             "bf16_offload:1:--set precision=bf16 --set offload.optimizer=cpu" \
             "z3_offload:2:--set parallel.zero=3 --set offload.optimizer=cpu --set offload.param=cpu"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    "${MPI[@]}" -np $np "$DTRAIN" train "${MEMF[@]}" $args --metrics "$TMP/e_$name.jsonl" >"$TMP/e_$name.out" 2>&1 ||
      { fail "estimate run $name: $(tail -2 "$TMP/e_$name.out")"; continue; }
    "$DTRAIN" estimate "${MEMF[@]}" $args -n $np --json >"$TMP/e_$name.json" || fail "estimate $name"
    r=$(python3 - "$TMP/e_$name.jsonl" "$TMP/e_$name.json" <<'PY'
import json, sys
mem = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]["mem"]
st = json.load(open(sys.argv[2]))["stages"][0]
got = [m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"] for m in mem]
host = [m["offload_host"] for m in mem]
ok = all(g == st["rank_bytes"] for g in got) and all(h == st.get("host_bytes", 0) for h in host)
print("%d bytes (host %d) on every rank" % (st["rank_bytes"], st.get("host_bytes", 0)) if ok else "allocated %s host %s, estimated %s" % (got, host, st))
sys.exit(0 if ok else 1)
PY
) && pass "half frozen, $name: allocation = estimate ($r)" || fail "half frozen estimate $name: $r"
  done
  # a checkpoint saved with one freeze set resumes with another (docs/checkpoints.md): the
  # moments of a tensor frozen at the save are zeros, a tensor frozen now ignores its own
  "${MPI[@]}" -np 2 "$DTRAIN" train "${HALF[@]}" --set "train.freeze=$HF" --set parallel.zero=2 --set train.stop_after=2 \
    --save "$TMP/ck" >"$TMP/ck1.out" 2>&1 || fail "save with half frozen: $(tail -2 "$TMP/ck1.out")"
  "$DTRAIN" train "${HALF[@]}" --set train.freeze=h.3.* --resume "$TMP/ck" >"$TMP/ck2.out" 2>&1 &&
    grep -q "resumed at step 2" "$TMP/ck2.out" && pass "saved with $HF frozen, resumed with h.3.* frozen" ||
    fail "resume with another freeze set: $(tail -2 "$TMP/ck2.out")"
fi
finish
