# First use: what a new user runs into. The default validation file belongs to the
# default training file only (data.val=auto: PREFIX_train.bin -> PREFIX_val.bin); a
# missing default corpus names the key and how to make it; progress is plain lines under
# mpirun (ranks get a pseudo-terminal) unless log.progress=tty; --version; a "did you
# mean" for unknown keys; sample prints the continuation (not glued to the prompt) and
# takes --set; a BPE run without its encoder files fails at start, not after training.
source "$(dirname "$0")/lib.sh"
prepare_tiny
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CFG=(--config "$SRC/tests/data/tiny.json" --steps 2)
cp "$TMP/c_train.bin" "$TMP/x_train.bin"; cp "$TMP/c_val.bin" "$TMP/x_val.bin"; cp "$TMP/c_train.bin" "$TMP/y.bin"

# --- item 12: validation file ----------------------------------------------------------
"$DTRAIN" train "${CFG[@]}" --set "data.train=$TMP/x_train.bin" >"$TMP/o" 2>&1 || fail "x_train run"
grep -q "validation $TMP/x_val.bin" "$TMP/o" && pass "data.train=X_train.bin validates on its sibling X_val.bin" \
  || fail "auto val: $(grep validation "$TMP/o")"
"$DTRAIN" train "${CFG[@]}" --set "data.train=$TMP/y.bin" >"$TMP/o" 2>&1 || fail "y run"
grep -q "validation none" "$TMP/o" && ! grep -q "val_loss" "$TMP/o" \
  && pass "data.train without a sibling: no validation (not the demo's file)" || fail "no-sibling val: $(grep validation "$TMP/o")"
mkdir "$TMP/elsewhere"
(cd "$TMP/elsewhere" && "$DTRAIN" train --steps 1 >"$TMP/o" 2>"$TMP/e"); rc=$?
[ $rc -eq 2 ] && grep -q "error: data.train: the default corpus 'data/demo_train.bin' is not here.*make demo" "$TMP/e" \
  && pass "default corpus missing: $(cat "$TMP/e")" || fail "default corpus elsewhere: exit $rc: $(cat "$TMP/e")"
"$DTRAIN" train "${CFG[@]}" --set "data.train=$TMP/x_train.bin" --set "data.val=$TMP/nope.bin" >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "error: data.val: .*nope.bin" "$TMP/e" && pass "bad data.val names the key: $(cat "$TMP/e")" \
  || fail "bad data.val: exit $rc: $(cat "$TMP/e")"

# --- item 13: progress under mpirun ----------------------------------------------------
if command -v mpirun >/dev/null; then
  mpirun --oversubscribe -np 1 "$DTRAIN" train "${TINY[@]}" --steps 3 >"$TMP/o" 2>&1 || fail "mpirun run"
  [ "$(grep -c '^step [0-9]*/3 |' "$TMP/o")" -eq 3 ] && ! grep -q $'\r\|\e\[' "$TMP/o" \
    && pass "mpirun: plain progress lines (no carriage returns or escape codes)" || fail "mpirun progress: $(od -c "$TMP/o" | head -3)"
  mpirun --oversubscribe -np 1 "$DTRAIN" train "${TINY[@]}" --steps 3 --set log.progress=tty >"$TMP/o" 2>&1 || fail "tty run"
  grep -q $'\r' "$TMP/o" && pass "log.progress=tty forces the updating line" || fail "log.progress=tty ignored"
fi
"$DTRAIN" train "${TINY[@]}" --steps 3 --set log.progress=plain >"$TMP/o" 2>&1
[ "$(grep -c '^step [0-9]*/3 |' "$TMP/o")" -eq 3 ] && pass "log.progress=plain" || fail "plain progress"

# --- item 15 ----------------------------------------------------------------------------
v=$("$DTRAIN" --version) && [[ "$v" =~ ^dtrain\ [0-9]+\.[0-9]+\.[0-9]+ ]] && pass "--version: $v" || fail "--version: '$v'"
"$DTRAIN" train "${CFG[@]}" --set model.nlayer=3 >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown config key 'model.nlayer' (did you mean 'model.n_layer'?)" "$TMP/e" \
  && pass "did you mean (--set): $(cat "$TMP/e")" || fail "did-you-mean --set: $(cat "$TMP/e")"
echo '{"trian": {"steps": 3}}' >"$TMP/typo.json"
"$DTRAIN" train --config "$TMP/typo.json" >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "did you mean 'train" "$TMP/e" && pass "did you mean (config file): $(cat "$TMP/e")" \
  || fail "did-you-mean config: $(cat "$TMP/e")"
"$DTRAIN" config --set log.evry=3 >/dev/null 2>"$TMP/e"
grep -q "did you mean 'log.every'" "$TMP/e" && pass "did you mean (config command)" || fail "did-you-mean config cmd: $(cat "$TMP/e")"
# sample: the continuation only; --echo puts the prompt first; --set reaches the config
"$DTRAIN" train "${TINY[@]}" --steps 5 --save "$TMP/ck" >/dev/null 2>&1 || fail "train for sample"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "PROMPT" --length 20 --temperature 0 >"$TMP/s1" 2>&1 || fail "sample"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "PROMPT" --length 20 --temperature 0 --echo >"$TMP/s2" 2>&1 || fail "sample --echo"
! grep -q PROMPT "$TMP/s1" && [ "$(cat "$TMP/s2")" = "PROMPT$(cat "$TMP/s1")" ] \
  && pass "sample prints the continuation; --echo = prompt + the same continuation" || fail "sample output: $(head -c 200 "$TMP/s1")"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt x --length 2 --set data.tokenizer=gpt2 >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "data.tokenizer" "$TMP/e" && pass "sample --set reaches the config (shape keys refused): $(cat "$TMP/e")" \
  || fail "sample --set: exit $rc: $(cat "$TMP/e")"
# a BPE run without encoder files fails before training
"$DTRAIN" train "${TINY[@]}" --steps 3 --set model.vocab_size=50257 --set data.tokenizer=gpt2 --set log.sample_tokens=8 \
  >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && ! grep -q "^step" "$TMP/o" && grep -q "data.encoder_json" "$TMP/e" \
  && pass "BPE without encoder files fails at start: $(cat "$TMP/e")" || fail "BPE at start: exit $rc: $(cat "$TMP/e")"
# item 11: the demo (the built-in default) is sized for about two minutes on a 2-core
# machine: its training compute, 6 x parameters x tokens, stays under 12 TFLOP (it was 41)
"$DTRAIN" config >"$TMP/default.json" && "$DTRAIN" estimate -n 1 --json >"$TMP/est.json" || fail "config/estimate"
python3 - "$TMP/default.json" "$TMP/est.json" <<'PY' && pass "demo compute budget: $(python3 -c 'print(open("/dev/stdin").read())' <"$TMP/budget")" \
  || fail "demo compute budget exceeded: $(cat "$TMP/budget")"
import json, sys
c, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
t = c["train"]
seq = t["seq_len"] or c["model"]["seq_len"]
gb = t["global_batch"] or t["micro_batch"]
tflop = 6 * e["psi"] * t["steps"] * gb * seq / 1e12
open(sys.argv[1].replace("default.json", "budget"), "w").write("%.1f TFLOP (%d steps x %d x %d tokens, %.2fM parameters)" % (tflop, t["steps"], gb, seq, e["psi"] / 1e6))
assert tflop < 12, tflop
PY
# the ready-made configs in configs/ are valid, and the small ones train
for f in "$SRC"/configs/*.json; do
  "$DTRAIN" config --config "$f" >/dev/null 2>"$TMP/e" && pass "configs/$(basename "$f") is valid" \
    || fail "configs/$(basename "$f"): $(cat "$TMP/e")"
done
for f in demo dp; do
  (cd "$TMP" && "$DTRAIN" train --config "$SRC/configs/$f.json" --set "data.train=$TMP/c_train.bin" --set "data.val=$TMP/c_val.bin" \
    --set train.stop_after=2 --set "checkpoint.dir=$TMP/run_$f" --set log.metrics= >"$TMP/o" 2>&1) \
    && [ -f "$TMP/run_$f/latest" ] && pass "configs/$f.json trains (2 steps, saved)" || fail "configs/$f.json: $(tail -1 "$TMP/o")"
done
finish
