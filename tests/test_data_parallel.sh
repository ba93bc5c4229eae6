# Data parallelism reproduces the single-process loss curve: dp in {2, 4} x
# {ps, DDP, ZeRO-1, ZeRO-2, ZeRO-3}, same global batch, 20 steps, per-step loss and
# grad norm within 1e-5 relative of the single-process run (parallel.determinism=fast);
# plus the memory each rank reports against the ZeRO formulas, and bad layouts.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "single-process run"
compare() { compare_curves "$TMP/ref.jsonl" "$2"; }
for np in $(full && echo 2 4 || echo 4); do
  # (ddp and zero1 start gradient collectives during backward; *_after: all after it;
  # zero1 reduce-scatters in place: auto picks shm on the node-shared gradients, and the
  # ring and MPI forms, non-blocking and blocking, each take their own in-place path)
  for mode in "ps:--set parallel.dp_mode=ps" "ddp:" "zero1:--set parallel.zero=1" "zero2:--set parallel.zero=2" \
              "zero3:--set parallel.zero=3" "ddp_after:--set parallel.overlap=false" \
              "zero1_after:--set parallel.zero=1 --set parallel.overlap=false" \
              "zero1_ring:--set parallel.zero=1 --set comm.reduce_scatter=ring" \
              "zero1_mpi:--set parallel.zero=1 --set comm.reduce_scatter=mpi" \
              "zero1_mpi_after:--set parallel.zero=1 --set comm.reduce_scatter=mpi --set parallel.overlap=false"; do
    name=${mode%%:*}; args=${mode#*:}
    case $name in *_ring|*_mpi|*_mpi_after) full || continue ;; esac
    if "${MPI[@]}" -np $np "$DTRAIN" train "${DP_RUN[@]}" $args --metrics "$TMP/$name$np.jsonl" >"$TMP/$name$np.out" 2>&1; then
      r=$(compare "$name" "$TMP/$name$np.jsonl") && pass "dp=$np $name matches single process ($r)" \
        || fail "dp=$np $name: $r"
    else
      fail "dp=$np $name run: $(tail -3 "$TMP/$name$np.out")"
    fi
  done
done
# bitwise mode: the weights after 20 steps are identical for every dp size and mode
BW=("${DP_RUN[@]}" --set parallel.determinism=bitwise --digest)
"$DTRAIN" train "${BW[@]}" >"$TMP/bw1.out" 2>&1 || fail "bitwise single process"
ref=$(digest_of "$TMP/bw1.out"); echo "single process: $ref"
[ -n "$ref" ] || fail "no digest"
for np in $(full && echo 1 2 4 || echo 4); do
  for mode in "ps:--set parallel.dp_mode=ps" "ddp:" "zero1:--set parallel.zero=1" "zero2:--set parallel.zero=2" \
              "zero3:--set parallel.zero=3"; do
    name=${mode%%:*}; args=${mode#*:}
    "${MPI[@]}" -np $np "$DTRAIN" train "${BW[@]}" $args >"$TMP/bw.out" 2>&1
    [ "$(digest_of "$TMP/bw.out")" = "$ref" ] && pass "bitwise dp=$np $name: same digest" \
      || fail "bitwise dp=$np $name: $(digest_of "$TMP/bw.out") $(tail -2 "$TMP/bw.out")"
  done
done
# checkpoints hold full tensors: save at step 10 under one layout, resume under another,
# and (bitwise mode) land on the straight 20-step weights
"${MPI[@]}" -np 2 "$DTRAIN" train "${BW[@]}" --set parallel.zero=3 --set train.stop_after=10 --save "$TMP/ck" \
  >"$TMP/ck1.out" 2>&1 || fail "save under dp=2 zero3: $(tail -2 "$TMP/ck1.out")"
"${MPI[@]}" -np 4 "$DTRAIN" train "${BW[@]}" --set parallel.zero=1 --resume "$TMP/ck" >"$TMP/ck2.out" 2>&1
[ "$(digest_of "$TMP/ck2.out")" = "$ref" ] && pass "save dp=2 ZeRO-3, resume dp=4 ZeRO-1: same weights as straight" \
  || fail "cross-layout resume: $(digest_of "$TMP/ck2.out") $(tail -2 "$TMP/ck2.out")"
"$DTRAIN" train "${BW[@]}" --resume "$TMP/ck" >"$TMP/ck3.out" 2>&1
[ "$(digest_of "$TMP/ck3.out")" = "$ref" ] && pass "save dp=2 ZeRO-3, resume single process: same weights" \
  || fail "resume single: $(tail -2 "$TMP/ck3.out")"
# measured state bytes per rank vs `dtrain estimate` (within 2%; the whole allocation,
# exactly), and the estimate vs the fp32 formulas: ZeRO-1 holds the full gradients only
# (reduce-scattered in place, no shard)
MEM=(--set model.n_embd=64 --set train.micro_batch=2 --set train.global_batch=8 --steps 2 --threads 1)
for np in 2 4; do
  "$DTRAIN" estimate "${TINY[@]}" "${MEM[@]}" -n $np --json >"$TMP/est$np.json" || fail "estimate -n $np"
  for z in 0 1 2 3 ps; do
    args="--set parallel.zero=$z"; [ $z = ps ] && args="--set parallel.dp_mode=ps"
    "${MPI[@]}" -np $np "$DTRAIN" train "${TINY[@]}" "${MEM[@]}" $args --metrics "$TMP/mem$np$z.jsonl" \
      >"$TMP/mem.out" 2>&1 || { fail "memory run np=$np zero=$z: $(tail -2 "$TMP/mem.out")"; continue; }
    "$DTRAIN" estimate "${TINY[@]}" "${MEM[@]}" $args -n $np --json >"$TMP/estz.json" || fail "estimate $args -n $np"
    r=$(python3 - "$TMP/est$np.json" "$TMP/mem$np$z.jsonl" $z "$TMP/estz.json" <<'PY'
import json, sys
est = json.load(open(sys.argv[1])); z = sys.argv[3]
# everything a rank allocates (state, activations, workspace: ZeRO's padding, scratch and
# gathered units) is what the estimator (and so `dtrain plan`) predicts, to the byte
rank_bytes = json.load(open(sys.argv[4]))["stages"][0]["rank_bytes"]
summ = [json.loads(l) for l in open(sys.argv[2]) if '"summary"' in l][-1]
psi, n = est["psi"], est["n"]
formula = [16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n]
for zz, f in enumerate(formula):
    if abs(est["fp32"][zz]["total"] - f) > 1 + 1e-9 * f:
        print("estimate zero %d: %.0f, formula %.0f" % (zz, est["fp32"][zz]["total"], f)); sys.exit(1)
worst = 0.0
for m in summ["mem"]:
    if z == "1" and abs(m["grads"] - 4 * psi) > 0.02 * 4 * psi:
        print("rank %d holds %d bytes of gradients, want the full buffer only (4psi = %.0f)" % (m["rank"], m["grads"], 4 * psi))
        sys.exit(1)
    got = m["params"] + m["grads"] + m["optim"]
    if z == "ps":
        want = 16 * psi if m["rank"] == 0 else 8 * psi
    else:
        want = est["fp32"][int(z)]["total"]
    worst = max(worst, abs(got - want) / want)
    total = got + m["activations"] + m["workspace"]
    if z != "ps" and total != rank_bytes:
        print("rank %d allocates %d bytes, the estimate says %d" % (m["rank"], total, rank_bytes)); sys.exit(1)
print("worst %.2f%% over %d ranks; allocation = estimate" % (100 * worst, len(summ["mem"])))
sys.exit(0 if worst <= 0.02 and len(summ["mem"]) == int(est["n"]) else 1)
PY
) && pass "np=$np zero=$z memory matches estimate ($r)" || fail "np=$np zero=$z memory: $r"
  done
done
# the same to the byte with bitwise mode's fold buffers, and per pipeline stage
# (`estimate -n` is the data-parallel size; a stage's ranks are world rank mod pp)
for lay in "bitwise_z0:2:1:--set parallel.determinism=bitwise" \
           "bitwise_z2:2:1:--set parallel.determinism=bitwise --set parallel.zero=2" \
           "bitwise_pp2_z1:4:2:--set parallel.determinism=bitwise --set parallel.pp=2 --set parallel.zero=1" \
           "pp2_z3:4:2:--set parallel.pp=2 --set parallel.zero=3"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; rest=${rest#*:}; pp=${rest%%:*}; args=${rest#*:}
  case $name in bitwise_z2) ;; *) full || continue ;; esac
  "${MPI[@]}" -np $np "$DTRAIN" train "${TINY[@]}" "${MEM[@]}" $args --metrics "$TMP/m_$name.jsonl" >"$TMP/mem.out" 2>&1 ||
    { fail "memory run $name: $(tail -2 "$TMP/mem.out")"; continue; }
  "$DTRAIN" estimate "${TINY[@]}" "${MEM[@]}" $args -n $((np / pp)) --json >"$TMP/e_$name.json" || fail "estimate $name"
  r=$(python3 - "$TMP/m_$name.jsonl" "$TMP/e_$name.json" $pp <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
stages, pp = json.load(open(sys.argv[2]))["stages"], int(sys.argv[3])
for m in summ["mem"]:
    total = m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"]
    want = stages[m["rank"] % pp]["rank_bytes"]
    if total != want:
        print("rank %d allocates %d bytes (workspace %d), the estimate says %d" % (m["rank"], total, m["workspace"], want))
        sys.exit(1)
print("%d ranks, workspace %d bytes on rank 0" % (len(summ["mem"]), summ["mem"][0]["workspace"]))
PY
) && pass "$name: allocation = estimate ($r)" || fail "$name memory: $r"
done
# bad layouts fail on every rank with exit 2 and one line, without hanging
bad() { # NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  timeout 120 "${MPI[@]}" -np 2 "$DTRAIN" train "${TINY[@]}" --steps 2 "$@" >"$TMP/bad.out" 2>"$TMP/bad.err"; local rc=$?
  local lines; lines=$(grep -c "dtrain: error" "$TMP/bad.err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qE "$pat" "$TMP/bad.err"; then pass "$name: $(grep 'dtrain: error' "$TMP/bad.err")"
  else fail "$name: exit $rc, $lines error lines: $(head -c 400 "$TMP/bad.err")"; fi
}
bad "world not divisible by tp" "not divisible" --set parallel.tp=3
bad "micro_batch x dp does not divide global_batch" "does not divide" --set train.micro_batch=4 --set train.global_batch=12
bad "unknown algorithm" "comm.allreduce" --set comm.allreduce=butterfly
bad "bitwise with a non-power-of-two accumulation" "power-of-two" --set parallel.determinism=bitwise \
  --set train.micro_batch=1 --set train.global_batch=6
bad "data file missing on every rank" "nope.bin" --set data.train="$TMP/nope.bin"
finish
