# The save directory: a crash at every point of a save (DT_TEST_CRASH_AT, the test hook
# in src/ckpt) leaves `latest` naming a complete checkpoint that resumes to the digest of
# a straight run; temporaries of dead saves are removed by the next run, a live
# process's are kept; a fresh run into a used directory is refused (exit 2, one line,
# directory untouched) unless --overwrite; checkpoint.keep_last keeps the K newest.
source "$(dirname "$0")/lib.sh"
prepare_tiny
RUN=("${TINY[@]}" --steps 20)
"$DTRAIN" train "${RUN[@]}" --digest >"$TMP/full.out" 2>&1 || fail "straight run"
full=$(digest_of "$TMP/full.out")
[ -n "$full" ] || fail "no digest"

leftovers() { find "$1" -mindepth 1 \( -name '.step_*' -o -name 'latest.tmp.*' -o -name '*.old.*' \) | sort; }
# complete DIR: latest names a directory with all three files
complete() {
  local d="$1/$(cat "$1/latest" 2>/dev/null)"
  [ -f "$d/trainer_state.json" ] && [ -f "$d/model.safetensors" ] && [ -f "$d/optimizer.safetensors" ]
}
# resume_check DIR STEP LABEL: resuming DIR starts at STEP and ends at the straight digest, leaving no temporaries
resume_check() {
  "$DTRAIN" train "${RUN[@]}" --resume "$1" --save "$1" --digest >"$TMP/r.out" 2>&1 || { fail "$3: resume failed: $(tail -1 "$TMP/r.out")"; return; }
  grep -q "resumed at step $2 from " "$TMP/r.out" || { fail "$3: did not resume at step $2"; return; }
  [ "$(digest_of "$TMP/r.out")" = "$full" ] || { fail "$3: digest differs from the straight run"; return; }
  [ -z "$(leftovers "$1")" ] || { fail "$3: temporaries left: $(leftovers "$1")"; return; }
  pass "$3: resumes at step $2 to the straight digest, no temporaries left"
}

# --- 1. crash points of a save: of a new step, and of a step that already exists ------
"$DTRAIN" train "${RUN[@]}" --set train.stop_after=10 --save "$TMP/base" --save-every 5 >/dev/null 2>&1 || fail "base run"
for point in tmp renamed latest_tmp latest retire; do
  # new step 10 after step 5 ("retire" does not happen for a new step: no crash, latest = 10)
  rm -rf "$TMP/n"
  DT_TEST_CRASH_AT=$point:10 "$DTRAIN" train "${RUN[@]}" --set train.stop_after=10 --save "$TMP/n" --save-every 5 \
    >"$TMP/n.out" 2>&1
  rc=$?
  want=5; case $point in latest) want=10 ;; retire) want=10 ;; esac
  [ "$point" = retire ] && exp=0 || exp=99
  [ $rc -eq $exp ] || fail "new step, crash at $point: exit $rc, expected $exp"
  [ "$(cat "$TMP/n/latest")" = "$(printf 'step_%08d' $want)" ] && complete "$TMP/n" \
    || fail "new step, crash at $point: latest is '$(cat "$TMP/n/latest" 2>/dev/null)', expected a complete step $want"
  resume_check "$TMP/n" $want "new step, crash at $point"
  # overwrite step 10: resume from step 5 inside the same directory, save step 10 again
  rm -rf "$TMP/o"; cp -a "$TMP/base" "$TMP/o"
  DT_TEST_CRASH_AT=$point:10 "$DTRAIN" train "${RUN[@]}" --set train.stop_after=5 --resume "$TMP/o/step_00000005" \
    --save "$TMP/o" --save-every 5 >"$TMP/o.out" 2>&1
  rc=$?
  [ $rc -eq 99 ] || fail "overwrite, crash at $point: exit $rc, expected 99 (the test hook)"
  complete "$TMP/o" && grep -q "^step_00000010" "$TMP/o/latest" \
    || fail "overwrite, crash at $point: latest '$(cat "$TMP/o/latest" 2>/dev/null)' is not a complete step 10"
  resume_check "$TMP/o" 10 "overwrite, crash at $point"
  [ "$(find "$TMP/o" -maxdepth 1 -name 'step_00000010*' | wc -l)" -eq 1 ] || fail "overwrite, crash at $point: two copies of step 10"
done

# --- 2. leftovers of dead saves are removed, a live process's and others are kept ------
rm -rf "$TMP/s"
"$DTRAIN" train "${RUN[@]}" --set train.stop_after=5 --save "$TMP/s" >/dev/null 2>&1 || fail "stale: first run"
dead=$(bash -c 'echo $$')          # a process that has exited
sleep 60 & live=$!
for p in $dead $live; do
  mkdir "$TMP/s/.step_00000006.tmp.$p" "$TMP/s/.step_00000003.old.$p" "$TMP/s/.step_00000004.v2.old.$p"
  echo x >"$TMP/s/.step_00000006.tmp.$p/model.safetensors.tmp.$p"
  echo x >"$TMP/s/.step_00000003.old.$p/model.safetensors"
  echo step_00000006 >"$TMP/s/latest.tmp.$p"
done
mkdir "$TMP/s/.step_00000006.tmp.x1" "$TMP/s/.other.tmp.$dead" "$TMP/s/mine"
echo keep >"$TMP/s/notes.txt"; echo keep >"$TMP/s/latest.tmp.$dead.bak"; echo keep >"$TMP/s/.step_00000006.tmp.$dead.txt"
"$DTRAIN" train "${RUN[@]}" --set train.stop_after=2 --resume "$TMP/s" --save "$TMP/s" >"$TMP/s.out" 2>&1 || fail "stale: resume run"
got=$(cd "$TMP/s" && ls -A | sort | tr '\n' ' ')
want=$(printf '%s\n' ".other.tmp.$dead" .step_00000003.old.$live .step_00000004.v2.old.$live .step_00000006.tmp.$dead.txt \
  .step_00000006.tmp.$live .step_00000006.tmp.x1 latest latest.tmp.$dead.bak latest.tmp.$live mine notes.txt \
  step_00000005 step_00000007 | sort | tr '\n' ' ')
[ "$got" = "$want" ] && pass "dead saves' temporaries removed; a live process's and foreign names kept" \
  || fail "stale cleanup: have [$got], expected [$want]"
kill $live; wait $live 2>/dev/null

# --- 4. a fresh run into a used directory ----------------------------------------------
rm -rf "$TMP/u" "$TMP/other"
"$DTRAIN" train "${RUN[@]}" --set train.seed=7 --set train.stop_after=10 --save "$TMP/u" --save-every 3 >/dev/null 2>&1 \
  || fail "used: first run"
"$DTRAIN" train "${RUN[@]}" --set train.stop_after=4 --save "$TMP/other" >/dev/null 2>&1 || fail "used: other run"
snap() { (cd "$1" && find . | sort && find . -type f | sort | xargs sha256sum); }
before=$(snap "$TMP/u")
"$DTRAIN" train "${RUN[@]}" --save "$TMP/u" >"$TMP/u1.out" 2>"$TMP/u1.err"
rc=$?
echo "refused: $(cat "$TMP/u1.err")"
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/u1.err")" -eq 1 ] && grep -q "'$TMP/u'.*latest: step_00000010.*--overwrite" "$TMP/u1.err" \
  && pass "fresh run into a used directory: exit 2, one line naming it and its latest step" \
  || fail "fresh run into a used directory: exit $rc, stderr: $(cat "$TMP/u1.err")"
"$DTRAIN" train "${RUN[@]}" --resume "$TMP/other" --save "$TMP/u" >/dev/null 2>"$TMP/u2.err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/u2.err")" -eq 1 ] && pass "resuming another run into a used directory: exit 2" \
  || fail "resume of another run into a used directory: exit $rc"
[ "$before" = "$(snap "$TMP/u")" ] && pass "refused runs left the directory untouched" || fail "the used directory changed"
# --overwrite killed before its first save: the old run's checkpoints are still whole
DT_TEST_CRASH_AT=tmp:5 "$DTRAIN" train "${RUN[@]}" --save "$TMP/u" --save-every 5 --overwrite >/dev/null 2>&1
[ $? -eq 99 ] && [ "$(cat "$TMP/u/latest")" = step_00000010 ] && complete "$TMP/u" \
  && [ -d "$TMP/u/step_00000009" ] && pass "--overwrite killed before its first save: old checkpoints intact" \
  || fail "--overwrite killed before its first save"
"$DTRAIN" train "${RUN[@]}" --save "$TMP/u" --save-every 5 --overwrite --digest >"$TMP/u3.out" 2>&1 || fail "--overwrite run"
got=$(cd "$TMP/u" && ls -A | tr '\n' ' ')
[ "$(digest_of "$TMP/u3.out")" = "$full" ] && [ "$got" = "latest step_00000005 step_00000010 step_00000015 step_00000020 " ] \
  && [ "$(cat "$TMP/u/latest")" = step_00000020 ] && pass "--overwrite: the new run's steps only, straight digest" \
  || fail "--overwrite: have [$got]"
# resuming from inside the directory (an earlier step) needs no --overwrite
"$DTRAIN" train "${RUN[@]}" --resume "$TMP/u/step_00000015" --save "$TMP/u" --save-every 5 --digest >"$TMP/u4.out" 2>&1 \
  && [ "$(digest_of "$TMP/u4.out")" = "$full" ] && pass "resume from an earlier step of the same directory" \
  || fail "resume from an earlier step of the same directory: $(tail -1 "$TMP/u4.out")"

# --- keep_last -------------------------------------------------------------------------
rm -rf "$TMP/k"
"$DTRAIN" train "${RUN[@]}" --save "$TMP/k" --save-every 2 --set checkpoint.keep_last=3 --digest >"$TMP/k.out" 2>&1 \
  || fail "keep_last run"
got=$(cd "$TMP/k" && ls -A | tr '\n' ' ')
[ "$got" = "latest step_00000016 step_00000018 step_00000020 " ] && pass "keep_last=3 keeps the 3 newest steps" \
  || fail "keep_last=3: have [$got]"
"$DTRAIN" train "${RUN[@]}" --resume "$TMP/k/step_00000016" --set train.stop_after=1 --save "$TMP/k" \
  --set checkpoint.keep_last=1 >/dev/null 2>&1 || fail "keep_last resume"
got=$(cd "$TMP/k" && ls -A | tr '\n' ' ')
[ "$got" = "latest step_00000017 step_00000018 step_00000020 " ] && [ "$(cat "$TMP/k/latest")" = step_00000017 ] \
  && pass "keep_last counts back from latest; later steps of the resumed-over run stay" || fail "keep_last=1 after resume: have [$got]"
finish
