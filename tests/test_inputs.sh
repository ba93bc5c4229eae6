# Issue 24 items 6 and 8: no input can hang a process, and no failed write passes in
# silence.
# (a) Every input (token files, checkpoint `latest`, --config, --deepspeed, the GPT-2
#     tokenizer files, prepare --input, report inputs, a launcher hostfile) given as a
#     FIFO with no writer or as /dev/zero: exit 2 at once (here: within `timeout 10`,
#     where the open of a FIFO used to block for good, the first SIGTERM not ending it),
#     one line naming the key and the file.
# (b) A command whose result goes to stdout, run with stdout on a full disk (/dev/full):
#     exit 1, "writing standard output: No space left on device", never exit 0.
# (c) A metrics file whose last line a full disk cut short: the resumed run appending to
#     it ends that line first, and `dtrain report` skips the torn line with one warning.
source "$(dirname "$0")/lib.sh"
prepare_tiny
mkfifo "$TMP/fifo"
mkdir -p "$TMP/ck_fifo" "$TMP/ck_zero"
mkfifo "$TMP/ck_fifo/latest"
ln -s /dev/zero "$TMP/ck_zero/latest"
# GPT-2's byte alphabet as an encoder.json (256 tokens, no merges): a valid first file,
# so the second (vocab.bpe) is the one read as a FIFO
python3 - "$TMP/enc.json" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
json.dump({chr(c): i for i, c in enumerate(cs)}, open(sys.argv[1], "w"))
PY
printf '#version: 0.2\n' >"$TMP/merges.bpe"
printf 'localhost slots=2\n' >"$TMP/hosts"

# expect_refused NAME PATTERN dtrain-args...: exit 2 within 10 s, exactly one error line
# matching PATTERN (the launcher may print notes before it)
expect_refused() {
  local name="$1" pat="$2"; shift 2
  timeout -s KILL 10 "$DTRAIN" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null; local rc=$?
  local errs; errs=$(grep -c "^dtrain: error:" "$TMP/err")
  if [ $rc -eq 137 ]; then fail "$name: hung (killed after 10 s)"; return; fi
  if [ $rc -ne 2 ] || [ "$errs" -ne 1 ] || ! grep -q -- "$pat" "$TMP/err" ||
     [ "$(grep -vc "^dtrain launch: note:" "$TMP/err")" -ne 1 ]; then
    fail "$name: rc $rc, stderr: $(cat "$TMP/err")"; return
  fi
  pass "$name: $(grep "^dtrain: error:" "$TMP/err")"
}
T=("${TINY[@]}" --steps 1 --set threads=1)
for kind in fifo zero; do
  if [ $kind = fifo ]; then f="$TMP/fifo" what="a FIFO"; else f=/dev/zero what="a character device"; fi
  msg="'$f' is not a regular file ($what)"
  expect_refused "data.train $kind" "data.train: $msg" train "${T[@]}" --set "data.train=$f"
  expect_refused "data.val $kind" "data.val: $msg" train "${T[@]}" --set "data.val=$f"
  expect_refused "--config $kind" "error: --config: $msg" config --config "$f"
  expect_refused "--deepspeed $kind" "error: --deepspeed: $msg" train --deepspeed "$f" --set threads=1
  expect_refused "encoder_json $kind" "data.encoder_json: $msg" prepare --tokenizer gpt2 --encoder-json "$f" \
    --vocab-bpe "$TMP/merges.bpe" --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/p"
  expect_refused "vocab_bpe $kind" "data.vocab_bpe: $msg" prepare --tokenizer gpt2 --encoder-json "$TMP/enc.json" \
    --vocab-bpe "$f" --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/p"
  expect_refused "prepare --input $kind" "prepare --input: $msg" prepare --input "$f" --out "$TMP/p"
  expect_refused "report input $kind" "report: $msg" report "$f" --out "$TMP/r.html"
  expect_refused "hostfile $kind" "launch: --hostfile: $msg" launch -n 2 --hostfile "$f" -- train "${T[@]}" \
    --save "$TMP/s"
  expect_refused "latest $kind (train --resume)" "checkpoint '$TMP/ck_$kind': '$TMP/ck_$kind/latest' is not a regular" \
    train "${T[@]}" --resume "$TMP/ck_$kind"
  expect_refused "latest $kind (sample)" "ck_$kind/latest' is not a regular file" sample --checkpoint "$TMP/ck_$kind"
done
expect_refused "data.train a directory" "data.train: '$TMP' is not a regular file (a directory)" \
  train "${T[@]}" --set "data.train=$TMP"
# no file was made from what was refused
[ ! -e "$TMP/p_train.bin" ] && [ ! -e "$TMP/r.html" ] && pass "nothing written" || fail "outputs left behind"

# (b) stdout on a full disk; a small checkpoint for sample, export and the resume below
"$DTRAIN" train "${TINY[@]}" --steps 4 --set threads=1 --save "$TMP/ck" --save-every 2 --set train.stop_after=2 \
  --metrics "$TMP/m.jsonl" >"$TMP/train.out" 2>&1 || fail "train: $(tail -3 "$TMP/train.out")"
expect_full() { # expect_full NAME dtrain-args...: exit 1 and the one message
  local name="$1"; shift
  timeout 60 "$DTRAIN" "$@" >/dev/full 2>"$TMP/err"; local rc=$?
  if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
     grep -qx "dtrain: error: writing standard output: No space left on device" "$TMP/err"; then
    pass "$name >/dev/full: exit 1"
  else
    fail "$name >/dev/full: rc $rc, stderr: $(cat "$TMP/err")"
  fi
}
expect_full "config" config "${TINY[@]}"
expect_full "config --doc" config --doc
expect_full "config -n 2" config "${TINY[@]}" -n 2
expect_full "estimate" estimate "${TINY[@]}" -n 2
expect_full "plan" plan "${TINY[@]}" -n 2 --flops 1e9 --memory 4
expect_full "--version" --version
expect_full "--help" --help
expect_full "sample" sample --checkpoint "$TMP/ck" --length 5
expect_full "export" export "$TMP/ck" "$TMP/hf"
expect_full "prepare" prepare --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/q"
expect_full "report" report "$TMP/m.jsonl" --out "$TMP/m.html"
# the same commands on a working stdout still exit 0
"$DTRAIN" config "${TINY[@]}" >"$TMP/cfg.json" && python3 -c "import json,sys; json.load(open(sys.argv[1]))" \
  "$TMP/cfg.json" && pass "config > file: valid JSON, exit 0" || fail "config > file"

# (c) a full disk cut the metrics file's last line short; the resumed run appends
head -c -25 "$TMP/m.jsonl" >"$TMP/torn.jsonl"
torn_at=$(wc -l <"$TMP/torn.jsonl"); torn_at=$((torn_at + 1)) # the unterminated line's number
"$DTRAIN" train "${TINY[@]}" --steps 4 --set threads=1 --resume "$TMP/ck" --metrics "$TMP/torn.jsonl" \
  >"$TMP/resume.out" 2>&1 || fail "resume: $(tail -3 "$TMP/resume.out")"
python3 - "$TMP/torn.jsonl" "$torn_at" <<'PY' && pass "the torn line stays one line; every other line parses" \
  || fail "resumed metrics file: $(cat "$TMP/torn.jsonl")"
import json, sys
lines = open(sys.argv[1]).read().split("\n")
torn = int(sys.argv[2])
assert lines[-1] == "", "the file ends with a newline"
for i, l in enumerate(lines[:-1], 1):
    if i == torn:
        try:
            json.loads(l)
            raise SystemExit("line %d should be the torn one: %s" % (i, l))
        except ValueError:
            pass
    else:
        json.loads(l)  # a record glued to the torn line would fail here
assert json.loads(lines[torn]).get("event") == "resume", lines[torn]
PY
"$DTRAIN" report "$TMP/torn.jsonl" --out "$TMP/torn.html" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 0 ] && [ -s "$TMP/torn.html" ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
  grep -qx "dtrain: warning: $TMP/torn.jsonl:$torn_at: a torn line (a run killed mid-write?) skipped" "$TMP/err" \
  && pass "report skips the torn line: $(cat "$TMP/err")" || fail "report: rc $rc, $(cat "$TMP/err")"
# a line of valid JSON of the wrong shape is still an error
printf '{"step": 1, "loss": 2}\n[1, 2]\n' >"$TMP/shape.jsonl"
"$DTRAIN" report "$TMP/shape.jsonl" --out "$TMP/shape.html" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "shape.jsonl:2: not a JSON object" "$TMP/err" && pass "wrong shape: $(cat "$TMP/err")" \
  || fail "wrong shape: rc $rc, $(cat "$TMP/err")"
finish
