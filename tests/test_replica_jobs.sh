# Replicas as separate jobs (issue 29: `dtrain launch --replicas R`): local SGD's and
# DiLoCo's replicas run as R MPI jobs that meet at the launcher's outer server. The same
# run as one job with R replicas (bit for bit: two replicas' sum is the same in either
# order); one replica's ranks killed mid-run: the others go on (their job is never
# restarted), the killed one is restarted alone, joins them at their last
# synchronisation, and the run finishes with one model on every replica; under a timeout
# (no hang); a stopped replica is dropped after comm.timeout and its job restarted. Bad input: one line, exit 2, before any job starts.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
DL=(--set parallel.sync=diloco --set parallel.sync_every=4)
LAUNCH=("$DTRAIN" launch --mpirun "${MPI[0]}")
for a in "${MPI[@]:1}"; do LAUNCH+=(--mpi-arg "$a"); done

# the same run as one job of 2 replicas, and as 2 jobs (1 rank each, then 2 ranks each)
one=$(dp_run one 2 "${DL[@]}")
timeout 300 "${LAUNCH[@]}" -n 2 --replicas 2 -- train "${DP_RUN[@]}" --digest --metrics "$TMP/two.jsonl" "${DL[@]}" \
  >"$TMP/two.out" 2>&1
rc=$?
got=$(digest_of "$TMP/two.out" | sort -u)
[ $rc = 0 ] && [ -n "$one" ] && [ "$got" = "$one" ] &&
  pass "DiLoCo as 2 replica jobs = one job of 2 replicas, bit for bit, on both replicas ($got)" ||
  fail "2 replica jobs: rc $rc, digests '$got' vs one job's '$one': $(tail -3 "$TMP/two.out")"
python3 - "$TMP/one.jsonl" "$TMP/two.jsonl" "$TMP/two.jsonl.replica1" <<'PY' && pass "each replica job writes its metrics (replica 1: two.jsonl.replica1); the final validation (a synchronisation) is the one job's within 1e-6" || fail "replica jobs' metrics"
import json, sys
def val(p): return [json.loads(l) for l in open(p) if '"val"' in l][-1]
def steps(p): return [json.loads(l)['step'] for l in open(p) if 'event' not in l]
one, a, b = sys.argv[1:]
assert steps(a) == steps(b) == list(range(1, 21)), (steps(a), steps(b))
v1, va, vb = val(one), val(a), val(b)
assert v1['step'] == va['step'] == vb['step'] == 20, (v1, va, vb)
assert va['val_loss'] == vb['val_loss'], (va, vb)  # one model
assert abs(va['val_loss'] - v1['val_loss']) <= 1e-6 * abs(v1['val_loss']), (va, v1)
PY

if full; then
  one4=$(dp_run one4 4 "${DL[@]}" --set parallel.dp_shard=2)
  timeout 300 "${LAUNCH[@]}" -n 4 --replicas 2 -- train "${DP_RUN[@]}" --digest "${DL[@]}" >"$TMP/two4.out" 2>&1
  rc=$?
  got=$(digest_of "$TMP/two4.out" | sort -u)
  [ $rc = 0 ] && [ "$got" = "$one4" ] && pass "2 replica jobs of 2 ranks = one job with dp_shard 2 ($got)" ||
    fail "2 jobs x 2 ranks: rc $rc, '$got' vs '$one4'"
fi

# a replica killed after step 6 (its rank 0 exits): the other goes on; replica 0 slowed
# (DT_TEST_STRAGGLER, by the run's rank), so
# the killed one is back before the end
rm -f "$TMP/once"
start=$(date +%s)
DT_TEST_FAULT=exit:6:1 DT_TEST_FAULT_ONCE="$TMP/once" DT_TEST_STRAGGLER=0:40 \
  timeout 300 "${LAUNCH[@]}" -n 2 --replicas 2 --restart-delay 0 -- train "${DP_RUN[@]}" --digest "${DL[@]}" \
  --steps 100 --set train.val_every=0 --metrics "$TMP/kill.jsonl" >"$TMP/kill.out" 2>&1
rc=$?
got=$(digest_of "$TMP/kill.out" | sort -u)
grep -q "replica 1 failed (exit 9): restarting it alone" "$TMP/kill.out" &&
  grep -q "outer server: replica 1 left" "$TMP/kill.out" && grep -q "replica 1 joins the others at step" "$TMP/kill.out" &&
  [ $rc = 0 ] && [ "$(echo "$got" | wc -l)" = 1 ] && [ -n "$got" ] &&
  pass "replica 1 killed after step 6: restarted alone, joined the others at a synchronisation ($(grep -o 'replica 1 joins the others at step [0-9]*' "$TMP/kill.out" | head -1)), one model at the end ($got, $(( $(date +%s) - start )) s)" ||
  fail "kill: rc $rc, digests '$got': $(grep 'dtrain launch\|error' "$TMP/kill.out" | tail -5)"
python3 - "$TMP/kill.jsonl" "$TMP/kill.jsonl.replica1" <<'PY' && pass "replica 0 went on (every step once, its job never restarted); replica 1 trained from its join to the end" || fail "the replicas' metrics after the kill"
import json, sys
steps = lambda p: [json.loads(l)['step'] for l in open(p) if 'event' not in l]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a == list(range(1, 101)), a
assert 6 < b[0] - 1 < 100 and (b[0] - 1) % 4 == 0 and b == list(range(b[0], 101)), b
PY
grep -q "restarting replica 0\|replica 0 failed" "$TMP/kill.out" && fail "replica 0 restarted"

# a replica stopped (SIGSTOP after step 6, as a hung host): silent for comm.timeout while
# replica 0 waits at the synchronisation, so the server drops it and the launcher kills
# and restarts its job; the run finishes (no hang)
rm -f "$TMP/once"
DT_TEST_FAULT=stop:6:1 DT_TEST_FAULT_ONCE="$TMP/once" \
  timeout 300 "${LAUNCH[@]}" -n 2 --replicas 2 --restart-delay 0 -- train "${DP_RUN[@]}" --digest "${DL[@]}" \
  --set comm.timeout=2 >"$TMP/stop.out" 2>&1
rc=$?
got=$(digest_of "$TMP/stop.out" | sort -u)
[ $rc = 0 ] && [ "$(echo "$got" | wc -l)" = 1 ] && grep -q "replica 1 was silent for comm.timeout" "$TMP/stop.out" &&
  grep -q "replica 1 joins the others at step" "$TMP/stop.out" &&
  pass "replica 1 stopped after step 6: dropped after comm.timeout, its job killed and restarted, one model at the end" ||
  fail "stopped replica: rc $rc '$got': $(grep 'dtrain launch\|error' "$TMP/stop.out" | tail -5)"

# bad input: one line, exit 2, no job started
refused_launch() { # WHAT ARGS...
  local what=$1; shift
  timeout 60 "${LAUNCH[@]}" "$@" >"$TMP/bad.out" 2>&1
  local rc=$?
  [ $rc = 2 ] && [ "$(grep -c 'dtrain: error' "$TMP/bad.out")" = 1 ] && ! grep -q "starting" "$TMP/bad.out" &&
    pass "refused: $what ($(grep 'dtrain: error' "$TMP/bad.out" | cut -c1-110))" || fail "not refused: $what (rc $rc): $(tail -2 "$TMP/bad.out")"
}
refused_launch "--replicas without parallel.sync" -n 2 --replicas 2 -- train "${DP_RUN[@]}"
refused_launch "--replicas not dividing -n" -n 3 --replicas 2 -- train "${DP_RUN[@]}" "${DL[@]}"
refused_launch "--replicas with another dp_shard" -n 4 --replicas 2 -- train "${DP_RUN[@]}" "${DL[@]}" --set parallel.dp_shard=1
refused_launch "--replicas with --hostfile" -n 2 --replicas 2 --hostfile /dev/null -- train "${DP_RUN[@]}" "${DL[@]}"
DTRAIN_REPLICAS=2 DTRAIN_REPLICA=5 DTRAIN_OUTER_ADDR=x:1 "$DTRAIN" train "${DP_RUN[@]}" "${DL[@]}" >"$TMP/env.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "not a replica of" "$TMP/env.out" && pass "a replica variable out of range: one line, exit 2" ||
  fail "bad DTRAIN_REPLICA: rc $rc $(tail -1 "$TMP/env.out")"
finish
