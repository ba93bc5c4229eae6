# Issue 23 item 8: cases that used to pass in silence. (a) token files record their
# tokenizer and train checks it (a file without the record, llm.c's, is accepted, with a
# warning when its ids stay far below the vocabulary); (b) a new epoch is announced, on the
# console and in the metrics, at the same step when resumed; (c) fortune's "%" lines are
# rewritten only with --fortune; (d) the byte tokenizer separates files; (e) the header
# names train.init_from.
source "$(dirname "$0")/lib.sh"
prepare_tiny
T1=(--threads 1 --set log.sample_tokens=0)

# (a) byte data with GPT-2's vocabulary, or GPT-2's tokenizer: exit 2 naming the file and both
"$DTRAIN" train "${TINY[@]}" "${T1[@]}" --steps 1 --set model.vocab_size=50257 >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/e")" -eq 1 ] && grep -q "c_train.bin' was made by the byte tokenizer (vocab 256)" "$TMP/e" &&
  grep -q "data.tokenizer byte and model.vocab_size 50257" "$TMP/e" && ! grep -q "^step" "$TMP/o" &&
  pass "byte data, vocab 50257: $(cat "$TMP/e")" || fail "byte data, vocab 50257: rc $rc: $(cat "$TMP/e")"
"$DTRAIN" train "${TINY[@]}" "${T1[@]}" --steps 1 --set model.vocab_size=50257 --set data.tokenizer=gpt2 >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "made by the byte tokenizer (vocab 256), but this run has data.tokenizer gpt2" "$TMP/e" &&
  pass "byte data, tokenizer gpt2: exit 2" || fail "byte data, tokenizer gpt2: rc $rc: $(cat "$TMP/e")"
# the validation file is checked too
"$DTRAIN" prepare --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/v" --val-fraction 0.1 >/dev/null &&
  python3 - "$TMP/v_val.bin" <<'PY' || fail "rewrite the record"
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[12:20] = b"gpt2\0\0\0\0"; open(p, "wb").write(b)
PY
"$DTRAIN" train "${TINY[@]}" "${T1[@]}" --steps 1 --set data.val="$TMP/v_val.bin" >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "^dtrain: error: data.val: '$TMP/v_val.bin' was made by the gpt2 tokenizer" "$TMP/e" &&
  pass "data.val checked: $(cat "$TMP/e")" || fail "data.val: rc $rc: $(cat "$TMP/e")"
# llm.c's files (no record): accepted; a one-line warning when the ids stay below a quarter of the vocabulary
python3 - "$TMP/c_train.bin" "$TMP/llmc_train.bin" <<'PY' || fail "llm.c file"
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[12:24] = bytes(12); open(sys.argv[2], "wb").write(b)
PY
"$DTRAIN" train "${TINY[@]}" "${T1[@]}" --steps 1 --set data.train="$TMP/llmc_train.bin" --set data.val= \
  --set model.vocab_size=50257 >"$TMP/o" 2>&1; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "^dtrain: warning: data.train: '$TMP/llmc_train.bin' records no tokenizer" "$TMP/o")" -eq 1 ] &&
  grep -q "largest token id [0-9]* is far below model.vocab_size 50257" "$TMP/o" && grep -q "^step 1/1" "$TMP/o" &&
  pass "llm.c file, vocab 50257: trains, $(grep warning "$TMP/o")" || fail "llm.c file: rc $rc: $(head -3 "$TMP/o")"
"$DTRAIN" train "${TINY[@]}" "${T1[@]}" --steps 1 --set data.train="$TMP/llmc_train.bin" --set data.val= >"$TMP/o" 2>&1; rc=$?
[ $rc -eq 0 ] && ! grep -q "warning" "$TMP/o" && pass "llm.c file, vocab 300: no warning" ||
  fail "llm.c file, vocab 300: rc $rc: $(grep warning "$TMP/o")"

# (b) 35,813 tokens = 1,119 windows of 32 = 139 batches of 8: epoch 2 begins at step 140,
# in the straight run and in one resumed at step 139
RUN=("${TINY[@]}" "${T1[@]}" --steps 142 --set train.val_every=0)
"$DTRAIN" train "${RUN[@]}" --metrics "$TMP/ep.jsonl" >"$TMP/ep.out" 2>&1 || fail "epoch run: $(tail -2 "$TMP/ep.out")"
line="data: epoch 2 begins at step 140 (train file has 1119 windows of 32 tokens)"
[ "$(grep -c '^data: epoch' "$TMP/ep.out")" -eq 1 ] && grep -qF "$line" "$TMP/ep.out" &&
  [ "$(grep -c '"event": "epoch"' "$TMP/ep.jsonl")" -eq 1 ] && grep -q '^{"event": "epoch", "step": 140, "epoch": 2, "time": [0-9.]*}$' "$TMP/ep.jsonl" &&
  pass "epoch: '$line' and $(grep '"epoch"' "$TMP/ep.jsonl")" || fail "epoch: $(grep -E 'epoch' "$TMP/ep.out" "$TMP/ep.jsonl")"
python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$TMP/ep.jsonl" \
  && pass "the metrics file with an epoch event is JSON Lines" || fail "epoch metrics are not JSON Lines"
"$DTRAIN" train "${RUN[@]}" --set train.stop_after=139 --save "$TMP/epck" >"$TMP/ep1.out" 2>&1 &&
  "$DTRAIN" train "${RUN[@]}" --resume "$TMP/epck" --metrics "$TMP/ep2.jsonl" >"$TMP/ep2.out" 2>&1 || fail "epoch resume runs"
! grep -q '^data: epoch' "$TMP/ep1.out" && grep -qF "$line" "$TMP/ep2.out" &&
  grep -q '^{"event": "epoch", "step": 140, "epoch": 2, "time": [0-9.]*}$' "$TMP/ep2.jsonl" &&
  pass "epoch: a run resumed at step 139 announces it at step 140 too" || fail "epoch resume: $(grep epoch "$TMP/ep2.out")"

# (c) "%" lines: kept by default, empty lines with --fortune; (d) each file (a document) ends
# with a newline where it does not end in one (byte tokenizer)
printf 'a\n%%\nb' >"$TMP/f1.txt"
printf 'c\n' >"$TMP/f2.txt"
printf 'd' >"$TMP/f3.txt"
tokens() { python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); n = int.from_bytes(d[8:12], "little"); print(repr(bytes(d[1024:1024 + 2 * n:2])))' "$1"; }
"$DTRAIN" prepare --input "$TMP/f1.txt" --input "$TMP/f2.txt" --input "$TMP/f3.txt" --out "$TMP/p" --val-fraction 0 >/dev/null &&
  got=$(tokens "$TMP/p_train.bin") && [ "$got" = "b'a\\n%\\nb\\nc\\nd\\n'" ] &&
  pass "prepare: % lines kept, a newline after a file (a document) without one, none after one ending in one: $got" ||
  fail "prepare plain: $got"
"$DTRAIN" prepare --fortune --input "$TMP/f1.txt" --input "$TMP/f2.txt" --out "$TMP/p" --val-fraction 0 >/dev/null &&
  got=$(tokens "$TMP/p_train.bin") && [ "$got" = "b'a\\n\\nb\\nc\\n'" ] && pass "prepare --fortune: % lines emptied: $got" ||
  fail "prepare --fortune: $got"
grep -q -- '"$dtrain" prepare --fortune' "$SRC/scripts/demo.sh" && pass "make demo prepares fortunes with --fortune" ||
  fail "scripts/demo.sh does not pass --fortune"

# (e) the header names the weights train.init_from loads
"$DTRAIN" train "${TINY[@]}" "${T1[@]}" --steps 1 --set train.init_from="$TMP/epck/step_00000139/model.safetensors" \
  >"$TMP/init.out" 2>&1 && grep -qF "dtrain: weights from $TMP/epck/step_00000139/model.safetensors (train.init_from)" "$TMP/init.out" &&
  pass "header: $(grep 'init_from' "$TMP/init.out")" || fail "init_from header: $(head -5 "$TMP/init.out")"
finish
