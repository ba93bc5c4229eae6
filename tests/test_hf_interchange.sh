# Hugging Face interchange for the Llama family (issue 28): a Hugging Face directory
# (config.json in Qwen2's keys, the weights in two safetensors shards with an index, as
# save_pretrained writes them) given as train.init_from sets the model keys itself and
# trains from the reference's loss, step for step (tests/reference/llama: the PyTorch
# reference's steps from the same weights, within 1e-5); the same weights in bf16 load
# (widened) and start within 1% of that loss; `dtrain export` of a Llama checkpoint loads
# back bit for bit (the same digest) with LlamaForCausalLM's config keys, and the reference
# fixtures' export is the tensors and config.json the PyTorch reference trained from to the
# same losses (tests/reference/regen.sh checks that with torch); config.json files of
# another family or option are one line, exit 2.
source "$(dirname "$0")/lib.sh"
ref="$SRC/tests/reference/llama"
"$DTRAIN" prepare --fortune --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/c" --val-fraction 0 >/dev/null ||
  fail "prepare"
# the fixture's weights as a Hugging Face directory: f32 shards, then bf16
python3 - "$ref/gqa2_untied_bias_init.safetensors" "$TMP/hf" "$TMP/hf16" <<'PY'
import json, os, struct, sys
src, out, out16 = sys.argv[1:4]
blob = open(src, "rb").read()
n = struct.unpack_from("<Q", blob)[0]
head = json.loads(blob[8:8 + n]); data = blob[8 + n:]
names = sorted(k for k in head if k != "__metadata__")
def write(path, items, bf16):  # returns the tensor bytes
    hdr, off, parts = {}, 0, []
    for name in items:
        info = head[name]; raw = data[info["data_offsets"][0]:info["data_offsets"][1]]
        if bf16:  # round to nearest even
            vals = struct.unpack("<%dI" % (len(raw) // 4), raw)
            raw = struct.pack("<%dH" % len(vals), *(((v + 0x7fff + ((v >> 16) & 1)) >> 16) & 0xffff for v in vals))
        hdr[name] = {"dtype": "BF16" if bf16 else "F32", "shape": info["shape"], "data_offsets": [off, off + len(raw)]}
        parts.append(raw); off += len(raw)
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(parts))
    return off
cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 300,
       "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "hidden_act": "silu",
       "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 4096, "torch_dtype": "float32"}
for d, bf16 in ((out, False), (out16, True)):
    os.makedirs(d)
    json.dump(cfg, open(d + "/config.json", "w"))
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    total = sum(write(d + "/" + fn, items, bf16) for fn, items in shards.items())
    json.dump({"metadata": {"total_size": total}, "weight_map": {n: fn for fn, items in shards.items() for n in items}},
              open(d + "/model.safetensors.index.json", "w"))
PY
# model keys set to another model on purpose: config.json must replace them
WRONG=(--set model.family=gpt2 --set model.n_layer=5 --set model.n_embd=64 --set model.qkv_bias=false)
"$DTRAIN" train --config "$ref/gqa2_untied_bias.json" --set data.train="$TMP/c_train.bin" --set data.val= \
  "${WRONG[@]}" --set train.init_from="$TMP/hf" --metrics "$TMP/hf.jsonl" >"$TMP/hf.out" 2>&1 ||
  fail "train from the Hugging Face directory: $(tail -1 "$TMP/hf.out")"
grep -q "Llama 2 layers, 4 heads (2 key/value), 32 wide" "$TMP/hf.out" && pass "config.json set the model keys" ||
  fail "the model keys: $(grep -m1 'layers' "$TMP/hf.out")"
python3 - "$ref/gqa2_untied_bias_expected.json" "$TMP/hf.jsonl" <<'PY' && pass "the reference's steps from the sharded directory" || fail "steps from the directory"
import json, sys
ref = json.load(open(sys.argv[1]))["steps"]
got = {r["step"]: r for r in map(json.loads, open(sys.argv[2])) if "event" not in r}
w = max(max(abs(got[s["step"]][k] - s[k]) / abs(s[k]) for k in ("loss", "grad_norm")) for s in ref)
print("max rel diff %.2e over %d steps" % (w, len(ref))); sys.exit(0 if w <= 1e-5 and len(got) == len(ref) else 1)
PY
"$DTRAIN" train --config "$ref/gqa2_untied_bias.json" --set data.train="$TMP/c_train.bin" --set data.val= \
  --set train.init_from="$TMP/hf16" --steps 1 --metrics "$TMP/hf16.jsonl" >"$TMP/hf16.out" 2>&1 ||
  fail "train from bf16 shards: $(tail -1 "$TMP/hf16.out")"
python3 - "$TMP/hf.jsonl" "$TMP/hf16.jsonl" <<'PY' && pass "bf16 shards: the first loss within 1%" || fail "bf16 shards"
import json, sys
a, b = (next(r for r in map(json.loads, open(p)) if "event" not in r)["loss"] for p in sys.argv[1:3])
print("first loss f32 %.6f, bf16 %.6f" % (a, b)); sys.exit(0 if abs(a - b) / a < 0.01 and a != b else 1)
PY

# export and back: the same weights, LlamaForCausalLM's keys
LL=(--config "$SRC/tests/data/tiny.json" --set data.train="$TMP/c_train.bin" --set data.val= --set model.family=llama
    --set model.n_head=4 --set model.n_kv_head=1 --set model.rope_factor=8 --set model.rope_original_max=16)
"$DTRAIN" train "${LL[@]}" --steps 3 --save "$TMP/ck" --digest >"$TMP/ck.out" 2>&1 || fail "train to export"
"$DTRAIN" export "$TMP/ck" "$TMP/exp" >"$TMP/exp.out" 2>&1 || fail "export: $(tail -1 "$TMP/exp.out")"
python3 - "$TMP/exp/config.json" <<'PY' && pass "export: LlamaForCausalLM config" || fail "export config"
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_key_value_heads": 1,
        "num_attention_heads": 4, "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False}
bad = {k: c.get(k) for k, v in want.items() if c.get(k) != v}
assert not bad and c["rope_scaling"]["rope_type"] == "llama3" and c["rope_scaling"]["factor"] == 8, (bad, c)
PY
"$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/c_train.bin" --set data.val= \
  --set train.init_from="$TMP/exp" --steps 0 --digest >"$TMP/back.out" 2>&1 || fail "init from the export"
[ -n "$(digest_of "$TMP/ck.out")" ] && [ "$(digest_of "$TMP/ck.out")" = "$(digest_of "$TMP/back.out")" ] &&
  pass "export -> init_from: the same weights" || fail "round trip: $(digest_of "$TMP/ck.out") vs $(digest_of "$TMP/back.out")"

# the reference fixtures' weights exported: the tensors as they were, and the config.json
# with which tests/reference/llama_reference.py --hf (reading it as transformers does)
# reproduced the reference's steps when the fixtures were made (tests/reference/regen.sh)
for c in gqa1_tied gqa2_untied_bias gqa4_scaled; do
  "$DTRAIN" train --config "$ref/$c.json" --set data.train="$TMP/c_train.bin" --set data.val= --steps 0 \
    --set train.init_from="$ref/${c}_init.safetensors" --save "$TMP/s_$c" >/dev/null 2>&1 || fail "$c: save"
  "$DTRAIN" export "$TMP/s_$c" "$TMP/x_$c" >/dev/null 2>&1 || fail "$c: export"
  python3 - "$TMP/x_$c" "$ref/${c}_init.safetensors" "$ref/${c}_export_config.json" <<'PY' && pass "$c: export = the reference's tensors and config.json" || fail "$c: export differs"
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack_from("<Q", b)[0]; h = json.loads(b[8:8 + n])
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
got, want = tensors(sys.argv[1] + "/model.safetensors"), tensors(sys.argv[2])
assert got == want, sorted(set(got) ^ set(want))[:4] or [k for k in got if got[k] != want[k]][:4]
cg, cw = json.load(open(sys.argv[1] + "/config.json")), json.load(open(sys.argv[3]))
assert cg == cw, {k: (cg.get(k), cw.get(k)) for k in set(cg) | set(cw) if cg.get(k) != cw.get(k)}
PY
done

# config.json of what dtrain does not have
bad() { # bad LABEL PATTERN PYTHON-EDIT
  local label=$1 pat=$2 edit=$3
  rm -rf "$TMP/bad"; cp -r "$TMP/hf" "$TMP/bad"
  python3 -c "import json; p='$TMP/bad/config.json'; c=json.load(open(p)); $edit; json.dump(c, open(p, 'w'))"
  "$DTRAIN" train --config "$ref/gqa2_untied_bias.json" --set data.train="$TMP/c_train.bin" --set data.val= \
    --set train.init_from="$TMP/bad" --steps 1 >"$TMP/bad.out" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/bad.out")" -eq 1 ] && grep -q "$pat" "$TMP/bad.out" && pass "$label: refused" ||
    fail "$label: rc $rc: $(tail -2 "$TMP/bad.out")"
}
bad "another family" "model_type 'bert'" "c['model_type'] = 'bert'"
bad "yarn rotary scaling" "rope_scaling type 'yarn'" "c['rope_scaling'] = {'rope_type': 'yarn', 'factor': 4}"
bad "a sliding window" "sliding_window" "c['use_sliding_window'] = True; c['sliding_window'] = 8"
bad "gelu" "hidden_act" "c['hidden_act'] = 'gelu'"
bad "kv heads not dividing heads" "n_kv_head" "c['num_key_value_heads'] = 3"
finish
