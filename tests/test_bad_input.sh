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
expect_bad "unsupported backend" "backend" train "${T[@]}" --set backend=cuda
expect_bad "tp without ranks" "tp" train "${T[@]}" --set parallel.tp=2
finish
