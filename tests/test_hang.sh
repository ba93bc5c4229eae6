# A stuck rank under plain mpirun: rank 1 gets SIGSTOP mid-run (kill -STOP of its pid, read
# from its per-rank heartbeat file) in dp2, pp2 and tp2, and at a step's end (the
# stop:STEP:RANK fault); within comm.timeout + 10% (+0.5 s for this script's polling) rank
# 0 prints one line naming the operation, its group (in pp2 the stage's send/receive or the
# tied embedding's all-reduce, whichever rank 1 was in), the step and rank 1, dumps the flight
# recorders (its own and rank 1's, read from node-shared memory) and the job exits 1 (a
# runtime failure, not 2), without hanging. comm.timeout=0 turns it off: a rank stopped
# for longer than the timeout is waited for, and once continued (SIGCONT) the run ends
# with the straight run's weights. `dtrain launch` names the rank that stopped beating.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
T=4 # comm.timeout in seconds
RUN=("${TINY[@]}" --threads 1 --seed 1 --set train.micro_batch=1 --set train.global_batch=4 --set train.val_every=0
     --set log.sample_tokens=0)
STOPPED=""
trap 'for p in $STOPPED; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
now() { date +%s.%N; }
calc() { awk "BEGIN { print $* }"; }
# within A B: A <= B (decimals)
within() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 <= b + 0) }'; }
# beat_of DIR RANK FIELD: the rank's heartbeat ("step S pid P"): S or P
beat_of() { [ -s "$1/rank.$2" ] && awk -v f="$3" '{print f == "step" ? $2 : $4}' "$1/rank.$2"; }
# wait_for FILE PATTERN SECONDS: polls (0.05 s) until FILE has PATTERN
wait_for() {
  local i
  for i in $(seq $(($3 * 20))); do grep -Eq "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
DIAG="rank 1 has not arrived|waiting for rank 1|rank 1 shows no sign of life"

# stopped LABEL SET...: rank 1 is stopped once both ranks beat step 3; rank 0 must diagnose it
stopped() {
  local label=$1 d="$TMP/$1"; shift
  mkdir -p "$d/beat" "$d/flight"
  DTRAIN_HEARTBEAT="$d/beat" DTRAIN_FLIGHT_DIR="$d/flight" timeout 60 "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" \
    --steps 1000000 --set comm.timeout=$T "$@" >"$d/out" 2>&1 &
  local job=$! pid="" i t0 t1
  for i in $(seq 600); do
    [ "$(beat_of "$d/beat" 1 step)" -ge 3 ] 2>/dev/null && [ "$(beat_of "$d/beat" 0 step)" -ge 3 ] 2>/dev/null && break
    sleep 0.05
  done
  pid=$(beat_of "$d/beat" 1 pid)
  [ -n "$pid" ] && kill -STOP "$pid" && STOPPED="$STOPPED $pid" && t0=$(now)
  wait_for "$d/out" "$DIAG" $((T * 3)); t1=$(now)
  wait $job; local rc=$?
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done # mpirun may exit before it
  local line; line=$(grep -E "^dtrain: error: rank 0: comm: " "$d/out")
  local took; took=$(calc "$t1 - $t0")
  local waited; waited=$(echo "$line" | grep -o "waited [0-9.]* s" | grep -o "[0-9.]*")
  if [ -n "$pid" ] && [ $rc -ne 0 ] && [ $rc -ne 2 ] && [ $rc -ne 124 ] && [ "$(echo "$line" | wc -l)" -eq 1 ] &&
     echo "$line" | grep -Eq "$DIAG" && echo "$line" | grep -Eq " on (dp|pp|cp|tp|kv|dp_cp|embedding|world) group .*(at|after) step [0-9]+" &&
     within "$took" "$(calc "$T * 1.1 + 0.5")" && within "$waited" "$(calc "$T * 1.1")" &&
     grep -q "^# flight recorder of rank 0" "$d/flight/dtrain-flight-rank0.tsv" &&
     grep -q "^# flight recorder of rank 1" "$d/flight/dtrain-flight-rank0.tsv" && ! kill -0 "$pid" 2>/dev/null; then
    pass "$label: rank 1 stopped, diagnosed in $took s (comm.timeout $T s), exit $rc: ${line#dtrain: error: }"
  else
    fail "$label: rc $rc, pid '$pid', took $took s, waited '$waited', alive $(kill -0 "$pid" 2>/dev/null && echo yes), dumps $(grep -c '^# flight recorder' "$d/flight/dtrain-flight-rank0.tsv"): $(grep -v '^step' "$d/out" | head -20)"
  fi
}

stopped dp2
stopped pp2 --set parallel.pp=2
stopped tp2 --set parallel.tp=2

# at a step's end (the test fault): the peer waits in the next collective, rank 1 never got there
if full; then
  mkdir -p "$TMP/f"
  DT_TEST_FAULT=stop:3:1 DTRAIN_FLIGHT_DIR="$TMP/f" timeout 60 "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --steps 100 \
    --set comm.timeout=$T >"$TMP/f/out" 2>&1 &
  job=$!
  wait_for "$TMP/f/out" "test fault: rank 1 stops" 30; t0=$(now)
  wait_for "$TMP/f/out" "$DIAG" $((T * 3)); t1=$(now)
  wait $job; rc=$?
  pid=$(grep -o "pid [0-9]*" "$TMP/f/dtrain-flight-rank0.tsv" 2>/dev/null | sed -n 2p | cut -d' ' -f2)
  [ -n "$pid" ] && STOPPED="$STOPPED $pid"
  line=$(grep "^dtrain: error: rank 0: comm:" "$TMP/f/out")
  took=$(calc "$t1 - $t0")
  [ $rc -eq 1 ] && echo "$line" | grep -q "rank 1 has not arrived (its last op: .* at step 3 micro-step [0-9]*, completed" &&
    within "$took" "$(calc "$T * 1.1 + 0.5")" &&
    pass "stop after step 3: diagnosed in $took s: ${line#dtrain: error: }" ||
    fail "stop after step 3: rc $rc, took $took: $(grep -v '^step' "$TMP/f/out" | head)"
fi

# comm.timeout=0: no watchdog; a rank stopped for 1.5 x the timeout is waited for, and after
# SIGCONT the run ends with the straight run's weights
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --steps 1500 --digest >"$TMP/straight.out" 2>&1 || fail "straight run"
mkdir -p "$TMP/off"
DTRAIN_HEARTBEAT="$TMP/off" timeout 120 "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --steps 1500 --digest \
  --set comm.timeout=0 >"$TMP/off.out" 2>&1 &
job=$!
for i in $(seq 600); do [ "$(beat_of "$TMP/off" 1 step)" -ge 3 ] 2>/dev/null && break; sleep 0.05; done
pid=$(beat_of "$TMP/off" 1 pid)
kill -STOP "$pid" && STOPPED="$STOPPED $pid"
sleep "$(calc "$T * 1.5")"
alive=0; kill -0 $job 2>/dev/null && alive=1
kill -CONT "$pid"
wait $job; rc=$?
[ $alive -eq 1 ] && [ $rc -eq 0 ] && ! grep -q "comm:" "$TMP/off.out" &&
  [ "$(digest_of "$TMP/off.out")" = "$(digest_of "$TMP/straight.out")" ] && [ -n "$(digest_of "$TMP/straight.out")" ] &&
  pass "comm.timeout=0: stopped $(calc "$T * 1.5") s, waited for, continued: the straight run's weights" ||
  fail "comm.timeout=0: alive $alive rc $rc: $(grep -v '^step' "$TMP/off.out" | head)"

# the launcher's watchdog (comm.timeout off): the per-rank heartbeats name the rank that stopped
if full; then
  DT_TEST_FAULT=stop:3:1 DT_TEST_FAULT_ONCE=$TMP/once timeout 120 "$DTRAIN_BIN" launch -n 2 --heartbeat-timeout 3 \
    --restart-delay 0.2 --mpi-arg --oversubscribe --mpi-arg --mca --mpi-arg btl --mpi-arg self,vader \
    -- train "${RUN[@]}" --steps 20 --set comm.timeout=0 --digest >"$TMP/launch.out" 2>&1; rc=$?
  line=$(grep "no heartbeat for" "$TMP/launch.out")
  [ $rc -eq 0 ] && echo "$line" | grep -q "from rank 1 (last step 2), stopped first; the others: rank 0 at step 3" &&
    pass "dtrain launch names the stopped rank and restarts: $line" ||
    fail "launch: rc $rc: $(grep -E 'launch|error' "$TMP/launch.out")"
fi
finish
