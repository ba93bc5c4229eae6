# precision: bf16 on the CPU (bf16 storage of activations, parameters and gradients,
# fp32 master weights, moments and arithmetic): the loss curve tracks fp32 within 2%,
# a bf16 run resumes bitwise (the checkpoint holds the fp32 master weights), the
# estimator counts bf16 state, and layouts bf16 does not run yet are refused.
source "$(dirname "$0")/lib.sh"
prepare_tiny
curves_loss() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
load = lambda p: {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "event" not in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print("max rel loss diff %.2e over %d steps" % (worst, len(a)))
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
PY
}
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/f32.jsonl" > "$TMP/f32.log" 2>&1 || fail "fp32 run"
"$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --set log.digest=true --metrics "$TMP/b16.jsonl" --save "$TMP/s" \
  > "$TMP/b16.log" 2>&1 || { cat "$TMP/b16.log"; fail "bf16 run"; }
r=$(curves_loss "$TMP/f32.jsonl" "$TMP/b16.jsonl" 0.02) && pass "bf16 loss vs fp32: $r" || fail "bf16 vs fp32: $r"
r=$(curves_loss "$TMP/f32.jsonl" "$TMP/b16.jsonl" 1e-7) && fail "bf16 equals fp32 exactly: not bf16 ($r)" ||
  pass "bf16 differs from fp32 (it is rounding)"
"$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --set train.stop_after=10 --save "$TMP/h" > /dev/null 2>&1 &&
  "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/h" --set log.digest=true > "$TMP/h.log" 2>&1 || fail "bf16 halves"
[ -n "$(digest_of "$TMP/b16.log")" ] && [ "$(digest_of "$TMP/b16.log")" = "$(digest_of "$TMP/h.log")" ] &&
  pass "bf16 resume is bitwise the straight run" || fail "bf16 resume: $(digest_of "$TMP/b16.log") vs $(digest_of "$TMP/h.log")"
grep -q "precision bf16\|bf16" "$TMP/h.log" && pass "resume keeps precision bf16" || fail "resume lost precision"
e=$("$DTRAIN" estimate --config "$SRC/tests/data/tiny.json" --set precision=bf16 2>&1)
echo "$e" | grep -q "bf16" && pass "estimate reports bf16 activations" || fail "estimate: $e"
out=$("$DTRAIN" train "${DP_RUN[@]}" --set precision=bf16 --set parallel.zero=1 2>&1)
[ $? -eq 2 ] && pass "bf16 + zero refused: $out" || fail "bf16 + zero: $out"
finish
