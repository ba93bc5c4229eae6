# Never lose a run: a run saving every step is killed (SIGKILL or SIGTERM, seeded random
# choice and moment, many kills landing inside saves); after each kill, `--resume DIR`
# (same arguments) starts from the newest committed checkpoint, finishes with the digest
# of an uninterrupted run, and leaves no temporaries. 20 trials (10 in the slower ASan
# build; DT_KILL_TRIALS overrides); then 8 more (4) with the optimizer state offloaded to
# files (offload.optimizer=nvme): kills land in the update's writes of the offload file
# too, and the resume (from the checkpoint, never from the scratch file) is the same.
source "$(dirname "$0")/lib.sh"
prepare_tiny
# 4 x 128 wide: a save (~10 MB, fsynced) takes a sizeable share of each step. One thread:
# on a busy machine OpenMP's waiting makes runs erratic. keep_last: pruning is killed too.
RUN=("${TINY[@]}" --threads 1 --set model.n_layer=4 --set model.n_embd=128 --steps 24 --save-every 1
  --set checkpoint.keep_last=3)
TRIALS=${DT_KILL_TRIALS:-20}
if [ -z "$DT_KILL_TRIALS" ] && { ldd "$DTRAIN_BIN" 2>/dev/null | grep -q libasan || nm "$DTRAIN_BIN" 2>/dev/null | grep -q __asan_init; }; then
  TRIALS=10
fi
RANDOM=20240520 # seeds bash's generator: the same kills every time

# trials LABEL TRIALS EXTRA...: the kill-and-resume trials of RUN plus EXTRA
trials() {
  LABEL=$1; TRIALS=$2; shift 2; EXTRA=("$@")
  t0=$(date +%s%N)
  "$DTRAIN" train "${RUN[@]}" "${EXTRA[@]}" --save "$TMP/ref$LABEL" --digest >"$TMP/ref.out" 2>&1 || fail "uninterrupted run"
  dur_ms=$((($(date +%s%N) - t0) / 1000000))
  full=$(digest_of "$TMP/ref.out")
  [ -n "$full" ] || { fail "$1: no digest"; return; }
  echo "uninterrupted run: $dur_ms ms, $TRIALS trials"

  leftovers() { find "$1" -mindepth 1 \( -name '.step_*' -o -name 'latest.tmp.*' -o -name '*.old.*' \) | sort; }
  # the highest step with a complete directory (renamed into place = complete)
  highest() {
    find "$1" -mindepth 1 -maxdepth 1 -type d -name 'step_*' | while read -r d; do
      [ -f "$d/trainer_state.json" ] && basename "$d" | sed 's/^step_0*\([0-9]\+\).*/\1/; s/^$/0/'
    done | sort -n | tail -1
  }
  in_window=0; before_first=0; in_save=0; ok=0
  for ((i = 1; i <= TRIALS; i++)); do
    d="$TMP/$LABEL$i"
    sig=KILL; [ $((RANDOM % 2)) -eq 0 ] || sig=TERM # not in $(...): a subshell reseeds RANDOM
    delay_ms=$((dur_ms * (5 + RANDOM % 91) / 100)) # 5% .. 95% of the run
    "$DTRAIN" train "${RUN[@]}" "${EXTRA[@]}" --save "$d" >"$d.killed" 2>&1 &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    kill -s "$sig" $pid 2>/dev/null
    wait $pid 2>/dev/null # any exit status: the run may also have finished, or saved and stopped on TERM
    what="trial $i (SIG$sig at $delay_ms ms)"
    [ -n "$(leftovers "$d")" ] && in_save=$((in_save + 1)) # the kill interrupted a save
    if [ ! -e "$d/latest" ]; then
      # killed before its first save completed: nothing to resume, nothing complete may exist
      [ -z "$(highest "$d")" ] || { fail "$what: a step directory exists but no latest"; continue; }
      before_first=$((before_first + 1))
      "$DTRAIN" train "${RUN[@]}" "${EXTRA[@]}" --save "$d" --digest >"$d.out" 2>&1 || { fail "$what: fresh run: $(tail -1 "$d.out")"; continue; }
      resumed=0
    else
      name=$(cat "$d/latest")
      committed=$(echo "$name" | sed 's/^step_0*\([0-9]\+\).*/\1/; s/^$/0/')
      top=$(highest "$d")
      [ -f "$d/$name/trainer_state.json" ] && [ -f "$d/$name/model.safetensors" ] && [ -f "$d/$name/optimizer.safetensors" ] \
        || { fail "$what: latest '$name' is not a complete step directory"; continue; }
      # a kill between a step's rename into place and the update of latest (the commit
      # point) leaves that step complete but uncommitted: resume then starts one step back
      if [ "$top" = "$((committed + 1))" ]; then in_window=$((in_window + 1)); top=$committed; fi
      [ "$top" = "$committed" ] || { fail "$what: latest names step $committed, newest complete step is $top"; continue; }
      "$DTRAIN" train "${RUN[@]}" "${EXTRA[@]}" --save "$d" --resume "$d" --digest >"$d.out" 2>&1 \
        || { fail "$what: resume failed: $(tail -1 "$d.out")"; continue; }
      resumed=$(sed -n 's/^dtrain: resumed at step \([0-9]*\) from .*$/\1/p' "$d.out")
      [ "$resumed" = "$committed" ] || { fail "$what: resumed at step '$resumed', latest named $committed"; continue; }
    fi
    [ "$(digest_of "$d.out")" = "$full" ] || { fail "$what: digest after resume at step $resumed differs"; continue; }
    [ -z "$(leftovers "$d")" ] || { fail "$what: temporaries left: $(leftovers "$d" | tr '\n' ' ')"; continue; }
    # a resumed finished run saves step 24 again, as step_00000024.v2
    grep -q '^step_00000024' "$d/latest" || { fail "$what: latest is $(cat "$d/latest") after the run"; continue; }
    ok=$((ok + 1))
    echo "  $what: resumed at step $resumed, same digest, no temporaries"
    rm -rf "$d"
  done
  [ $ok -eq "$TRIALS" ] && pass "$LABEL: $ok/$TRIALS killed runs resumed to the uninterrupted digest ($in_save left a save's temporaries, $in_window fell between a step's rename and its latest update, $before_first came before the first save)"
}
trials k "$TRIALS"
OFF="$BUILD/kill-offload.$$" # the build directory's disk: O_DIRECT (/tmp may be tmpfs)
mkdir -p "$OFF"
trials offload $((TRIALS * 2 / 5)) --set offload.optimizer=nvme --set offload.nvme_path="$OFF" --set offload.block_mb=0.0625
rm -rf "$OFF"
finish
