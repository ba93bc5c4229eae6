# Preemption: SIGTERM, SIGINT or SIGUSR1 finishes the current step, saves (if a save directory
# is set), says so and exits 128 + signal; a second signal exits at once; under mpirun
# every rank takes part. The saved step resumes to the weights of an uninterrupted run.
source "$(dirname "$0")/lib.sh"
prepare_tiny
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
LONG=("${TINY[@]}" --steps 200000 --threads 1 --set train.val_every=0)
# wait_for_step FILE N: until the metrics file holds step N (the run is training)
wait_for_step() {
  for _ in $(seq 1 600); do
    grep -q "\"step\": $2," "$1" 2>/dev/null && return 0; sleep 0.1
  done
  return 1
}
# interrupted SIG: one run stopped by SIG after it trained a few steps
for sig in TERM USR1 INT; do
  rm -rf "$TMP/ck" "$TMP/m.jsonl"
  "$DTRAIN" train "${LONG[@]}" --save "$TMP/ck" --metrics "$TMP/m.jsonl" >"$TMP/out" 2>"$TMP/err" &
  pid=$!
  wait_for_step "$TMP/m.jsonl" 3 || fail "SIG$sig: run did not start"
  kill -$sig $pid; wait $pid; rc=$?
  want=$((128 + $(kill -l $sig)))
  [ "$rc" -eq "$want" ] && pass "SIG$sig: exit $rc" || fail "SIG$sig: exit $rc, want $want ($(cat "$TMP/err"))"
  step=$(python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "event" not in r][-1]["step"])' "$TMP/m.jsonl")
  tail -1 "$TMP/m.jsonl" | python3 -c 'import json,sys; r = json.load(sys.stdin); assert r["event"] == "summary" and r["steps"] == int(sys.argv[1]) and r["mem"], r' "$step" &&
    pass "SIG$sig: the metrics file ends with its summary (step $step)" || fail "SIG$sig: last metrics line: $(tail -1 "$TMP/m.jsonl")"
  latest=$(cat "$TMP/ck/latest" 2>/dev/null)
  [ "$latest" = "$(printf 'step_%08d' "$step")" ] && pass "SIG$sig: saved the last finished step ($latest)" \
    || fail "SIG$sig: latest '$latest', last metrics step $step"
  grep -q "stopped by SIG$sig after step $step; saved" "$TMP/err" && pass "SIG$sig: says so: $(tail -1 "$TMP/err")" \
    || fail "SIG$sig: message: $(cat "$TMP/err")"
done
# the saved step resumes to the weights of an uninterrupted run of the same length
n=$((step + 5))
"$DTRAIN" train "${LONG[@]}" --resume "$TMP/ck" --set train.stop_after=5 --digest >"$TMP/resumed" 2>&1 \
  || fail "resume after SIGINT"
"$DTRAIN" train "${LONG[@]}" --set train.stop_after=$n --digest >"$TMP/straight" 2>&1 || fail "straight run"
[ -n "$(digest_of "$TMP/straight")" ] && [ "$(digest_of "$TMP/resumed")" = "$(digest_of "$TMP/straight")" ] \
  && pass "resumed after the signal = $n straight steps (bitwise)" || fail "digest after signal resume differs"
# no save directory: nothing saved, still a clean non-zero exit naming the signal
"$DTRAIN" train "${LONG[@]}" --metrics "$TMP/m2.jsonl" >/dev/null 2>"$TMP/err" &
pid=$!; wait_for_step "$TMP/m2.jsonl" 2; kill -TERM $pid; wait $pid; rc=$?
[ "$rc" -eq 143 ] && grep -q "nothing saved" "$TMP/err" && pass "no save dir: exit 143, nothing saved" \
  || fail "no save dir: exit $rc: $(cat "$TMP/err")"
# a second signal exits at once: block the first one's save by making the step long (the
# first signal is sent as step 2 begins, the second 0.3 s later: within step 2, which takes
# seconds, so the first one's save has not begun)
"$DTRAIN" train "${TINY[@]}" --steps 100000 --threads 1 --set model.n_embd=384 --set model.n_head=4 --set model.n_layer=8 \
  --set train.micro_batch=64 --set train.global_batch=1024 --metrics "$TMP/m3.jsonl" --save "$TMP/ck3" \
  >/dev/null 2>"$TMP/err" &
pid=$!
for _ in $(seq 1 3000); do grep -q '"step": 1,' "$TMP/m3.jsonl" 2>/dev/null && break; sleep 0.02; done
kill -TERM $pid; sleep 0.3; kill -TERM $pid
t0=$(date +%s.%N); wait $pid; rc=$?; t1=$(date +%s.%N)
[ "$rc" -eq 143 ] && ! grep -q "saved" "$TMP/err" && pass "second signal exits at once (exit $rc, no save)" \
  || fail "second signal: exit $rc: $(cat "$TMP/err")"
# under mpirun: every rank stops after the same step, the checkpoint is saved once, one
# message. Open MPI's mpirun forwards SIGUSR1 to every rank as it is; on SIGTERM/SIGINT
# it kills the job itself: SIGCONT, odls_base_sigkill_timeout seconds (default 1), SIGTERM
# to every rank, the same wait, SIGKILL; it does not read the ranks' output meanwhile
# (so progress lines are kept few here, or a full pipe would stall rank 0).
if command -v mpirun >/dev/null; then
  for sig in USR1 TERM; do
    rm -rf "$TMP/ckm" "$TMP/mm.jsonl"
    mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca odls_base_sigkill_timeout 3 -np 2 "$DTRAIN" train \
      "${LONG[@]}" --set log.every=1000000 --save "$TMP/ckm" --metrics "$TMP/mm.jsonl" >"$TMP/outm" 2>"$TMP/errm" &
    pid=$!
    wait_for_step "$TMP/mm.jsonl" 3 || fail "mpirun: run did not start"
    kill -$sig $pid # to mpirun, as a user or a batch system does
    wait $pid; rc=$?
    step=$(python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "event" not in r][-1]["step"])' "$TMP/mm.jsonl")
    [ "$rc" -ne 0 ] && [ "$(cat "$TMP/ckm/latest")" = "$(printf 'step_%08d' "$step")" ] \
      && [ "$(grep -c "stopped by SIG" "$TMP/errm")" -eq 1 ] && grep -q "stopped by SIG$sig after step $step; saved" "$TMP/errm" \
      && pass "mpirun -np 2, SIG$sig to mpirun: both ranks stop after step $step, saved once, one message (exit $rc)" \
      || fail "mpirun SIG$sig: rc $rc, latest $(cat "$TMP/ckm/latest"), step $step: $(cat "$TMP/errm")"
    "$DTRAIN" train "${LONG[@]}" --resume "$TMP/ckm" --set train.stop_after=1 >/dev/null 2>&1 \
      && pass "mpirun SIG$sig: the saved step resumes" || fail "mpirun SIG$sig: resume failed"
  done
  # the asynchronous parameter server's fixed order (bitwise, staleness 3): SIGUSR1 to mpirun
  # stops it at a global step's boundary with the next 3 tasks handed out ahead; their
  # gradients are saved with the step, so the resume ends on an uninterrupted run's weights
  PSA=("${LONG[@]}" --set parallel.dp_mode=ps-async --set parallel.staleness=3 --set parallel.determinism=bitwise
       --set train.micro_batch=2 --set train.global_batch=12
       --set log.every=1000000)
  PMPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca odls_base_sigkill_timeout 3 -np 3 "$DTRAIN" train)
  rm -rf "$TMP/ckp" "$TMP/mp.jsonl"
  "${PMPI[@]}" "${PSA[@]}" --save "$TMP/ckp" --metrics "$TMP/mp.jsonl" >"$TMP/outp" 2>"$TMP/errp" &
  pid=$!
  wait_for_step "$TMP/mp.jsonl" 3 || fail "ps-async: run did not start"
  kill -USR1 $pid
  wait $pid; rc=$?
  step=$(python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "event" not in r][-1]["step"])' "$TMP/mp.jsonl")
  [ "$rc" -eq 138 ] && [ "$(cat "$TMP/ckp/latest")" = "$(printf 'step_%08d' "$step")" ] &&
    pass "ps-async (fixed order), SIGUSR1 to mpirun: stopped after step $step, saved (exit $rc)" ||
    fail "ps-async SIGUSR1: rc $rc, latest $(cat "$TMP/ckp/latest" 2>/dev/null), step $step: $(tail -2 "$TMP/errp")"
  "${PMPI[@]}" "${PSA[@]}" --resume "$TMP/ckp" --set train.stop_after=4 --digest >"$TMP/resp" 2>&1
  "${PMPI[@]}" "${PSA[@]}" --set train.stop_after=$((step + 4)) --digest >"$TMP/strp" 2>&1
  [ -n "$(digest_of "$TMP/strp")" ] && [ "$(digest_of "$TMP/resp")" = "$(digest_of "$TMP/strp")" ] &&
    pass "ps-async: resumed after the signal = $((step + 4)) straight steps (bitwise)" ||
    fail "ps-async signal resume: '$(digest_of "$TMP/resp")' vs '$(digest_of "$TMP/strp")': $(grep -m1 error "$TMP/resp")"
fi
finish
