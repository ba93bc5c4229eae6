# Damaged checkpoints (issue 24 items 5 and 8): every tensor's data carries a CRC-32 in its
# file's metadata, checked on every load. --resume DIR (a save directory) passes over a
# damaged newest step to the newest intact one, one warning line per step passed over
# naming why, and ends on the uninterrupted run's weights; a step directory named
# explicitly is never swapped: its damage is exit 2 naming the file and tensor; no intact
# step is exit 2 naming the newest; export, sample and init_from of damaged data are
# exit 2; files without checksums (Hugging Face's) load as before.
source "$(dirname "$0")/lib.sh"
prepare_tiny
ST=(python3 "$SRC/tests/st_damage.py")
R=("${TINY[@]}" --steps 40 --threads 1 --set log.sample_tokens=0)
"$DTRAIN" train "${R[@]}" --digest >"$TMP/full.out" 2>&1 || fail "straight run"
FULL=$(digest_of "$TMP/full.out")
"$DTRAIN" train "${R[@]}" --save "$TMP/ck" --save-every 10 >"$TMP/save.out" 2>&1 || fail "saving run"
S40=step_00000040

# the checksums are zlib's CRC-32 of each tensor's bytes, as Python computes them
for f in model optimizer; do
  out=$("${ST[@]}" check "$TMP/ck/$S40/$f.safetensors" 2>&1) && pass "$f.safetensors checksums match zlib.crc32 ($out)" ||
    fail "$f checksums: $out"
done

# fresh DIR: a copy of the saved run
fresh() { rm -rf "$TMP/$1"; cp -r "$TMP/ck" "$TMP/$1"; }
# falls_back NAME REASON: --resume DIR/--save DIR on $TMP/d passes over step 40 for REASON
# (one warning line), resumes at step 30 and ends on the straight run's weights
falls_back() {
  "$DTRAIN" train "${R[@]}" --resume "$TMP/d" --save "$TMP/d" --digest >"$TMP/fb.out" 2>"$TMP/fb.err"; local rc=$?
  local w; w=$(grep -c "^dtrain: warning: checkpoint .*skipped" "$TMP/fb.err")
  [ $rc -eq 0 ] && [ "$w" -eq 1 ] && grep -q "^dtrain: warning: checkpoint $TMP/d/$S40 skipped: .*$2.*; falling back to step_00000030$" "$TMP/fb.err" &&
    grep -q "resumed at step 30" "$TMP/fb.out" && [ "$(digest_of "$TMP/fb.out")" = "$FULL" ] &&
    pass "$1: $(grep skipped "$TMP/fb.err")" || fail "$1: rc $rc, $w warnings: $(cat "$TMP/fb.err") $(tail -2 "$TMP/fb.out")"
}

# one flipped bit in a tensor of the newest step
fresh d; "${ST[@]}" flip "$TMP/d/$S40/model.safetensors" h.0.attn.c_attn.weight
cp -r "$TMP/d" "$TMP/flipped"
falls_back "flipped bit" "model.safetensors: tensor 'h.0.attn.c_attn.weight': checksum mismatch"
[ "$(cat "$TMP/d/latest")" = "$S40.v2" ] && [ ! -e "$TMP/d/$S40" ] &&
  pass "step 40 saved again as $S40.v2, the damaged copy retired" || fail "after fallback: $(ls "$TMP/d") latest $(cat "$TMP/d/latest")"
# the same step named explicitly: exit 2 naming the tensor, nothing else tried
expect2() { # NAME PATTERN CMD...: exit 2, one error line matching PATTERN, no fallback warning
  local name=$1 pat=$2; shift 2
  "$DTRAIN" "$@" >"$TMP/e.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/e.out")" -eq 1 ] && grep -q "^dtrain: error: .*$pat" "$TMP/e.out" &&
    ! grep -q "warning: checkpoint" "$TMP/e.out" && pass "$name: $(grep '^dtrain: error' "$TMP/e.out")" ||
    fail "$name: rc $rc: $(tail -3 "$TMP/e.out")"
}
expect2 "explicit damaged step" "model.safetensors: tensor 'h.0.attn.c_attn.weight': checksum mismatch" \
  train "${R[@]}" --resume "$TMP/flipped/$S40" --save "$TMP/x1"
expect2 "export of the damaged step" "tensor 'h.0.attn.c_attn.weight': checksum mismatch" export "$TMP/flipped/$S40" "$TMP/hf1"
[ ! -e "$TMP/hf1" ] && pass "no export directory made" || fail "export made $TMP/hf1"
expect2 "sample of the damaged step" "tensor 'h.0.attn.c_attn.weight': checksum mismatch" \
  sample --checkpoint "$TMP/flipped/$S40" --length 3
expect2 "init_from the damaged file" "tensor 'h.0.attn.c_attn.weight': checksum mismatch" \
  train "${R[@]}" --set train.init_from="$TMP/flipped/$S40/model.safetensors" --steps 1
# a flip in the optimizer's moments is caught too
fresh d; "${ST[@]}" flip "$TMP/d/$S40/optimizer.safetensors" exp_avg_sq.ln_f.bias
falls_back "flipped bit in the optimizer" "optimizer.safetensors: tensor 'exp_avg_sq.ln_f.bias': checksum mismatch"

# other damage, each passed over with its reason
fresh d; "${ST[@]}" truncate "$TMP/d/$S40/optimizer.safetensors"
falls_back "truncated file" "optimizer.safetensors: tensor '.*'.*past the end"
fresh d; "${ST[@]}" garble "$TMP/d/$S40/model.safetensors"
falls_back "garbled header" "model.safetensors: header is not valid JSON"
fresh d; sed -i 's/"step":\s*40/"step": 30/' "$TMP/d/$S40/trainer_state.json"
grep -q '"step": 30' "$TMP/d/$S40/trainer_state.json" || fail "editing trainer_state.json"
mkdir -p "$TMP/m"; cp -r "$TMP/d/$S40" "$TMP/m/"
falls_back "trainer_state.json at another step" "trainer_state.json is at step 30, but the directory is named for step 40"
expect2 "explicit step with a mismatched trainer_state.json" "trainer_state.json is at step 30, but the directory is named for step 40" \
  train "${R[@]}" --resume "$TMP/m/$S40" --save "$TMP/x2"
fresh d; rm "$TMP/d/$S40/trainer_state.json"
falls_back "missing trainer_state.json" "trainer_state.json"
fresh d; echo '{' >"$TMP/d/$S40/trainer_state.json"
falls_back "trainer_state.json not JSON" "trainer_state.json is not one valid JSON object"

# a sharded step (checkpoint.shard_mb) missing one of its index's files
"$DTRAIN" train "${R[@]}" --save "$TMP/sh" --save-every 10 --set checkpoint.shard_mb=0.02 >/dev/null 2>&1 || fail "sharded save"
ls "$TMP/sh/$S40"/model-00002-of-*.safetensors >/dev/null 2>&1 || fail "no shards: $(ls "$TMP/sh/$S40")"
rm -rf "$TMP/d"; cp -r "$TMP/sh" "$TMP/d"; rm "$TMP/d/$S40"/model-00002-of-*.safetensors
falls_back "missing index shard" "model.safetensors.index.json': tensor '.*' maps to 'model-00002-of-[0-9]*.safetensors', which cannot be opened"

# two damaged steps: two warnings, the run goes back to step 20
fresh d; "${ST[@]}" flip "$TMP/d/$S40/model.safetensors" wte.weight; "${ST[@]}" flip "$TMP/d/step_00000030/model.safetensors" wpe.weight
"$DTRAIN" train "${R[@]}" --resume "$TMP/d" --save "$TMP/d" --digest >"$TMP/fb.out" 2>"$TMP/fb.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'skipped: .*falling back to step_00000020$' "$TMP/fb.err")" -eq 2 ] &&
  grep -q "resumed at step 20" "$TMP/fb.out" && [ "$(digest_of "$TMP/fb.out")" = "$FULL" ] &&
  pass "two damaged steps: back to step 20, the straight run's weights" || fail "two damaged: rc $rc $(cat "$TMP/fb.err")"
# every step damaged: exit 2 naming the newest and why
fresh d; for s in 10 20 30 40; do "${ST[@]}" flip "$TMP/d/step_000000$s/model.safetensors" ln_f.weight; done
expect2 "no intact step" "checkpoint '$TMP/d': no step is intact; the newest, $S40: model.safetensors: tensor 'ln_f.weight': checksum mismatch.*(and 3 older ones damaged too)" \
  train "${R[@]}" --resume "$TMP/d" --save "$TMP/d"
# export and sample of a save directory fall back the same way
fresh d; "${ST[@]}" flip "$TMP/d/$S40/model.safetensors" h.0.attn.c_attn.weight
"$DTRAIN" export "$TMP/d" "$TMP/hf2" >"$TMP/ex.out" 2>&1 && grep -q "skipped: .*falling back to step_00000030" "$TMP/ex.out" &&
  pass "export of the save directory falls back to step 30" || fail "export fallback: $(cat "$TMP/ex.out")"

# files without checksums (Hugging Face's own) load as before
python3 - "$TMP/ck/$S40/model.safetensors" "$TMP/plain.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); h["__metadata__"] = {"format": "pt"}
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
PY
"$DTRAIN" train "${R[@]}" --set train.init_from="$TMP/plain.safetensors" --steps 1 >"$TMP/plain.out" 2>&1 &&
  pass "init_from a file without checksums" || fail "plain init_from: $(tail -2 "$TMP/plain.out")"
# an export's model.safetensors is the checkpoint's, checksums included
"$DTRAIN" export "$TMP/ck" "$TMP/hf3" >/dev/null 2>&1 && cmp -s "$TMP/hf3/model.safetensors" "$TMP/ck/$S40/model.safetensors" &&
  "${ST[@]}" check "$TMP/hf3/model.safetensors" >/dev/null && pass "an export carries the checksums" || fail "export checksums"

# several ranks (and the launcher): every rank resolves the same step, rank 0 warns once;
# bitwise mode ends on the single process's weights
if command -v mpirun >/dev/null && full; then
  need_mpi
  B=(--set parallel.determinism=bitwise --set train.micro_batch=2)
  "$DTRAIN" train "${R[@]}" "${B[@]}" --digest >"$TMP/b1.out" 2>&1 || fail "bitwise straight run"
  "$DTRAIN" train "${R[@]}" "${B[@]}" --save "$TMP/bk" --save-every 10 >/dev/null 2>&1 || fail "bitwise saving run"
  "${ST[@]}" flip "$TMP/bk/$S40/model.safetensors" h.1.mlp.c_fc.weight
  "$DTRAIN_BIN" launch -n 2 --mpi-arg --oversubscribe --mpi-arg --mca --mpi-arg btl --mpi-arg self,vader -- \
    train "${R[@]}" "${B[@]}" --resume "$TMP/bk" --save "$TMP/bk" --digest >"$TMP/l.out" 2>&1; rc=$?
  [ $rc -eq 0 ] && grep -q "resumed at step 30" "$TMP/l.out" && [ -n "$(digest_of "$TMP/b1.out")" ] &&
    [ "$(digest_of "$TMP/l.out")" = "$(digest_of "$TMP/b1.out")" ] &&
    [ "$(grep -c "^dtrain: warning: checkpoint .*$S40 skipped: model.safetensors: tensor 'h.1.mlp.c_fc.weight'" "$TMP/l.out")" -eq 2 ] &&
    pass "launch -n 2: fell back to step 30, the single process's weights; one warning from the launcher, one from rank 0" ||
    fail "launch fallback: rc $rc $(grep -v '^step' "$TMP/l.out" | tail -5)"
fi
finish
