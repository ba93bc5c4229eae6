# ZeRO saves stream the sharded state to rank 0's writer one unit at a time (issue 23,
# item 6): a ZeRO-3 save on 2 ranks adds less than half the model's bytes to any rank's
# peak RSS (gathering everything, as before, added three times them: weights and both
# moments); the streamed files are byte for byte those of the whole-gather path (an
# asynchronous save still gathers whole: its child writes a snapshot), by size shards
# too, for ZeRO 1, 2 and 3; a step-0 ZeRO-3 save is a single rank's ZeRO-0 save byte for
# byte; the streamed digest is that of the saved weights read back on one rank.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
RUN=("${TINY[@]}" --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8 --set train.val_every=0
     --set log.sample_tokens=0 --digest)
peak() { # METRICS: the largest peak_rss of any rank in the summary line
  grep -o '"peak_rss": [0-9]*' "$1" | awk '{ if ($2 > m) m = $2 } END { print m + 0 }'
}
if full; then # RSS is only meaningful without ASan's shadow memory and quarantine
  # 14.3M parameters (57 MB fp32) in 10 units, the largest 7 MB: the whole-model gather dominates
  BIG=("${TINY[@]}" --threads 1 --seed 1 --steps 1 --set model.n_layer=8 --set model.n_embd=384 --set model.n_head=6
       --set model.seq_len=16 --set train.micro_batch=1 --set train.global_batch=2 --set train.val_every=0
       --set log.sample_tokens=0 --set parallel.zero=3)
  "${MPI[@]}" -np 2 "$DTRAIN" train "${BIG[@]}" --metrics "$TMP/none.jsonl" >"$TMP/none.out" 2>&1 || fail "no-save run: $(tail -2 "$TMP/none.out")"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${BIG[@]}" --metrics "$TMP/save.jsonl" --save "$TMP/big" >"$TMP/save.out" 2>&1 ||
    fail "save run: $(tail -2 "$TMP/save.out")"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${BIG[@]}" --metrics "$TMP/async.jsonl" --save "$TMP/bigasync" \
    --set checkpoint.async=true >"$TMP/async.out" 2>&1 || fail "async save run: $(tail -2 "$TMP/async.out")"
  model=$(stat -c %s "$TMP/big/step_00000001/model.safetensors")
  extra=$(( $(peak "$TMP/save.jsonl") - $(peak "$TMP/none.jsonl") ))
  whole=$(( $(peak "$TMP/async.jsonl") - $(peak "$TMP/none.jsonl") ))
  msg="save adds $((extra / 1000000)) MB of peak RSS for a $((model / 1000000)) MB model (gathered whole, as an async save still does: $((whole / 1000000)) MB)"
  [ "$model" -gt 50000000 ] && [ "$extra" -lt $((model / 2)) ] && pass "ZeRO-3 save streams: $msg" || fail "ZeRO-3 save memory: $msg"
  for f in model optimizer; do
    cmp -s "$TMP/big/step_00000001/$f.safetensors" "$TMP/bigasync/step_00000001/$f.safetensors" || fail "big $f differs"
  done
fi
same_files() { # DIR_A DIR_B: every file of every saved step byte for byte
  local a b n=0
  for a in "$1"/step_*/*.safetensors* ; do
    b="$2/${a#"$1"/}"; n=$((n + 1))
    cmp -s "$a" "$b" || { echo "$b differs"; return 1; }
  done
  [ $n -gt 0 ] && echo "$n files"
}
for c in "zero1:1:0" "zero2:2:0" "zero3:3:0" "zero3_shards:3:0.05"; do
  IFS=: read -r name z mb <<<"$c"
  full || [ "$name" = zero3_shards ] || [ "$name" = zero1 ] || continue
  A=("${RUN[@]}" --steps 4 --save-every 2 --set parallel.zero=$z --set checkpoint.shard_mb=$mb)
  "${MPI[@]}" -np 2 "$DTRAIN" train "${A[@]}" --save "$TMP/$name" >"$TMP/$name.out" 2>&1 || fail "$name: $(tail -2 "$TMP/$name.out")"
  # the reference: an async save, its child held back while training goes on (a snapshot)
  DT_TEST_SAVE_DELAY_MS=300 "${MPI[@]}" -np 2 "$DTRAIN" train "${A[@]}" --save "$TMP/${name}a" --set checkpoint.async=true >/dev/null 2>&1 ||
    fail "$name async"
  r=$(same_files "$TMP/$name" "$TMP/${name}a") && pass "$name: streamed files = whole-gather files ($r)" || fail "$name: $r"
done
ls "$TMP/zero3_shards/step_00000004/" | grep -q 'model-00001-of' || fail "zero3_shards: no size shards"
# the digest, streamed, is the saved weights' (read back on one rank: nothing to train)
"$DTRAIN" train "${RUN[@]}" --steps 4 --resume "$TMP/zero3_shards" >"$TMP/back.out" 2>&1 || fail "read back"
d=$(digest_of "$TMP/zero3_shards.out")
[ -n "$d" ] && [ "$d" = "$(digest_of "$TMP/back.out")" ] && pass "ZeRO-3's streamed digest is the saved weights' ($d)" ||
  fail "digest: $d vs $(digest_of "$TMP/back.out")"
# step 0: ZeRO-3 on 2 ranks writes a single rank's ZeRO-0 files
"$DTRAIN" train "${RUN[@]}" --steps 0 --save "$TMP/s0" >/dev/null 2>&1 || fail "step-0 single"
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --steps 0 --set parallel.zero=3 --save "$TMP/z0" >/dev/null 2>&1 || fail "step-0 zero3"
r=$(same_files "$TMP/s0" "$TMP/z0") && pass "step 0: ZeRO-3 on 2 ranks = one rank's ZeRO-0 files ($r)" || fail "step 0: $r"
# a failed write: every rank exits 1 (none waits on a gather), latest stays on the last good step
DT_TEST_FAIL_AT=write:4 "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --steps 4 --save-every 2 --set parallel.zero=3 \
  --save "$TMP/bad" >"$TMP/bad.out" 2>&1; rc=$?
[ $rc -eq 1 ] && [ "$(cat "$TMP/bad/latest")" = step_00000002 ] && ! ls -a "$TMP/bad" | grep -q '\.tmp' &&
  pass "failed streamed write: exit 1, latest on step 2, no temporary" || fail "failed write: rc $rc: $(tail -2 "$TMP/bad.out")"
finish
