# dtrain launch: the job under supervision. A rank that dies (DT_TEST_FAULT, once) is
# restarted from the newest checkpoint and the run ends on the straight run's weights bit
# for bit; a restart on fewer slots (the hostfile shrank) keeps the global batch and, in
# bitwise mode, the single process's weights; a hung rank is found by the heartbeat and
# restarted; SIGTERM to the launcher makes the job save and stop (no restart); bad input is
# never restarted; the restarts run out with the failure's exit code; bad launcher
# options are one line, exit 2.
source "$(dirname "$0")/lib.sh"
need_mpi
L=("$DTRAIN_BIN" launch --mpi-arg --oversubscribe --mpi-arg --mca --mpi-arg mpi_yield_when_idle --mpi-arg 1
   --mpi-arg --mca --mpi-arg btl --mpi-arg self,vader --restart-delay 0.2)
prepare_tiny
RUN=("${TINY[@]}" --steps 10 --threads 1 --seed 1 --set train.micro_batch=1 --set train.global_batch=8
     --set train.val_every=5 --set log.sample_tokens=0 --digest)
starts() { grep -c "^dtrain launch: \(starting\|restart [0-9]\)" "$1"; }

# usage
for bad in "--:-n N (ranks to start) is required" "-n 2:expected \`-- train" "-n 2 --bogus 1 -- train:unknown option '--bogus'" \
           "-n 0 -- train:-n needs a number" "-n 2 --min-ranks 3 -- train:--min-ranks 3 exceeds -n 2" \
           "-n 2 -- sample:expected \`-- train" "-n 3 -- train --set parallel.tp=2:not a multiple of tp x pp x cp"; do
  args=${bad%%:*}; pat=${bad#*:}
  out=$("$DTRAIN_BIN" launch $args 2>&1); rc=$?
  [ $rc -eq 2 ] && [ "$(echo "$out" | grep -c '^dtrain: error')" -eq 1 ] && echo "$out" | grep -qF -- "$pat" &&
    pass "launch $args: $out" || fail "launch $args: rc $rc: $out"
done
# a bad config fails before any rank starts; bad data is the job's exit 2, never restarted
out=$("${L[@]}" -n 2 -- train "${RUN[@]}" --set model.n_head=3 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(echo "$out" | grep -c '^dtrain launch: starting')" -eq 0 ] && pass "bad config: exit 2 before starting" ||
  fail "bad config: rc $rc: $out"
# a layout the trainer refuses (the layout's one check) fails there too, once, before any rank starts
out=$("${L[@]}" -n 2 -- train "${RUN[@]}" --set parallel.cp=2 --set precision=bf16 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(echo "$out" | grep -c '^dtrain launch: starting')" -eq 0 ] &&
  [ "$(echo "$out" | grep -c '^dtrain: error: parallel.cp 2: a precision other than fp32')" -eq 1 ] &&
  pass "refused layout: exit 2 before starting" || fail "refused layout: rc $rc: $out"
"${L[@]}" -n 2 -- train "${RUN[@]}" --set data.train=$TMP/missing.bin >"$TMP/bad.out" 2>&1; rc=$?
[ $rc -eq 2 ] && [ "$(starts "$TMP/bad.out")" -eq 1 ] && grep -q "not restarting" "$TMP/bad.out" &&
  pass "the job's bad input (exit 2) is not restarted" || fail "bad data: rc $rc: $(tail -3 "$TMP/bad.out")"

# a rank dies after step 5: restart from step 4, the straight run's weights
"${MPI[@]}" -np 2 "$DTRAIN_BIN" train "${RUN[@]}" >"$TMP/straight.out" 2>&1 || fail "straight run"
DT_TEST_FAULT=exit:5:1 DT_TEST_FAULT_ONCE=$TMP/once1 "${L[@]}" -n 2 -- train "${RUN[@]}" --save "$TMP/ck1" --save-every 2 \
  --metrics "$TMP/m1.jsonl" >"$TMP/fault.out" 2>&1; rc=$?
[ $rc -eq 0 ] && [ "$(starts "$TMP/fault.out")" -eq 2 ] && grep -q "resumed at step 4" "$TMP/fault.out" &&
  [ -n "$(digest_of "$TMP/straight.out")" ] && [ "$(digest_of "$TMP/fault.out")" = "$(digest_of "$TMP/straight.out")" ] &&
  grep -q '"event": "resume", "step": 4' "$TMP/m1.jsonl" &&
  pass "a dead rank: restarted from step 4, the straight run's weights ($(digest_of "$TMP/fault.out"))" ||
  fail "dead rank: rc $rc: $(grep -E 'launch|digest|resumed' "$TMP/fault.out")"

# give up after --max-restarts, with the failure's exit code
DT_TEST_FAULT=exit:2:0 "${L[@]}" -n 2 --max-restarts 1 -- train "${RUN[@]}" >"$TMP/giveup.out" 2>&1; rc=$?
[ $rc -eq 9 ] && [ "$(starts "$TMP/giveup.out")" -eq 2 ] && grep -q "^dtrain: error: launch: the job failed 2 times" "$TMP/giveup.out" &&
  pass "restarts run out: exit 9 after 2 starts" || fail "give up: rc $rc: $(grep launch "$TMP/giveup.out")"

if full; then
  # DiLoCo (issue 29): one replica's rank dies after step 5; the job restarts from step 4
  # (every rank's own state, rank_state/), the replica rejoins, the run ends on the
  # straight run's weights bit for bit
  DLR=(--set parallel.sync=diloco --set parallel.sync_every=2)
  "${MPI[@]}" -np 2 "$DTRAIN_BIN" train "${RUN[@]}" "${DLR[@]}" >"$TMP/dl-straight.out" 2>&1 || fail "diloco straight run"
  DT_TEST_FAULT=exit:5:1 DT_TEST_FAULT_ONCE=$TMP/once-dl timeout 300 "${L[@]}" -n 2 -- train "${RUN[@]}" "${DLR[@]}" \
    --save "$TMP/ck-dl" --save-every 2 >"$TMP/dl-fault.out" 2>&1; rc=$?
  [ $rc -eq 0 ] && [ "$(starts "$TMP/dl-fault.out")" -eq 2 ] && grep -q "resumed at step 4" "$TMP/dl-fault.out" &&
    [ -n "$(digest_of "$TMP/dl-straight.out")" ] && [ "$(digest_of "$TMP/dl-fault.out")" = "$(digest_of "$TMP/dl-straight.out")" ] &&
    pass "DiLoCo: a replica's rank dies, the job restarts from step 4 and ends on the straight run's weights" ||
    fail "DiLoCo restart: rc $rc: $(grep -E 'launch|digest|resumed|error' "$TMP/dl-fault.out")"

  # elastic: 4 slots, then 3 after the failure: the restart takes 2 ranks (3 does not
  # divide the global batch 8), the global batch stays 8; bitwise mode gives the single
  # process's weights
  "$DTRAIN_BIN" train "${RUN[@]}" --set parallel.determinism=bitwise >"$TMP/single.out" 2>&1 || fail "single run"
  echo "localhost slots=4" >"$TMP/hosts"
  (while [ ! -e "$TMP/once2" ]; do sleep 0.05; done; echo "localhost slots=3 # one GPU lost" >"$TMP/hosts") &
  DT_TEST_FAULT=exit:5:3 DT_TEST_FAULT_ONCE=$TMP/once2 "${L[@]}" -n 4 --min-ranks 1 --restart-delay 2 --hostfile "$TMP/hosts" \
    -- train "${RUN[@]}" --set parallel.determinism=bitwise --save "$TMP/ck2" --save-every 2 >"$TMP/elastic.out" 2>&1; rc=$?
  wait
  grep -q "micro-batch 1 x 2 data-parallel x 4 accumulation" "$TMP/elastic.out" &&
    grep -q "restart 1 of at most 3: 2 ranks, resuming" "$TMP/elastic.out" && [ $rc -eq 0 ] &&
    [ "$(digest_of "$TMP/elastic.out")" = "$(digest_of "$TMP/single.out")" ] &&
    pass "elastic: 4 ranks, then 2 on 3 slots, global batch kept, the single process's weights bit for bit" ||
    fail "elastic: rc $rc: $(grep -E 'launch|global batch|digest' "$TMP/elastic.out") vs $(digest_of "$TMP/single.out")"

  # a hung rank: no heartbeat for 3 s, the job is killed and restarted
  DT_TEST_FAULT=hang:5:1 DT_TEST_FAULT_ONCE=$TMP/once3 timeout 120 "${L[@]}" -n 2 --heartbeat-timeout 3 \
    -- train "${RUN[@]}" --save "$TMP/ck3" --save-every 2 >"$TMP/hang.out" 2>&1; rc=$?
  [ $rc -eq 0 ] && grep -q "no heartbeat for" "$TMP/hang.out" && [ "$(starts "$TMP/hang.out")" -eq 2 ] &&
    [ "$(digest_of "$TMP/hang.out")" = "$(digest_of "$TMP/straight.out")" ] &&
    pass "a hung rank: found by the heartbeat, restarted, the straight run's weights" ||
    fail "hang: rc $rc: $(grep -E 'launch|digest' "$TMP/hang.out")"

  # SIGTERM to the launcher: the job saves and stops, exit 143, no restart
  "${L[@]}" -n 2 -- train "${TINY[@]}" --threads 1 --steps 100000 --set train.val_every=0 --save "$TMP/ck4" \
    --save-every 50 >"$TMP/term.out" 2>&1 &
  lp=$!
  for i in $(seq 600); do [ -e "$TMP/ck4/latest" ] && break; sleep 0.1; done
  kill -TERM $lp; wait $lp; rc=$?
  [ $rc -eq 143 ] && grep -q "stopped by SIGUSR1 after step" "$TMP/term.out" && [ "$(starts "$TMP/term.out")" -eq 1 ] &&
    ! grep -q "step_00000050$" "$TMP/ck4/latest" &&
    pass "SIGTERM: the job saved ($(cat "$TMP/ck4/latest")) and stopped, exit 143, no restart" ||
    fail "SIGTERM: rc $rc: $(grep -E 'launch|stopped' "$TMP/term.out"); latest $(cat "$TMP/ck4/latest")"
fi
finish
