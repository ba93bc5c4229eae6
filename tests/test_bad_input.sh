# Bad input: each case must exit with code 2, print exactly one line on stderr that
# names the cause, and leave no files behind in the save directory.
source "$(dirname "$0")/lib.sh"
prepare_tiny
# expect_bad NAME PATTERN dtrain-args... : exit 2, one stderr line matching PATTERN
expect_bad() {
  local name="$1" pattern="$2"; shift 2
  rm -rf "$TMP/save"; mkdir -p "$TMP/save"
  "$DTRAIN" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne 2 ]; then fail "$name: exit $rc, want 2 ($(head -c 300 "$TMP/err"))"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines stderr lines, want 1"; cat "$TMP/err"; return; fi
  if ! grep -qiE "$pattern" "$TMP/err"; then fail "$name: message '$(cat "$TMP/err")' lacks /$pattern/"; return; fi
  if [ -n "$(ls -A "$TMP/save")" ]; then fail "$name: left files in the save dir: $(ls -A "$TMP/save")"; return; fi
  pass "$name: $(cat "$TMP/err")"
}
T=("${TINY[@]}" --steps 2 --save "$TMP/save")

echo '{"model": {"n_layer": 2,,}}' >"$TMP/malformed.json"
expect_bad "malformed JSON" "malformed JSON" train --config "$TMP/malformed.json"
echo '{"model": {"n_layers": 2}}' >"$TMP/unknown.json"
expect_bad "unknown key in file" "unknown config key 'model.n_layers'" train --config "$TMP/unknown.json"
expect_bad "unknown key in --set" "unknown config key 'train.nope'" train "${T[@]}" --set train.nope=1
expect_bad "out of range" "train.lr.*out of range" train "${T[@]}" --set train.lr=-1
expect_bad "wrong type" "model.n_layer.*integer" train "${T[@]}" --set model.n_layer=2.5
echo '{"model": {"n_layer": "two"}}' >"$TMP/type.json"
expect_bad "wrong JSON type" "n_layer.*string" train --config "$TMP/type.json"
expect_bad "n_embd % n_head" "n_embd.*divisible.*n_head" train "${T[@]}" --set model.n_head=3
expect_bad "seq_len > position table" "seq_len.*position table" train "${T[@]}" --set train.seq_len=64
expect_bad "missing data file" "nonexistent.bin" train "${T[@]}" --set data.train="$TMP/nonexistent.bin"
python3 - "$TMP" <<'PY'
import struct, sys
d = sys.argv[1]
def tokfile(path, tokens, magic=20240520, version=1, count=None, extra=b""):
    hdr = [0] * 256; hdr[0] = magic; hdr[1] = version; hdr[2] = len(tokens) if count is None else count
    open(path, "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens) + extra)
tokfile(d + "/short.bin", list(range(100)))
tokfile(d + "/magic.bin", list(range(100)), magic=1234)
tokfile(d + "/version.bin", list(range(100)), version=7)
tokfile(d + "/trunc.bin", list(range(100)), count=5000)
tokfile(d + "/vocab.bin", [1, 2, 299, 300, 3] * 200)
open(d + "/tiny.bin", "wb").write(b"\x00" * 10)
PY
expect_bad "too-short data file" "too short" train "${T[@]}" --set data.train="$TMP/short.bin"
expect_bad "bad magic" "magic" train "${T[@]}" --set data.train="$TMP/magic.bin"
expect_bad "bad version" "version" train "${T[@]}" --set data.train="$TMP/version.bin"
expect_bad "truncated token file" "trunc|short" train "${T[@]}" --set data.train="$TMP/trunc.bin"
expect_bad "header shorter than 1024 bytes" "tiny.bin" train "${T[@]}" --set data.train="$TMP/tiny.bin"
expect_bad "token outside vocabulary" "300" train "${T[@]}" --set data.train="$TMP/vocab.bin"

# corrupt safetensors, loaded as initial weights: start from a valid file
"$DTRAIN" train "${TINY[@]}" --steps 0 --save "$TMP/good" >/dev/null 2>&1 || fail "making a valid checkpoint"
GOOD="$TMP/good/step_00000000/model.safetensors"
python3 - "$GOOD" "$TMP" <<'PY'
import json, struct, sys
src, d = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
def write(name, header=None, body=data, hlen=None, rawhdr=None):
    hb = rawhdr if rawhdr is not None else json.dumps(header).encode()
    open(d + "/" + name, "wb").write(struct.pack("<Q", len(hb) if hlen is None else hlen) + hb + body)
open(d + "/truncated.safetensors", "wb").write(raw[:-1])
write("hlen.safetensors", hdr, hlen=1 << 40)
write("json.safetensors", rawhdr=b'{"wte.weight": {"dtype": ')
h = json.loads(json.dumps(hdr)); h["wpe.weight"]["dtype"] = "Q7"; write("dtype.safetensors", h)
h = json.loads(json.dumps(hdr)); h["wpe.weight"]["shape"] = [h["wpe.weight"]["shape"][0], 31]; write("shape.safetensors", h)
h = json.loads(json.dumps(hdr)); b, e = h["wpe.weight"]["data_offsets"]; h["ln_f.bias"]["data_offsets"] = [b, b + (h["ln_f.bias"]["data_offsets"][1] - h["ln_f.bias"]["data_offsets"][0])]; write("overlap.safetensors", h)
h = json.loads(json.dumps(hdr)); b, e = h["ln_f.bias"]["data_offsets"]; h["ln_f.bias"]["data_offsets"] = [len(data) + 64, len(data) + 64 + e - b]; write("outside.safetensors", h)
h = json.loads(json.dumps(hdr)); h["wpe.weight"]["dtype"] = "F16"; write("dtype_size.safetensors", h)
h = json.loads(json.dumps(hdr)); del h["ln_f.bias"]; write("missing.safetensors", h)
PY
expect_bad "truncated safetensors" "truncated.safetensors" train "${T[@]}" --set train.init_from="$TMP/truncated.safetensors"
expect_bad "safetensors header length" "header" train "${T[@]}" --set train.init_from="$TMP/hlen.safetensors"
expect_bad "safetensors header JSON" "JSON" train "${T[@]}" --set train.init_from="$TMP/json.safetensors"
expect_bad "safetensors dtype" "dtype" train "${T[@]}" --set train.init_from="$TMP/dtype.safetensors"
expect_bad "shape x dtype vs byte range" "shape|bytes|size" train "${T[@]}" --set train.init_from="$TMP/shape.safetensors"
expect_bad "dtype size vs byte range" "F16|bytes|size" train "${T[@]}" --set train.init_from="$TMP/dtype_size.safetensors"
expect_bad "overlapping offsets" "overlap" train "${T[@]}" --set train.init_from="$TMP/overlap.safetensors"
expect_bad "out-of-file offsets" "past|end|outside|beyond" train "${T[@]}" --set train.init_from="$TMP/outside.safetensors"
expect_bad "missing tensor" "ln_f.bias.*missing" train "${T[@]}" --set train.init_from="$TMP/missing.safetensors"
cp -r "$TMP/good" "$TMP/badresume"; cp "$TMP/truncated.safetensors" "$TMP/badresume/step_00000000/model.safetensors"
expect_bad "corrupt checkpoint on resume" "model.safetensors" train "${T[@]}" --resume "$TMP/badresume"
echo '{"step": 0' >"$TMP/badresume/step_00000000/trainer_state.json"
expect_bad "corrupt trainer state" "trainer_state" train "${T[@]}" --resume "$TMP/badresume"
expect_bad "resume from nothing" "latest|trainer_state" train "${T[@]}" --resume "$TMP/nothing"
expect_bad "shape mismatch with checkpoint" "wte.weight|shape" train "${T[@]}" --set model.n_embd=64 --set train.init_from="$GOOD"

# unwritable save dir: its parent is a regular file
touch "$TMP/afile"
expect_bad "unwritable save dir" "afile" train "${TINY[@]}" --steps 2 --save "$TMP/afile/ckpt"
expect_bad "unwritable metrics file" "metrics" train "${T[@]}" --metrics "$TMP/afile/m.jsonl"
# usage errors
expect_bad "unknown command" "unknown command" frobnicate
expect_bad "unknown option" "unknown option" train --bogus
expect_bad "missing option value" "needs a value" train --steps
expect_bad "sample without checkpoint" "checkpoint" sample --length 5
expect_bad "prepare missing input" "input" prepare --out "$TMP/x"
expect_bad "prepare unreadable input" "nope.txt" prepare --input "$TMP/nope.txt" --out "$TMP/x"
expect_bad "prepare gpt2 without its files" "needs --encoder-json FILE and --vocab-bpe FILE" prepare \
  --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/x" --tokenizer gpt2
expect_bad "prepare into a missing directory" "directory '$TMP/no/such' does not exist" prepare \
  --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/no/such/x"
expect_bad "prepare stray argument" "unexpected argument 'stray'" prepare --input "$SRC/tests/data/tiny_corpus.txt" \
  --out "$TMP/x" stray
expect_bad "prepare unknown last option" "unknown option '--bogus'" prepare --input "$SRC/tests/data/tiny_corpus.txt" \
  --out "$TMP/x" --bogus
expect_bad "unsupported backend" "backend" train "${T[@]}" --set backend=cuda
expect_bad "tp without ranks" "tp" train "${T[@]}" --set parallel.tp=2
# --- offload (docs/offload.md): the combinations it cannot mean, refused before anything runs
expect_bad "param offload without ZeRO-3" "offload.param cpu needs parallel.zero=3 .*parallel.zero is 0" \
  train "${T[@]}" --set offload.param=cpu
expect_bad "offload with the central rank" "offload.optimizer cpu, offload.param none: not with parallel.dp_mode ps" \
  train "${T[@]}" --set offload.optimizer=cpu --set parallel.dp_mode=ps
expect_bad "nvme offload without a directory" "offload.nvme_path is empty: set the directory for the offload files" \
  train "${T[@]}" --set offload.optimizer=nvme
expect_bad "nvme parameter offload without a directory" "offload.nvme_path is empty.*offload.param is nvme" \
  train "${T[@]}" --set offload.param=nvme --set parallel.zero=3
# --- issue 7 item 6: non-finite values in a checkpoint, named --------------------------
"$DTRAIN" train "${TINY[@]}" --steps 2 --save "$TMP/fin" >/dev/null 2>&1 || fail "making a checkpoint"
FIN="$TMP/fin/step_00000002"
# poke FILE TENSOR VALUE: overwrite element 3 of TENSOR with VALUE (nan, inf, -inf), its
# checksum updated to match (as a run that saved the value would have written it)
poke() {
  python3 - "$@" <<'PY'
import json, struct, sys, zlib
path, name, val = sys.argv[1], sys.argv[2], float(sys.argv[3])
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
b, e = json.loads(raw[8:8 + n])[name]["data_offsets"]
old = zlib.crc32(raw[8 + n + b:8 + n + e])
raw[8 + n + b + 12:8 + n + b + 16] = struct.pack("<f", val)
key = ('"crc32.%s":"%08x"' % (name, old)).encode()
at = raw.find(key, 8, 8 + n)
assert at > 0, "no checksum for " + name
raw[at:at + len(key)] = ('"crc32.%s":"%08x"' % (name, zlib.crc32(raw[8 + n + b:8 + n + e]))).encode()
open(path, "wb").write(raw)
PY
}
for case in "model.safetensors h.1.mlp.c_fc.weight nan NaN" "model.safetensors wte.weight inf infinity" \
            "optimizer.safetensors exp_avg_sq.ln_f.weight -inf infinity" "optimizer.safetensors exp_avg.h.0.attn.c_attn.bias nan NaN"; do
  read -r file tensor val word <<<"$case"
  rm -rf "$TMP/nf"; cp -r "$TMP/fin" "$TMP/nf"; poke "$TMP/nf/step_00000002/$file" "$tensor" "$val"
  expect_bad "$val in $tensor on resume" "tensor '$tensor' holds $word at element 3" train --resume "$TMP/nf" --steps 4 --save "$TMP/save"
done
rm -rf "$TMP/nf"; cp -r "$TMP/fin" "$TMP/nf"; poke "$TMP/nf/step_00000002/model.safetensors" h.0.ln_1.weight nan
expect_bad "NaN on sample" "h.0.ln_1.weight' holds NaN" sample --checkpoint "$TMP/nf" --length 3
expect_bad "NaN on export" "h.0.ln_1.weight' holds NaN" export "$TMP/nf" "$TMP/save/hf"
expect_bad "NaN on init_from" "h.0.ln_1.weight' holds NaN" train "${T[@]}" --set train.init_from="$TMP/nf/step_00000002/model.safetensors"

# --- tensors the model does not have: another model's file ------------------------------
"$DTRAIN" train "${TINY[@]}" --steps 0 --set model.n_layer=3 --save "$TMP/three" >/dev/null 2>&1 || fail "3-layer checkpoint"
expect_bad "3-layer weights into a 2-layer model" "tensor 'h.2.[a-z_.0-9]*' is not part of this model" \
  train "${T[@]}" --set train.init_from="$TMP/three/step_00000000/model.safetensors"
python3 - "$FIN/optimizer.safetensors" "$TMP/extra_opt.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
h["exp_avg.lm_head.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(data), len(data) + 4]}
hb = json.dumps(h).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + data + b"\0\0\0\0")
PY
rm -rf "$TMP/nf"; cp -r "$TMP/fin" "$TMP/nf"; cp "$TMP/extra_opt.safetensors" "$TMP/nf/step_00000002/optimizer.safetensors"
expect_bad "unknown tensor in the optimizer file" "tensor 'exp_avg.lm_head.weight' is not part of this model" \
  train --resume "$TMP/nf" --steps 4 --save "$TMP/save"

# --- item 7: files accepted that should not be -----------------------------------------
printf '{"train": {"steps": 3}}\n{"train": {"steps": 9}}\n' >"$TMP/two.json"
expect_bad "config with trailing JSON" "two.json.*unexpected text after the JSON object" train --config "$TMP/two.json"
printf '{"train": {"steps": 3}} x' >"$TMP/trail.json"
expect_bad "config with trailing bytes" "unexpected text after" train --config "$TMP/trail.json"
printf '{"train": {"steps": 3}}\0garbage' >"$TMP/nul.json"
expect_bad "config with a NUL byte" "NUL byte at offset 23" train --config "$TMP/nul.json"
printf '{"train": {"steps": 3}}  \n\n' >"$TMP/ws.json"
"$DTRAIN" config --config "$TMP/ws.json" >/dev/null 2>&1 && pass "trailing whitespace is fine" || fail "trailing whitespace refused"
for v in 1e3 0x10 2.5 " 7" 7x "" 99999999999999999999; do
  expect_bad "--set train.seed='$v'" "train.seed.*(not an integer|out of range)" train "${T[@]}" --set "train.seed=$v"
done
"$DTRAIN" config --set train.seed=9007199254740991 --set train.steps=+12 | python3 -c 'import json,sys; c=json.load(sys.stdin)["train"]; assert (c["seed"], c["steps"]) == (9007199254740991, 12), c' \
  && pass "signed decimal integers parse exactly" || fail "signed integers"
echo '{"train": {"seed": 2.5}}' >"$TMP/frac.json"
expect_bad "fractional integer in a config file" "train.seed' must be an integer" train --config "$TMP/frac.json"
# trainer_state.json
state_case() { # NAME PATTERN PYTHON-EXPR-ON-TEXT: rewrite the state file, expect a refusal
  rm -rf "$TMP/ts"; cp -r "$TMP/fin" "$TMP/ts"
  python3 - "$TMP/ts/step_00000002/trainer_state.json" "$3" <<'PY'
import json, sys
p = sys.argv[1]; t = open(p).read(); s = json.loads(t)
t = eval(sys.argv[2])
open(p, "w").write(t if isinstance(t, str) else json.dumps(t))
PY
  expect_bad "trainer state: $1" "$2" train --resume "$TMP/ts" --steps 4 --save "$TMP/save"
}
state_case "trailing bytes" "not one valid JSON object" 't + "{}"'
state_case "missing format" "format missing is not dtrain-checkpoint-v1" '{k: v for k, v in s.items() if k != "format"}'
state_case "unknown format" "format 'dtrain-checkpoint-v9'" 'dict(s, format="dtrain-checkpoint-v9")'
state_case "fractional step" "'step' = 2.5 is not an integer" 'dict(s, step=2.5)'
state_case "negative step" "'step' = -1 is not an integer" 'dict(s, step=-1)'
state_case "huge step" "'step' = .* is not an integer" 'dict(s, step=1e300)'
state_case "fractional data position" "'pos' = .* is not an integer" 'dict(s, data=dict(s["data"], pos=s["data"]["pos"] + 0.5))'
# prepare: a token file (or other binary) is not text
expect_bad "prepare a token file" "c_train.bin is a token file" prepare --input "$TMP/c_train.bin" --out "$TMP/save/x"
printf 'some text\0\1\2 binary' >"$TMP/bin.dat"
expect_bad "prepare binary input" "bin.dat is binary, not text" prepare --input "$TMP/bin.dat" --out "$TMP/save/x"
finish
