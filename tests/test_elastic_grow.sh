# dtrain launch's elastic growth and waiting (issue 23 item 9). --grow: a job started on
# the 2 slots a hostfile offers, the hostfile then offering 4, restarts on 4 ranks from its
# next checkpoint and ends with the single process's weights bit for bit (bitwise mode, the
# global batch kept). --wait-timeout: too few slots are waited for; slots that appear start
# the job, slots that never do end it with one error line after the timeout.
source "$(dirname "$0")/lib.sh"
need_mpi
L=("$DTRAIN_BIN" launch --mpi-arg --oversubscribe --mpi-arg --mca --mpi-arg mpi_yield_when_idle --mpi-arg 1
   --mpi-arg --mca --mpi-arg btl --mpi-arg self,vader --restart-delay 0.2)
prepare_tiny
RUN=("${TINY[@]}" --threads 1 --seed 1 --set train.micro_batch=1 --set train.global_batch=8 --set train.val_every=0
     --set log.sample_tokens=0 --digest)

# usage: --grow needs a hostfile and a checkpoint directory
echo "localhost slots=2" >"$TMP/hosts"
for bad in "-n 4 --grow -- train:--grow needs --hostfile" \
           "-n 4 --grow --hostfile $TMP/hosts -- train:--grow needs checkpoint.dir and checkpoint.every" \
           "-n 2 --wait-timeout soon -- train:--wait-timeout needs a number"; do
  args=${bad%%:*}; pat=${bad#*:}
  out=$("$DTRAIN_BIN" launch $args "${RUN[@]}" 2>&1); rc=$?
  [ $rc -eq 2 ] && [ "$(echo "$out" | grep -c '^dtrain: error')" -eq 1 ] && echo "$out" | grep -qF -- "$pat" &&
    pass "launch $args: $(echo "$out" | grep '^dtrain: error')" || fail "launch $args: rc $rc: $out"
done

# --grow: 2 slots, then 4 once the job has started: the job stops after its next checkpoint
# and resumes on 4 ranks; the weights are the single process's
G=("${RUN[@]}" --steps 200 --set parallel.determinism=bitwise)
"$DTRAIN_BIN" train "${G[@]}" >"$TMP/single.out" 2>&1 || fail "single run"
(for i in $(seq 1200); do grep -q "starting 2 ranks" "$TMP/grow.out" 2>/dev/null && break; sleep 0.05; done
 echo "localhost slots=4" >"$TMP/hosts") &
timeout 300 "${L[@]}" -n 4 --min-ranks 2 --grow --hostfile "$TMP/hosts" -- train "${G[@]}" --save "$TMP/ck" \
  --save-every 20 >"$TMP/grow.out" 2>&1; rc=$?
wait
[ $rc -eq 0 ] && grep -q "^dtrain launch: starting 2 ranks" "$TMP/grow.out" &&
  grep -q "growing from 2 to 4 ranks at the next checkpoint" "$TMP/grow.out" &&
  grep -q "^dtrain launch: growing to 4 ranks (from 2), resuming from $TMP/ck" "$TMP/grow.out" &&
  grep -q "micro-batch 1 x 2 data-parallel x 4 accumulation" "$TMP/grow.out" &&
  [ "$(grep "micro-batch" "$TMP/grow.out" | tail -1 | grep -c "micro-batch 1 x 4 data-parallel x 2 accumulation")" -eq 1 ] &&
  grep -q "^summary: [0-9]* steps (from [1-9][0-9]*)" "$TMP/grow.out" &&
  [ -n "$(digest_of "$TMP/single.out")" ] && [ "$(digest_of "$TMP/grow.out")" = "$(digest_of "$TMP/single.out")" ] &&
  pass "--grow: 2 ranks, then 4 ($(grep -o 'resumed at step [0-9]*' "$TMP/grow.out")), global batch 8, the single process's weights ($(digest_of "$TMP/grow.out"))" ||
  fail "--grow: rc $rc: $(grep -E 'launch|micro-batch|resumed|digest' "$TMP/grow.out") vs $(digest_of "$TMP/single.out")"

# waiting: 1 slot of the 2 wanted; a second appears once the launcher says it waits (not
# after a fixed delay: a loaded machine can start the launcher later than that) and the
# job starts
echo "localhost slots=1" >"$TMP/hosts"
: >"$TMP/wait.out"
(for i in $(seq 1200); do grep -q "waiting up to" "$TMP/wait.out" && break; sleep 0.1; done
 echo "localhost slots=2" >"$TMP/hosts") &
timeout 300 "${L[@]}" -n 2 --hostfile "$TMP/hosts" --wait-timeout 120 -- train "${RUN[@]}" --steps 2 >"$TMP/wait.out" 2>&1; rc=$?
wait
[ $rc -eq 0 ] && grep -q "offers 1 slot, fewer than a world of at least --min-ranks 2 needs: waiting up to 120 s" "$TMP/wait.out" &&
  grep -q "now offers 2 slots" "$TMP/wait.out" && grep -q "^dtrain launch: starting 2 ranks" "$TMP/wait.out" &&
  grep -q "^summary: 2 steps" "$TMP/wait.out" && pass "waiting: the job starts when the slots appear" ||
  fail "waiting: rc $rc: $(grep -E 'launch|summary' "$TMP/wait.out")"
# ... and slots that never come: one error line after the timeout, nothing started
echo "localhost slots=1" >"$TMP/hosts"
"${L[@]}" -n 2 --hostfile "$TMP/hosts" --wait-timeout 1 -- train "${RUN[@]}" --steps 2 >"$TMP/never.out" 2>&1; rc=$?
[ $rc -ne 0 ] && [ "$(grep -c '^dtrain: error' "$TMP/never.out")" -eq 1 ] &&
  grep -q "^dtrain: error: launch: $TMP/hosts offers 1 slot, fewer than a world of at least --min-ranks 2 needs (waited 1 s, --wait-timeout)" "$TMP/never.out" &&
  ! grep -q "starting" "$TMP/never.out" && pass "waiting in vain: exit $rc, $(grep '^dtrain: error' "$TMP/never.out")" ||
  fail "waiting in vain: rc $rc: $(cat "$TMP/never.out")"
finish
