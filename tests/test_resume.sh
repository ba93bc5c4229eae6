# Resume parity: 10 steps + save + resume + 10 steps gives bitwise the weights of 20
# straight steps (same schedule: train.steps=20, the first run stops after 10).
source "$(dirname "$0")/lib.sh"
prepare_tiny
"$DTRAIN" train "${TINY[@]}" --steps 20 --digest --metrics "$TMP/full.jsonl" >"$TMP/full.out" 2>&1 || fail "full run"
"$DTRAIN" train "${TINY[@]}" --steps 20 --set train.stop_after=10 --save "$TMP/ck" --metrics "$TMP/a.jsonl" \
  >"$TMP/a.out" 2>&1 || fail "first half"
[ -f "$TMP/ck/step_00000010/model.safetensors" ] && grep -qx step_00000010 "$TMP/ck/latest" \
  && pass "checkpoint at step 10 with latest pointer" || fail "checkpoint layout"
"$DTRAIN" train "${TINY[@]}" --steps 20 --resume "$TMP/ck" --digest --metrics "$TMP/b.jsonl" >"$TMP/b.out" 2>&1 \
  || fail "second half"
full=$(digest_of "$TMP/full.out"); resumed=$(digest_of "$TMP/b.out")
echo "straight: $full"; echo "resumed:  $resumed"
[ -n "$full" ] && [ "$full" = "$resumed" ] && pass "digest after resume equals 20 straight steps" || fail "digest differs"
# per-step losses of the two halves equal the straight run's, bit for bit as printed
python3 - "$TMP/full.jsonl" "$TMP/a.jsonl" "$TMP/b.jsonl" <<'PY' && pass "losses of both halves match" || fail "loss curve differs"
import json, sys
def steps(p): return {o["step"]: o["loss"] for o in map(json.loads, open(p)) if "event" not in o}
full = steps(sys.argv[1]); halves = {**steps(sys.argv[2]), **steps(sys.argv[3])}
assert sorted(halves) == list(range(1, 21)), sorted(halves)
bad = [s for s in full if full[s] != halves[s]]
assert not bad, bad
PY
# resuming a finished run is a no-op that keeps the weights
"$DTRAIN" train "${TINY[@]}" --steps 20 --resume "$TMP/ck" --digest >"$TMP/c.out" 2>&1 || fail "resume finished run"
[ "$(digest_of "$TMP/c.out")" = "$full" ] && pass "resume of a finished run keeps weights" || fail "finished resume"
# sampling from the checkpoint is deterministic for a seed
s1=$("$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "The " --length 20 --seed 3)
s2=$("$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "The " --length 20 --seed 3)
[ -n "$s1" ] && [ "$s1" = "$s2" ] && pass "sample is deterministic" || fail "sample"
finish
