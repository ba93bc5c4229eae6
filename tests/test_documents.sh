# Documents on disk (issue 27, item 1; docs/config.md#token-files): `dtrain prepare` keeps each
# document's start and, for prompt/completion and chat data, a loss mask, in version 3
# token files; the formats text, fortune, jsonl (any field), prompt and chat; bad input
# (a line without the field, not JSON, invalid UTF-8, an empty document, no assistant
# turn) is one line naming the file and line, exit 2, nothing written; token files whose
# documents or mask disagree with their tokens, or whose ids exceed the vocabulary, are
# refused by train the same way; llm.c's version 1 files keep working, and the stream
# layout trains on a version 3 file exactly as on the version 1 file of the same tokens.
source "$(dirname "$0")/lib.sh"

# read FILE: the version, tokens, document starts and mask of a token file as JSON
read_tf() {
  python3 - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = struct.unpack("<256i", b[:1024])
ver, n = h[1], h[2]
if ver == 1:
    print(json.dumps({"version": 1, "tokens": list(struct.unpack("<%dH" % n, b[1024:1024 + 2 * n]))})); sys.exit()
w, nd, flags = h[6], h[7], h[8]
o = 1024
tok = list(struct.unpack("<%d%s" % (n, "H" if w == 2 else "I"), b[o:o + w * n])); o += w * n
starts = list(struct.unpack("<%dQ" % (nd + 1), b[o:o + 8 * (nd + 1)])); o += 8 * (nd + 1)
mask = list(b[o:o + n]) if flags & 1 else None
print(json.dumps({"version": 3, "tokens": tok, "starts": starts, "mask": mask}))
PY
}
# prep NAME FORMAT [ARGS...] < JSONL: prepare $TMP/NAME.jsonl (from stdin) with no val split
prep() {
  local name=$1 fmt=$2; shift 2
  cat >"$TMP/$name.jsonl"
  "$DTRAIN" prepare --format "$fmt" --input "$TMP/$name.jsonl" --out "$TMP/$name" --val-fraction 0 "$@" \
    >"$TMP/$name.out" 2>&1
}

# jsonl: a document per line, each ended by a newline (the byte tokenizer has no eot)
printf '%s\n' '{"text": "one"}' '' '{"text": "two\n", "id": 7}' '{"text": "three"}' | prep j jsonl
python3 - "$(read_tf "$TMP/j_train.bin")" <<'PY' && pass "jsonl: 3 documents (a blank line passed over), each ended by a newline, no mask" || fail "jsonl: $(cat "$TMP/j.out")"
import json, sys
f = json.loads(sys.argv[1])
assert f["version"] == 3 and bytes(f["tokens"]) == b"one\ntwo\nthree\n", f
assert f["starts"] == [0, 4, 8, 14] and f["mask"] is None, f
PY
printf '%s\n' '{"body": "x y"}' | prep f jsonl --field body
[ "$(read_tf "$TMP/f_train.bin" | python3 -c 'import json,sys; print(bytes(json.load(sys.stdin)["tokens"]).decode())')" = "x y" ] &&
  pass "jsonl --field body" || fail "jsonl --field: $(cat "$TMP/f.out")"

# a UTF-8 byte order mark before line 1 is not part of it
printf '\xef\xbb\xbf{"text": "bom"}\n' | prep bom jsonl
[ "$(read_tf "$TMP/bom_train.bin" | python3 -c 'import json,sys; print(bytes(json.load(sys.stdin)["tokens"]).decode())')" = "bom" ] &&
  pass "jsonl: a byte order mark before line 1 is skipped" || fail "jsonl with a BOM: $(cat "$TMP/bom.out")"

# prompt/completion: the prompt out of the loss, the completion and the document's end in it
printf '%s\n' '{"prompt": "Q: 2+2? ", "completion": "A: 4"}' '{"prompt": "Hi. ", "completion": "Hello.\n"}' |
  prep p prompt
python3 - "$(read_tf "$TMP/p_train.bin")" <<'PY' && pass "prompt: the prompt's tokens out of the loss, the completion's and the end in it" || fail "prompt: $(cat "$TMP/p.out")"
import json, sys
f = json.loads(sys.argv[1])
assert bytes(f["tokens"]) == b"Q: 2+2? A: 4\nHi. Hello.\n", f
assert f["starts"] == [0, 13, 24], f["starts"]
assert f["mask"] == [0] * 8 + [1] * 5 + [0] * 4 + [1] * 7, f["mask"]
PY

# chat: "<role>: <content>\n" per message, only the assistant's content and newline in the loss
printf '%s\n' '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}' |
  prep c chat
python3 - "$(read_tf "$TMP/c_train.bin")" <<'PY' && pass "chat: the assistant's content in the loss, the roles and other turns not" || fail "chat: $(cat "$TMP/c.out")"
import json, sys
f = json.loads(sys.argv[1])
text = b"system: Be brief.\nuser: Hi\nassistant: Hello\n"
assert bytes(f["tokens"]) == text, f
want = [0] * len(b"system: Be brief.\nuser: Hi\nassistant: ") + [1] * len(b"Hello\n")
assert f["mask"] == want and f["starts"] == [0, len(text)], f
PY

# the stream layout applies the loss mask: a step's loss counts the completions' targets only
python3 -c "
import json
for i in range(300): print(json.dumps({'prompt': 'Q%d: ' % i, 'completion': 'the answer is %d.' % (i * 7)}))" | prep big prompt
"$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/big_train.bin" --set data.val= --steps 2 \
  --threads 1 --metrics "$TMP/big.jsonl" >"$TMP/big.train" 2>&1 && python3 - "$TMP/big.jsonl" "$TMP/big_train.bin" <<'PY' &&
import json, struct, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"event"' not in l]
b = open(sys.argv[2], "rb").read()
h = struct.unpack("<256i", b[:1024]); n, nd = h[2], h[7]
mask = b[1024 + 2 * n + 8 * (nd + 1):]
frac = sum(mask) / len(mask)  # the share of targets in the loss over the file
per_step = 8 * 32  # tiny.json: global batch 8 x T 32
for x in r:
    assert 0 < x["loss_tokens"] < per_step and abs(x["loss_tokens"] / per_step - frac) < 0.25, (x, frac)
PY
  pass "train on a prompt file (stream): the loss mask applied (loss_tokens per step below the step's tokens, near the file's share)" ||
  fail "train on a prompt file: $(tail -3 "$TMP/big.train")"

# the stream layout: a version 3 file without a mask trains as the version 1 file of the same tokens
python3 - "$TMP/big_train.bin" "$TMP/big_v1.bin" "$TMP/big_nomask.bin" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
h = list(struct.unpack("<256i", b[:1024])); n, nd = h[2], h[7]
m = list(h); m[8] = 0
open(sys.argv[3], "wb").write(struct.pack("<256i", *m) + b[1024:1024 + 2 * n + 8 * (nd + 1)])
h[1] = 1; h[6] = h[7] = h[8] = 0
open(sys.argv[2], "wb").write(struct.pack("<256i", *h) + b[1024:1024 + 2 * n])
PY
a=$("$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/big_nomask.bin" --set data.val= --steps 4 --threads 1 --digest 2>&1 | grep -o 'digest sha256:[0-9a-f]*')
b=$("$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/big_v1.bin" --set data.val= --steps 4 --threads 1 --digest 2>&1 | grep -o 'digest sha256:[0-9a-f]*')
[ -n "$a" ] && [ "$a" = "$b" ] && pass "stream: a version 3 file trains as the version 1 file of its tokens (same weights)" ||
  fail "stream v3 vs v1: '$a' vs '$b'"

# bad input to prepare: one line naming the file and line, exit 2, nothing written
badprep() {
  local label=$1 pat=$2 fmt=$3; shift 3
  rm -f "$TMP/bad_train.bin" "$TMP/bad_val.bin"
  cat >"$TMP/bad.jsonl"
  "$DTRAIN" prepare --format "$fmt" --input "$TMP/bad.jsonl" --out "$TMP/bad" "$@" >"$TMP/bad.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/bad.out")" -eq 1 ] && grep -q -- "$pat" "$TMP/bad.out" &&
    [ ! -e "$TMP/bad_train.bin" ] && [ ! -e "$TMP/bad_val.bin" ] &&
    pass "prepare, $label: $(grep '^dtrain: error' "$TMP/bad.out")" || fail "prepare, $label: rc $rc: $(cat "$TMP/bad.out")"
}
badprep "a line without the field" 'bad.jsonl line 2: no "text"' jsonl < <(printf '%s\n' '{"text": "ok"}' '{"txt": "typo"}')
badprep "a field that is not a string" 'line 2: "text" is not a string' jsonl < <(printf '%s\n' '{"text": "ok"}' '{"text": 5}')
badprep "a line that is not JSON" 'line 2: not a JSON object' jsonl < <(printf '%s\n' '{"text": "ok"}' 'not json')
badprep "invalid UTF-8" 'line 2: invalid UTF-8' jsonl < <(printf '{"text": "ok"}\n{"text": "caf\xe9"}\n')
badprep "an empty document" 'line 2: an empty document' jsonl < <(printf '%s\n' '{"text": "ok"}' '{"text": ""}')
badprep "an empty completion" 'line 1: an empty completion' prompt < <(printf '%s\n' '{"prompt": "x", "completion": ""}')
badprep "chat without an assistant turn" 'line 1: no assistant' chat < <(printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}')
badprep "chat with an unknown role" 'role "robot"' chat < <(printf '%s\n' '{"messages": [{"role": "robot", "content": "hi"}]}')
badprep "a NUL byte past the first 64 KiB" 'line 2: a NUL byte' jsonl < <(python3 -c "
import sys; sys.stdout.write('{\"text\": \"' + 'x' * 70000 + '\"}\n{\"text\": \"a\x00b\"}\n')")
badprep "invalid UTF-8 in a text file" 'invalid UTF-8 at byte offset 3' text < <(printf 'caf\xe9 au lait\n')
badprep "--field with another format" '--field is for --format jsonl' prompt --field x < <(printf '%s\n' '{"text": "ok"}')

# bad token files: train refuses them, one line naming the file and the cause, exit 2
mk() { # NAME: a version 3 file from a python expression of (tokens, width, starts, mask, extra bytes)
  python3 - "$TMP/$1.bin" "$2" <<'PY'
import struct, sys
tok, width, starts, mask, extra = eval(sys.argv[2])
h = [0] * 256
h[0], h[1], h[2], h[6], h[7], h[8] = 20240520, 3, len(tok), width, len(starts) - 1, 1 if mask is not None else 0
b = struct.pack("<256i", *h) + struct.pack("<%d%s" % (len(tok), "H" if width == 2 else "I"), *tok)
b += struct.pack("<%dQ" % len(starts), *starts) + (bytes(mask) if mask is not None else b"") + extra
open(sys.argv[1], "wb").write(b)
PY
}
badfile() {
  local label=$1 pat=$2 name=$3
  "$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/$name.bin" --set data.val= --steps 1 \
    >"$TMP/bf.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/bf.out")" -eq 1 ] && grep -q "$name.bin" "$TMP/bf.out" &&
    grep -q "$pat" "$TMP/bf.out" && pass "token file, $label: $(grep '^dtrain: error' "$TMP/bf.out")" ||
    fail "token file, $label: rc $rc: $(cat "$TMP/bf.out")"
}
T=$(python3 -c "print(list(range(1, 201)))")
mk ok "($T, 2, [0, 100, 200], [1] * 200, b'')"
"$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/ok.bin" --set data.val= --steps 1 \
  --set train.micro_batch=1 --set train.global_batch=1 --set model.seq_len=64 >"$TMP/ok.out" 2>&1 &&
  pass "a hand-made version 3 file trains" || fail "hand-made v3: $(tail -2 "$TMP/ok.out")"
mk wide "($T, 4, [0, 50, 200], None, b'')"
"$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/wide.bin" --set data.val= --steps 1 \
  --set train.micro_batch=1 --set train.global_batch=1 --set model.seq_len=64 --digest >"$TMP/wide.out" 2>&1
"$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/ok.bin" --set data.val= --steps 1 \
  --set train.micro_batch=1 --set train.global_batch=1 --set model.seq_len=64 --digest >"$TMP/ok2.out" 2>&1
[ -n "$(digest_of "$TMP/wide.out")" ] && [ "$(digest_of "$TMP/wide.out")" = "$(digest_of "$TMP/ok2.out")" ] &&
  pass "32-bit ids read as the 16-bit file of the same tokens (same weights)" || fail "32-bit ids: $(tail -2 "$TMP/wide.out")"
# ids beyond 65535: a vocabulary of 70,001 (held 4 bytes a token in memory, 32-bit in the model)
mk huge "([i * 350 for i in range(1, 201)], 4, [0, 100, 200], None, b'')"
"$DTRAIN" train --config "$SRC/tests/data/tiny.json" --set data.train="$TMP/huge.bin" --set data.val= --steps 2 \
  --set train.micro_batch=1 --set train.global_batch=1 --set model.seq_len=64 --set model.vocab_size=70001 \
  --set data.layout=pack --metrics "$TMP/huge.jsonl" >"$TMP/huge.out" 2>&1 && python3 -c "
import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '\"event\"' not in l]
assert len(r) == 2 and all(math.isfinite(x['loss']) and x['loss'] > 10 for x in r), r  # ln(70001) = 11.2 at the start
" "$TMP/huge.jsonl" && pass "ids up to 70000 (vocabulary 70,001) train (loss near ln V at the start)" ||
  fail "32-bit vocabulary: $(tail -2 "$TMP/huge.out")"
mk longmask "($T, 2, [0, 100, 200], [1] * 205, b'')"
badfile "a mask longer than its tokens" "trailing bytes" longmask
mk emptydoc "($T, 2, [0, 100, 100, 200], None, b'')"
badfile "an empty document" "document 1 is empty" emptydoc
mk docsend "($T, 2, [0, 100, 150], None, b'')"
badfile "documents that end before the tokens" "the documents end at token 150" docsend
mk maskbyte "($T, 2, [0, 200], [1] * 199 + [2], b'')"
badfile "a mask byte that is not 0 or 1" "loss mask byte 2 at token 199" maskbyte
mk bigid "($T[:-1] + [70000], 4, [0, 200], None, b'')"
badfile "a 32-bit id beyond the vocabulary" "token 70000 at position 199" bigid
mk vocab "($T[:-1] + [400], 2, [0, 200], None, b'')"
badfile "an id beyond model.vocab_size" "token 400 at position 199 is >= vocab size" vocab
finish
