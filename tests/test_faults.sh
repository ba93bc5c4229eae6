# Faults that used to lose work silently or hang: a metrics file that cannot be written
# is reported (exit 1, not a 0-byte file and exit 0); a model that cannot fit is refused
# before allocating, naming both figures and the key that overrides; an allocation
# failing on one rank only ends every rank (no hang) with one error line; the metrics
# file holds valid JSON (null, never nan) even when a resumed run has nothing to do.
source "$(dirname "$0")/lib.sh"
prepare_tiny
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RUN=("${TINY[@]}" --steps 3 --threads 1)

# --- item 8: metrics on a full disk ---------------------------------------------------
if [ -w /dev/full ]; then
  "$DTRAIN" train "${RUN[@]}" --metrics /dev/full >"$TMP/o" 2>"$TMP/e"; rc=$?
  [ $rc -eq 1 ] && grep -q "warning: metrics file '/dev/full': write failed at step 1 (No space left on device)" "$TMP/e" \
    && grep -q "error: metrics file '/dev/full'" "$TMP/e" && grep -q "^step 3/3" "$TMP/o" \
    && pass "metrics on a full disk: warned, trained to the end, exit 1: $(tail -1 "$TMP/e")" \
    || fail "metrics on /dev/full: exit $rc: $(cat "$TMP/e")"
fi

# --- item 10: a model that cannot fit ------------------------------------------------
"$DTRAIN" train "${RUN[@]}" --set model.n_layer=12 --set model.n_embd=4096 --set model.n_head=32 >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/e")" -eq 1 ] && grep -Eq "needs an estimated [0-9.]+ GB.*only [0-9.]+ GB is available" "$TMP/e" \
  && grep -q "train.check_memory=false" "$TMP/e" && pass "12 x 4096 refused at start: $(cat "$TMP/e")" \
  || fail "memory check: exit $rc: $(cat "$TMP/e")"
# the figure is the estimator's (per rank, times the ranks on this node)
est=$("$DTRAIN" estimate "${RUN[@]}" --set model.n_layer=12 --set model.n_embd=4096 --set model.n_head=32 2>&1 | grep -io "total[^0-9]*[0-9.]* GB" | head -1)
[ -n "$est" ] && pass "dtrain estimate agrees: $est" || true

# --- item 14: metrics are strict JSON: a resumed run with nothing left to do ------------
"$DTRAIN" train "${RUN[@]}" --save "$TMP/ck" >/dev/null 2>&1 || fail "run to save"
"$DTRAIN" train --resume "$TMP/ck" --metrics "$TMP/m0.jsonl" >"$TMP/o" 2>&1 || fail "resume at the end: $(tail -1 "$TMP/o")"
python3 - "$TMP/m0.jsonl" <<'PY' && pass "nothing to train: summary has steps_run 0 and final_loss null (strict JSON)" \
  || fail "metrics of an empty resumed run: $(cat "$TMP/m0.jsonl")"
import json, sys
def strict(s):  # Python accepts NaN by default; JSON does not
    return json.loads(s, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
lines = [strict(l) for l in open(sys.argv[1])]
summ = [l for l in lines if l.get("event") == "summary"][-1]
assert summ["steps_run"] == 0 and summ["final_loss"] is None and summ["tokens_per_s"] is None, summ
assert not [l for l in lines if "event" not in l], lines
PY
grep -q "nothing to train" "$TMP/o" && pass "says nothing to train" || fail "no 'nothing to train' note: $(tail -2 "$TMP/o")"

# --- item 9: an allocation failing on one rank ends every rank ---------------------------
# DT_TEST_FAIL_ALLOC=WHAT@RANK (src/core/mem.c) fails the allocation named WHAT on RANK (ZeRO-3
# initialises and loads one unit at a time through "load buffer (one unit)", no longer the
# whole model's "full parameters")
if command -v mpirun >/dev/null; then
  Z3=(--set parallel.zero=3 --set parallel.determinism=bitwise)
  cases=(
    "activations@1|${Z3[*]}" "AdamW second moments (shard)@1|${Z3[*]}" "parameter shard@1|${Z3[*]}"
    "load buffer (one unit)@1|${Z3[*]}" "save buffer (one unit)@1|${Z3[*]}" "bitwise head gradient@1|${Z3[*]}"
    "full optimizer state@1|${Z3[*]} --set checkpoint.async=true"
    "bitwise reduction@1|${Z3[*]}" "bitwise exchange buffer@1|${Z3[*]}" "token file@1|${Z3[*]}"
    "gradient shard@1|--set parallel.zero=2" "reduce-scatter buffer@1|--set parallel.zero=2"
    "save buffer (one unit)@0|--set parallel.zero=2" "parameters@1|--set parallel.zero=0"
    "AdamW first moments@1|--set parallel.zero=0" "parameters@0|--set parallel.dp_mode=ps"
    "AdamW second moments@0|--set parallel.dp_mode=ps"
  )
  for c in "${cases[@]}"; do
    what=${c%%|*}; read -ra cfg <<<"${c#*|}"
    rm -rf "$TMP/ckf"
    DT_TEST_FAIL_ALLOC="$what" timeout 60 mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 "$DTRAIN" train \
      "${RUN[@]}" "${cfg[@]}" --save "$TMP/ckf" >"$TMP/o" 2>"$TMP/e"; rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'dtrain: error' "$TMP/e")" -eq 1 ] \
      && grep -q "dtrain: error: .*out of memory allocating [0-9]* bytes for ${what%@*} (injected" "$TMP/e" \
      && pass "$what (${cfg[*]}): every rank ends, exit $rc, one line" \
      || fail "$what (${cfg[*]}): exit $rc$([ $rc -eq 124 ] && echo ' (hang)'): $(grep -v '^-\|^$' "$TMP/e" | head -3)"
  done
fi
finish
