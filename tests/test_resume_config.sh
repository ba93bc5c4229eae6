# Resume restores the run: the configuration saved in the checkpoint (model, data,
# schedule, checkpoint and log settings) comes back without repeating any --set; --set
# may change what can change (steps, paths, layout) and is refused, exit 2 with one
# line naming the key, for what cannot (model shape, tokenizer). A changed
# learning-rate schedule is printed; the metrics file marks where the resumed run starts.
source "$(dirname "$0")/lib.sh"
prepare_tiny
cp "$TMP/c_train.bin" "$TMP/other_train.bin"
# a run that differs from the defaults and from tiny.json in model, data, schedule and seed
RUN=(--config "$SRC/tests/data/tiny.json" --set model.n_layer=3 --set model.n_head=4 --set "data.train=$TMP/other_train.bin"
     --set "data.val=$TMP/c_val.bin" --set train.lr=2e-3 --set train.warmup_steps=3 --set train.seed=9 --steps 12)
"$DTRAIN" train "${RUN[@]}" --digest >"$TMP/straight" 2>&1 || fail "straight run: $(tail -1 "$TMP/straight")"
"$DTRAIN" train "${RUN[@]}" --set train.stop_after=5 --save "$TMP/ck" >/dev/null 2>&1 || fail "first half"

# 1. --resume alone: the same model, data, schedule and seed; bitwise the straight run
"$DTRAIN" train --resume "$TMP/ck" --metrics "$TMP/m.jsonl" --digest >"$TMP/r" 2>&1 || fail "resume alone: $(tail -1 "$TMP/r")"
grep -q "GPT-2 3 layers, 4 heads" "$TMP/r" && grep -q "data $TMP/other_train.bin" "$TMP/r" \
  && pass "resume alone restores model and data: $(grep -o 'GPT-2 3 layers, 4 heads' "$TMP/r"), $(grep -o 'data [^ ]*' "$TMP/r" | head -1)" \
  || fail "resume alone: wrong model/data: $(head -3 "$TMP/r")"
[ -n "$(digest_of "$TMP/r")" ] && [ "$(digest_of "$TMP/r")" = "$(digest_of "$TMP/straight")" ] \
  && pass "resume alone = straight 12-step run (bitwise)" || fail "resume alone: digest differs"
! grep -q "schedule changed" "$TMP/r" && pass "unchanged schedule: no note" || fail "schedule note without a change"
[ "$(cat "$TMP/ck/latest")" = step_00000012 ] && pass "resume alone saves where the run saved (checkpoint.dir restored)" \
  || fail "checkpoint.dir not restored: latest $(cat "$TMP/ck/latest")"
CK5="$TMP/ck/step_00000005"

# 2. the metrics file marks the resume
python3 - "$TMP/m.jsonl" <<'PY' && pass "metrics: a resume event at step 5 before step 6" || fail "metrics resume marker"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines[0].get("event") == "resume" and lines[0]["step"] == 5 and lines[0]["from"].endswith("step_00000005"), lines[0]
assert lines[1]["step"] == 6, lines[1]
PY

# 3. what may change: steps (the schedule's length) is printed old -> new
"$DTRAIN" train --resume "$CK5" --steps 14 --set train.lr=1e-3 --save "$TMP/ck2" >"$TMP/r2" 2>&1 || fail "resume with new steps"
grep "learning-rate schedule changed on resume:" "$TMP/r2" | grep "train.lr 0.002 -> 0.001" | grep -q "train.steps 12 -> 14" \
  && pass "changed schedule printed: $(grep 'schedule changed' "$TMP/r2")" || fail "schedule note: $(head -5 "$TMP/r2")"
grep -q "summary: 9 steps (from 5)" "$TMP/r2" && pass "resume with --steps 14 trains to step 14" || fail "steps override"

# 4. what may not change: one line naming the key, exit 2, nothing trained
for kv in model.n_layer=2 model.n_head=2 model.n_embd=64 model.vocab_size=400 data.tokenizer=gpt2; do
  "$DTRAIN" train --resume "$CK5" --set "$kv" >"$TMP/o" 2>"$TMP/e"; rc=$?
  key=${kv%%=*}
  [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/e")" -eq 1 ] && grep -q "$key" "$TMP/e" && ! grep -q "^step" "$TMP/o" \
    && pass "resume with --set $kv refused: $(cat "$TMP/e")" || fail "resume --set $kv: exit $rc: $(cat "$TMP/e")"
done

# 5. a one-off setting of the first run is not carried over: stop_after ran 5 steps then,
# the resumed run goes to the end (above); a --save directory is kept
"$DTRAIN" config --resume "$CK5" >"$TMP/cfg.json" 2>&1 || fail "config --resume"
python3 - "$TMP/cfg.json" "$TMP" <<'PY' && pass "config --resume prints the restored config" || fail "config --resume: $(head -3 "$TMP/cfg.json")"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model"]["n_layer"] == 3 and c["train"]["seed"] == 9 and c["train"]["lr"] == 2e-3, c
assert c["data"]["train"] == sys.argv[2] + "/other_train.bin", c["data"]
assert c["train"]["stop_after"] == 0 and c["train"]["steps"] == 12, c["train"]
assert c["checkpoint"]["dir"] == sys.argv[2] + "/ck" and c["checkpoint"]["resume"].endswith("step_00000005"), c["checkpoint"]
PY

# 6. the global batch a run used is saved as it was (not as 0, "micro x dp"): a resume on
# another data-parallel size continues the same batches or says which key differs
"$DTRAIN" train "${TINY[@]}" --threads 1 --steps 3 --set train.global_batch=0 --set train.micro_batch=4 \
  --save "$TMP/gb" >/dev/null 2>&1 || fail "gb=0 run"
"$DTRAIN" config --resume "$TMP/gb" 2>/dev/null | grep -q '"global_batch":[[:space:]]*4' &&
  pass "train.global_batch 0 is saved as the batch it ran (4)" || fail "saved global batch: $("$DTRAIN" config --resume "$TMP/gb" 2>&1 | grep global_batch)"
out=$("$DTRAIN" train --resume "$TMP/gb" --steps 5 --threads 1 --set checkpoint.dir="$TMP/gb2" --set train.global_batch=8 2>&1)
[ $? -eq 2 ] && echo "$out" | grep -q "^dtrain: error: checkpoint .*another train.global_batch" &&
  pass "resume with another global batch names the key: $(echo "$out" | grep error)" || fail "global batch change: $out"
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  out=$(mpirun --oversubscribe -np 2 "$DTRAIN" train --resume "$TMP/gb" --steps 5 --threads 1 --set checkpoint.dir="$TMP/gb3" \
        --set train.micro_batch=2 2>&1)
  echo "$out" | grep -q "global batch 4 x .*micro-batch 2 x 2 data-parallel" && echo "$out" | grep -q "resumed at step 3" &&
    pass "a dp 1 run with global_batch 0 resumes on dp 2 with its batch of 4" || fail "dp 2 resume: $(echo "$out" | grep -v '^\[' | tail -3)"
fi
finish
