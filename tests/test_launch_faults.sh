# dtrain launch at the edges of recovery: no rank of a killed attempt outlives it (a rank
# stopped when its mpirun is SIGKILLed is gone before the restart, which ends on the
# straight run's weights with checkpoint.keep_last=1); a first save killed before its
# `latest` is resumed from; a rank that hangs before its first
# step is found by the start-up timeout and restarted; after SIGTERM a second SIGTERM kills
# a job whose save hangs, and so does --stop-timeout; SIGKILL of the launcher takes the job
# with it and the next launcher removes its heartbeat directory; hostfiles that mpirun
# rejects are exit 2 naming the line, and the launcher agrees with mpirun on each.
source "$(dirname "$0")/lib.sh"
need_mpi
L=("$DTRAIN_BIN" launch --mpi-arg --oversubscribe --mpi-arg --mca --mpi-arg mpi_yield_when_idle --mpi-arg 1
   --mpi-arg --mca --mpi-arg btl --mpi-arg self,vader --restart-delay 0)
prepare_tiny
RUN=("${TINY[@]}" --steps 10 --threads 1 --seed 1 --set train.micro_batch=1 --set train.global_batch=8
     --set train.val_every=0 --set log.sample_tokens=0 --digest)
LONG=("${TINY[@]}" --threads 1 --steps 1000000 --set train.val_every=0 --set log.every=1000000 --set comm.timeout=0)
JOBS=""
trap 'for p in $JOBS; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
# alive PID: a process that is not a zombie
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [ "${s%% *}" != Z ]; }
# wait_for FILE PATTERN SECONDS
wait_for() {
  local i
  for i in $(seq $(($3 * 20))); do grep -Eq "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
# beat_dir LAUNCHER_PID: its heartbeat directory
beat_dir() { ls -d /tmp/dtrain-beat."$1".* 2>/dev/null | head -1; }
# rank_pids DIR: the pids in the ranks' beat files
rank_pids() { cat "$1"/rank.* 2>/dev/null | awk '{print $4}' | sort -u | tr '\n' ' '; }
# wait_beats LAUNCHER_PID N STEP: until N ranks beat at least STEP (prints the directory)
wait_beats() {
  local i d
  for i in $(seq 1200); do
    d=$(beat_dir "$1")
    [ -n "$d" ] && [ "$(cat "$d"/rank.* 2>/dev/null | awk -v s="$3" '$1 == "step" && $2 >= s' | wc -l)" -ge "$2" ] &&
      { echo "$d"; return 0; }
    sleep 0.05
  done
  return 1
}
# bounded_wait PID SECONDS: its exit code once it ends, or 124 after SECONDS (then it is killed)
bounded_wait() {
  local i
  for i in $(seq $(($2 * 20))); do alive "$1" || { wait "$1"; return; }; sleep 0.05; done
  kill -KILL "$1"; wait "$1"; return 124
}
# children PID: its child processes
children() { local p; for p in /proc/[0-9]*; do [ "$(awk '{print $4}' "$p/stat" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"; done; }
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" >"$TMP/straight.out" 2>&1 || fail "straight run"
STRAIGHT=$(digest_of "$TMP/straight.out")

# 1. mpirun SIGKILLed while rank 1 is stopped (SIGSTOP: it cannot notice anything) with
# keep_last=1: the restart begins only after every rank of the first attempt is gone
DT_TEST_FAULT=stop:5:1 DT_TEST_FAULT_ONCE=$TMP/once1 "${L[@]}" -n 2 --heartbeat-timeout 600 -- train "${RUN[@]}" \
  --set comm.timeout=0 --save "$TMP/ck1" --save-every 2 --set checkpoint.keep_last=1 >"$TMP/orphan.out" 2>&1 &
lp=$!; JOBS="$JOBS $lp"
wait_for "$TMP/orphan.out" "test fault: rank 1 stops" 120
d=$(beat_dir $lp); old=$(rank_pids "$d"); mp=$(children $lp); JOBS="$JOBS $old"
kill -KILL $mp
# the moment the restart starts: which of the first attempt's ranks are alive
left="?"
for i in $(seq 1200); do
  if grep -q "^dtrain launch: restart 1" "$TMP/orphan.out"; then left=""; for p in $old; do alive $p && left="$left $p"; done; break; fi
  sleep 0.02
done
bounded_wait $lp 120; rc=$?
[ $rc -eq 0 ] && [ -n "$old" ] && [ -z "$left" ] && [ "$(digest_of "$TMP/orphan.out")" = "$STRAIGHT" ] &&
  pass "mpirun killed with rank 1 stopped: ranks $old gone before the restart; the straight run's weights ($STRAIGHT)" ||
  fail "orphans: rc $rc, first attempt's ranks '$old', alive at the restart: '$left': $(grep -E 'launch|digest' "$TMP/orphan.out")"
for p in $old; do kill -KILL $p 2>/dev/null; done

# the realistic race: mpirun SIGKILLed while the job trains and saves every step with
# keep_last=1 (the old ranks used to save and delete the step the restart loads). Should a
# fast machine still finish (and print a digest) before the kill lands, the restarted
# run's digest, the last one, is the one compared.
if full; then
  # 200 steps: long enough that the kill (after step 3 to 5) lands while the job runs
  "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --steps 200 >"$TMP/race.ref" 2>&1 || fail "straight run of 200 steps"
  for k in 1 2 3; do
    "${L[@]}" -n 2 -- train "${RUN[@]}" --steps 200 --save "$TMP/ck1$k" --save-every 1 --set checkpoint.keep_last=1 \
      >"$TMP/race$k.out" 2>&1 &
    lp=$!; JOBS="$JOBS $lp"
    for i in $(seq 1200); do
      [ "$(sed 's/.*step_0*//' "$TMP/ck1$k/latest" 2>/dev/null)" -ge $((k + 2)) ] 2>/dev/null && break; sleep 0.02
    done
    kill -KILL $(children $lp)
    wait $lp; rc=$?
    [ $rc -eq 0 ] && grep -q "^dtrain launch: restart 1" "$TMP/race$k.out" &&
      [ "$(digest_of "$TMP/race$k.out" | tail -1)" = "$(digest_of "$TMP/race.ref")" ] &&
      pass "mpirun killed after step $((k + 2)) (keep_last=1): restarted, the straight run's weights" ||
      fail "race $k: rc $rc: $(grep -E 'launch|error|digest' "$TMP/race$k.out") vs $(digest_of "$TMP/race.ref")"
  done
fi

# the first save killed after its step directory's rename, before `latest` (found by the
# chaos trial): the restart resumes from that step, not from step 0 into a directory that
# now holds checkpoints (which the job refuses, exit 2)
DT_TEST_CRASH_AT=renamed:2 timeout -k 5 120 "${L[@]}" -n 2 -- train "${RUN[@]}" --save "$TMP/ckr" --save-every 2 \
  >"$TMP/renamed.out" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -q "has no \`latest\` (a save was killed before committing it): resuming from its newest step, step_00000002" \
  "$TMP/renamed.out" && grep -q "resumed at step 2" "$TMP/renamed.out" && [ "$(digest_of "$TMP/renamed.out")" = "$STRAIGHT" ] &&
  pass "a first save killed before \`latest\`: resumed from step_00000002, the straight run's weights" ||
  fail "killed before latest: rc $rc: $(grep -E 'launch|error|digest' "$TMP/renamed.out")"

# 2. a rank that hangs before its first step: killed after the start-up timeout, restarted
# (a start takes longer under the sanitizers: the allowance must cover the restart's)
SU=4; full || SU=20
DT_TEST_FAULT=hang:start:1 DT_TEST_FAULT_ONCE=$TMP/once2 timeout -k 5 120 "${L[@]}" -n 2 --heartbeat-timeout 600 \
  --startup-timeout $SU -- train "${RUN[@]}" >"$TMP/startup.out" 2>&1; rc=$?
line=$(grep "no step within" "$TMP/startup.out")
[ $rc -eq 0 ] && echo "$line" | grep -Eq "no step within $SU s of the start \(--startup-timeout\): ranks? (0, )?1 started but finished no step" &&
  grep -q "^dtrain launch: restart 1" "$TMP/startup.out" && [ "$(digest_of "$TMP/startup.out")" = "$STRAIGHT" ] &&
  pass "a hang before the first step: ${line#dtrain launch: }; restarted, the straight run's weights" ||
  fail "start-up hang: rc $rc: $(grep -E 'launch|digest' "$TMP/startup.out")"

# 3. SIGTERM, then a save that never ends (rank 1 hangs): a second SIGTERM ends the job at once
hung_job() { # NAME EXTRA...: a job whose rank 1 hangs after step 3; its launcher's pid in lp
  local name=$1; shift
  DT_TEST_FAULT=hang:3:1 "${L[@]}" -n 2 --heartbeat-timeout 600 "$@" -- train "${LONG[@]}" --save "$TMP/ck$name" \
    --save-every 1000 >"$TMP/$name.out" 2>&1 &
  lp=$!; JOBS="$JOBS $lp"
}
hung_job term2
d=$(wait_beats $lp 1 3); pids="$(rank_pids "$d") $(children $lp)"; JOBS="$JOBS $pids"
kill -TERM $lp; sleep 2
still=0; alive $lp && still=1
t0=$(date +%s.%N); kill -TERM $lp; bounded_wait $lp 30; rc=$?; t1=$(date +%s.%N)
sleep 1; left=""; for p in $pids; do alive $p && left="$left $p"; done
[ $still -eq 1 ] && [ $rc -eq 143 ] && [ -z "$left" ] && awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 5) }' &&
  grep -q "SIGTERM again: killing the job at once" "$TMP/term2.out" &&
  pass "SIGTERM, a hung save, SIGTERM again: killed in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, exit 143, no process left" ||
  fail "second SIGTERM: alive after the first $still, rc $rc, left '$left': $(grep launch "$TMP/term2.out")"

# --stop-timeout: one SIGTERM, the save hangs: killed after 3 s
hung_job stopto --stop-timeout 3
d=$(wait_beats $lp 1 3); pids="$(rank_pids "$d") $(children $lp)"; JOBS="$JOBS $pids"
t0=$(date +%s.%N); kill -TERM $lp; bounded_wait $lp 30; rc=$?; t1=$(date +%s.%N)
sleep 1; left=""; for p in $pids; do alive $p && left="$left $p"; done
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
[ $rc -eq 143 ] && [ -z "$left" ] && awk -v t="$took" 'BEGIN { exit !(t >= 3 && t < 10) }' &&
  grep -q "has not stopped 3 s after SIGUSR1 (--stop-timeout): killing it" "$TMP/stopto.out" &&
  pass "--stop-timeout 3: the hung save killed after $took s, exit 143, no process left" ||
  fail "stop timeout: rc $rc, took $took, left '$left': $(grep launch "$TMP/stopto.out")"

# 4. SIGKILL of the launcher: mpirun and the ranks die with it; the next launcher removes
# the heartbeat directory it left
"${L[@]}" -n 2 --heartbeat-timeout 600 -- train "${LONG[@]}" >"$TMP/kill.out" 2>&1 &
lp=$!; JOBS="$JOBS $lp"
d=$(wait_beats $lp 2 2); pids="$(rank_pids "$d") $(children $lp)"; JOBS="$JOBS $pids"
kill -KILL $lp; wait $lp 2>/dev/null
left="$pids"
for i in $(seq 60); do left=""; for p in $pids; do alive $p && left="$left $p"; done; [ -z "$left" ] && break; sleep 0.05; done
[ -n "$d" ] && [ -z "$left" ] && [ "$(echo $pids | wc -w)" -eq 3 ] &&
  pass "launcher SIGKILLed: mpirun and both ranks ($pids) gone within $(awk -v i=$i 'BEGIN { print i * 0.05 }') s" ||
  fail "launcher SIGKILLed: job '$pids', still alive '$left' (dir '$d')"
for p in $left; do kill -KILL $p 2>/dev/null; done
[ -d "$d" ] || fail "the killed launcher's heartbeat directory $d should still be there"
"${L[@]}" -n 2 --heartbeat-timeout 600 -- train "${RUN[@]}" --steps 1 >"$TMP/next.out" 2>&1; rc=$?
[ $rc -eq 0 ] && [ ! -e "$d" ] && grep -q "removed $d (its launcher, pid $lp, is gone)" "$TMP/next.out" &&
  pass "the next launcher removed $d" || fail "stale directory: rc $rc, $(ls -d "$d" 2>&1): $(grep launch "$TMP/next.out")"

# 7. hostfiles: as mpirun reads them. Each case: the file's text (printf), the line the
# launcher names ("" when valid); mpirun on the same file must agree
hostfile_case() {
  printf "$1" >"$TMP/hosts"
  timeout 60 mpirun --oversubscribe --hostfile "$TMP/hosts" -np 1 true >"$TMP/mpirun.out" 2>&1
  local mrc=$? mpi=accepts
  { [ $mrc -ne 0 ] || grep -Eq "parse error|bad parameter" "$TMP/mpirun.out"; } && mpi=rejects
  out=$("${L[@]}" -n 2 --hostfile "$TMP/hosts" --wait-timeout 0 -- train "${RUN[@]}" --steps 1 2>&1); rc=$?
  local err; err=$(echo "$out" | grep "^dtrain: error")
  if [ -n "$2" ]; then
    [ $rc -eq 2 ] && [ $mpi = rejects ] && echo "$err" | grep -qF "hostfile '$TMP/hosts' $2" &&
      ! echo "$out" | grep -q "^dtrain launch: starting" &&
      pass "hostfile $(printf %q "$1"): exit 2, mpirun rejects it too: ${err#*hosts\' }" ||
      fail "hostfile $(printf %q "$1"): rc $rc, mpirun $mpi: $out"
  else
    [ $rc -eq 0 ] && [ $mpi = accepts ] && pass "hostfile $(printf %q "$1"): accepted, by mpirun too" ||
      fail "hostfile $(printf %q "$1"): rc $rc, mpirun $mpi: $out"
  fi
}
hostfile_case 'localhost slots=2\r\n' "line 1: a carriage return (Windows CRLF line endings)"
hostfile_case 'localhost slots=2abc\n' "line 1: slots needs '=' and a whole number"
hostfile_case '# hosts\nslots=2\n' "line 2: 'slots' before any host"
hostfile_case 'localhost\nlocalhost slots=2\n' "line 2: host 'localhost' given its slots twice"
hostfile_case 'localhost slots=2 # the last line\n# without a newline' "line 2: a comment needs a newline"
hostfile_case 'localhost slots = 2 # spaced\n'
if full; then
  hostfile_case 'localhost solts=2\n' "line 1: '=' after a word that is no key"
  hostfile_case '\n# hosts\n\tlocalhost\tslots=1\nlocalhost\n'
  hostfile_case 'localhost max_slots=2\n'
fi
finish
