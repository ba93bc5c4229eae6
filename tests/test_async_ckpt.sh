# Asynchronous checkpointing (checkpoint.async): rank 0's writes run in a forked child while
# training goes on. Its files are byte for byte a synchronous run's at every step, also when
# the child is held back (DT_TEST_SAVE_DELAY_MS) while the parent trains past the save (the
# child writes the state of the fork: copy-on-write); the resumed run is bitwise the straight
# one; a failed background write (DT_TEST_FAIL_AT=write) stops the run (exit 1, one line)
# with `latest` on the last good step; with ZeRO-3 on 2 ranks the files equal a synchronous
# ZeRO-3 run's; layouts with stage writers (pp) save synchronously and say so.
source "$(dirname "$0")/lib.sh"
prepare_tiny
RUN=("${TINY[@]}" --steps 10 --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8
     --set train.val_every=0 --set log.sample_tokens=0 --save-every 2 --digest)
AS=(--set checkpoint.async=true)
same_steps() { # DIR_A DIR_B: every step's model and optimizer files byte for byte
  local s f
  for s in 2 4 6 8 10; do
    for f in model optimizer; do
      cmp -s "$1/$(printf 'step_%08d' $s)/$f.safetensors" "$2/$(printf 'step_%08d' $s)/$f.safetensors" || { echo "step $s $f differs"; return 1; }
    done
  done
}
"$DTRAIN" train "${RUN[@]}" --save "$TMP/sync" >"$TMP/sync.out" 2>&1 || fail "sync run"
"$DTRAIN" train "${RUN[@]}" "${AS[@]}" --save "$TMP/async" >"$TMP/async.out" 2>&1 || fail "async run: $(tail -2 "$TMP/async.out")"
r=$(same_steps "$TMP/sync" "$TMP/async") && grep -q "in the background" "$TMP/async.out" &&
  [ "$(digest_of "$TMP/async.out")" = "$(digest_of "$TMP/sync.out")" ] &&
  pass "async saves: every step's files are the synchronous run's" || fail "async files: $r"
DT_TEST_SAVE_DELAY_MS=300 "$DTRAIN" train "${RUN[@]}" "${AS[@]}" --save "$TMP/slow" >"$TMP/slow.out" 2>&1 ||
  fail "delayed async run: $(tail -2 "$TMP/slow.out")"
r=$(same_steps "$TMP/sync" "$TMP/slow") && pass "a held-back writer still writes the state of its step (copy-on-write)" ||
  fail "delayed async files: $r"
"$DTRAIN" train "${RUN[@]}" "${AS[@]}" --set train.stop_after=6 --save "$TMP/half" >/dev/null 2>&1 &&
  "$DTRAIN" train "${RUN[@]}" "${AS[@]}" --resume "$TMP/half" >"$TMP/half.out" 2>&1 || fail "async halves"
[ "$(digest_of "$TMP/half.out")" = "$(digest_of "$TMP/sync.out")" ] && pass "resume from an async save: bitwise the straight run" ||
  fail "async resume: $(digest_of "$TMP/half.out") vs $(digest_of "$TMP/sync.out")"
DT_TEST_FAIL_AT=write:6 "$DTRAIN" train "${RUN[@]}" "${AS[@]}" --save "$TMP/bad" >"$TMP/bad.out" 2>&1; rc=$?
[ $rc -eq 1 ] && [ "$(grep -c '^dtrain: error' "$TMP/bad.out")" -eq 1 ] && grep -q "checkpoint of step 6 (background)" "$TMP/bad.out" &&
  [ "$(cat "$TMP/bad/latest")" = step_00000004 ] &&
  pass "a failed background write: exit 1, latest stays on step 4: $(grep '^dtrain: error' "$TMP/bad.out")" ||
  fail "failed async write: rc $rc, latest $(cat "$TMP/bad/latest"): $(tail -2 "$TMP/bad.out")"
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
  "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set parallel.zero=3 --save "$TMP/z3s" >/dev/null 2>&1 || fail "zero3 sync"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set parallel.zero=3 "${AS[@]}" --save "$TMP/z3a" >"$TMP/z3a.out" 2>&1 ||
    fail "zero3 async: $(tail -2 "$TMP/z3a.out")"
  r=$(same_steps "$TMP/z3s" "$TMP/z3a") && pass "ZeRO-3 on 2 ranks, async: the synchronous run's files" || fail "zero3 async: $r"
  if full; then
    "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set parallel.pp=2 "${AS[@]}" --save "$TMP/pp" >"$TMP/pp.out" 2>&1 ||
      fail "pp2 async run"
    grep -q "checkpoint.async applies where rank 0 writes alone" "$TMP/pp.out" && [ -s "$TMP/pp/latest" ] &&
      pass "pp 2: saves synchronously and says so" || fail "pp2 async note: $(grep note "$TMP/pp.out")"
  fi
fi
finish
