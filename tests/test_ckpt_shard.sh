# Sharded checkpoints (docs/checkpoints.md): with pipeline stages (and by size with
# checkpoint.shard_mb) a step holds model-0000k-of-0000N.safetensors + model.safetensors.index.json
# (and the optimizer's likewise) in Hugging Face's format, each stage's files written by its
# own rank. Checked: the index covers every tensor exactly once and matches the files; a
# pp2 (and dp2 x pp2 x tp2) checkpoint loads bit for bit in one process and continues the
# single-process curve; a single-process sharded one resumes bitwise and under pp2 x tp2;
# every crash point of a sharded save (and a stage failing to write) keeps `latest` naming a
# complete step; export of a sharded checkpoint is the single-file export; init_from reads
# an index; a bad index is one line, exit 2.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
RUN=("${DP_RUN[@]}" --set log.sample_tokens=0)
PP2=(--set parallel.pp=2)
S10=(--set train.stop_after=10)
# a resumed run saves and logs where its checkpoint's config says, unless told not to
NOSAVE=(--set checkpoint.dir= --set log.metrics=)
# the loaded weights' digest: resume with train.steps at the checkpoint's step (nothing to train)
loaded_digest() { "$DTRAIN" train "${RUN[@]}" --resume "$1" --steps "$2" "${NOSAVE[@]}" --digest 2>&1 | grep -o 'digest sha256:[0-9a-f]*'; }

# check_shards STEP_DIR NFILES [STAGES]: the HF layout, exactly: N model and N optimizer files, no
# single files, both indexes json.dumps(indent=2, sort_keys=True) of {"metadata": {"total_size"},
# "weight_map"}, every tensor of the reference single-file checkpoint ($TMP/one) mapped exactly once,
# to the file that holds it, total_size the tensors' bytes, the moments of a tensor in the
# optimizer file of its model file's number; STAGES: no file mixes blocks of two stages
# ("0,1" = block 0 on stage 0 and block 1 on stage 1; the embeddings first, ln_f last).
check_shards() {
  python3 - "$1" "$2" "$TMP/one/step_00000010" "${3:-}" <<'PY'
import json, os, struct, sys
d, n, ref, stages = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def header(p):
    raw = open(p, "rb").read()
    k = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + k]); h.pop("__metadata__", None)
    return h
names = set(header(os.path.join(ref, "model.safetensors")))
assert not os.path.exists(os.path.join(d, "model.safetensors")), "a single model.safetensors besides the shards"
assert not os.path.exists(os.path.join(d, "optimizer.safetensors")), "a single optimizer.safetensors"
files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
want = ["%s-%05d-of-%05d.safetensors" % (k, i, n) for k in ("model", "optimizer") for i in range(1, n + 1)]
assert files == sorted(want), files
def check(kind, expect):
    text = open(os.path.join(d, kind + ".safetensors.index.json")).read()
    idx = json.loads(text)
    assert text == json.dumps(idx, indent=2, sort_keys=True) + "\n", "not HF's formatting"
    assert set(idx) == {"metadata", "weight_map"} and set(idx["metadata"]) == {"total_size"}, idx.keys()
    wm = idx["weight_map"]
    assert set(wm) == expect, sorted(set(wm) ^ expect)[:5]
    seen, total = {}, 0
    for f in sorted(set(wm.values())):
        h = header(os.path.join(d, f))
        for t, e in h.items():
            assert t not in seen, "%s in %s and %s" % (t, seen[t], f)
            assert wm[t] == f, "%s is in %s, the index says %s" % (t, f, wm[t])
            seen[t] = f
            total += e["data_offsets"][1] - e["data_offsets"][0]
    assert set(seen) == expect, "tensors listed but in no file: %s" % sorted(expect - set(seen))[:5]
    assert idx["metadata"]["total_size"] == total, (idx["metadata"]["total_size"], total)
    return wm
wm = check("model", names)
om = check("optimizer", {p + t for t in names for p in ("exp_avg.", "exp_avg_sq.")})
for t in names:
    for p in ("exp_avg.", "exp_avg_sq."):
        assert om[p + t].replace("optimizer", "model") == wm[t], (t, om[p + t], wm[t])
if stages:
    stage_of = {"h.%d" % b: int(s) for b, s in enumerate(stages.split(","))}
    last = max(stage_of.values())
    def stage(t):
        if t.startswith("h."): return stage_of[".".join(t.split(".")[:2])]
        return 0 if t.startswith(("wte", "wpe")) else last
    for f in set(wm.values()):
        assert len({stage(t) for t in wm if wm[t] == f}) == 1, "%s mixes stages" % f
print("%d files, %d tensors, total_size %d" % (n, len(wm), json.load(open(os.path.join(d, "model.safetensors.index.json")))["metadata"]["total_size"]))
PY
}
# complete DIR: latest names a directory with trainer_state.json and every file its indexes name
complete() {
  local d="$1/$(cat "$1/latest" 2>/dev/null)"
  [ -f "$d/trainer_state.json" ] && python3 - "$d" <<'PY'
import json, os, sys
d = sys.argv[1]
for kind in ("model", "optimizer"):
    single, index = os.path.join(d, kind + ".safetensors"), os.path.join(d, kind + ".safetensors.index.json")
    if os.path.exists(single): continue
    for f in set(json.load(open(index))["weight_map"].values()):
        assert os.path.getsize(os.path.join(d, f)) > 0, f
PY
}
leftovers() { find "$1" -mindepth 1 \( -name '.step_*' -o -name 'latest.tmp.*' -o -name '*.old.*' -o -name '*.tmp.*' \) | sort; }

# --- references: the single-process run, and its single-file checkpoint at step 10 ------
"$DTRAIN" train "${RUN[@]}" --metrics "$TMP/ref.jsonl" --digest >"$TMP/ref.out" 2>&1 || fail "single-process run"
straight=$(digest_of "$TMP/ref.out")
"$DTRAIN" train "${RUN[@]}" "${S10[@]}" --save "$TMP/one" >/dev/null 2>&1 || fail "single-process save"
[ -f "$TMP/one/step_00000010/model.safetensors" ] && [ ! -e "$TMP/one/step_00000010/model.safetensors.index.json" ] &&
  pass "pp 1, shard_mb 0: one model.safetensors, no index (the default)" || fail "single-process layout: $(ls "$TMP/one/step_00000010")"

# --- 1. pp2: one file per stage, written by the stage's rank; loads bit for bit anywhere -----
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${PP2[@]}" "${S10[@]}" --save "$TMP/p2" --digest \
  --metrics "$TMP/p2.jsonl" >"$TMP/p2.out" 2>&1 || fail "pp2 save: $(grep -v '^\[' "$TMP/p2.out" | tail -2)"
r=$(check_shards "$TMP/p2/step_00000010" 2 0,1) && pass "pp2: 2 stage shards + HF indexes, every tensor once: $r" ||
  fail "pp2 shards: $r"
d=$(loaded_digest "$TMP/p2" 10)
[ -n "$d" ] && [ "$d" = "$(digest_of "$TMP/p2.out")" ] && pass "pp2 shards load bit for bit in one process" ||
  fail "pp2 shards loaded in one process: $d vs $(digest_of "$TMP/p2.out")"
"$DTRAIN" train "${RUN[@]}" --resume "$TMP/p2/step_00000010" "${NOSAVE[@]}" --metrics "$TMP/p2.jsonl" >"$TMP/p2r.out" 2>&1 ||
  fail "one process resumes pp2 shards: $(tail -2 "$TMP/p2r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/p2.jsonl") && pass "pp2 sharded save + single resume = single process ($r)" ||
  fail "pp2 sharded resume: $r"
# pp2 with shard_mb: each stage's tensors split by size, no file mixes stages
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${PP2[@]}" "${S10[@]}" --set checkpoint.shard_mb=0.03 --save "$TMP/p2s" \
  >"$TMP/p2s.out" 2>&1 || fail "pp2 shard_mb save: $(grep -v '^\[' "$TMP/p2s.out" | tail -2)"
n=$(ls "$TMP/p2s/step_00000010" | grep -c '^model-')
r=$(check_shards "$TMP/p2s/step_00000010" "$n" 0,1) && [ "$n" -ge 4 ] &&
  pass "pp2 + checkpoint.shard_mb 0.03: $n files, none across stages: $r" || fail "pp2 shard_mb ($n files): $r"
d=$(loaded_digest "$TMP/p2s" 10)
[ "$d" = "$(loaded_digest "$TMP/p2" 10)" ] && pass "by-size shards hold the same weights" || fail "pp2 shard_mb weights: $d"

# --- 2. a single-process sharded save (shard_mb): bitwise resume, and under pp2 x tp2 ------
"$DTRAIN" train "${RUN[@]}" "${S10[@]}" --set checkpoint.shard_mb=0.05 --save "$TMP/s1" --metrics "$TMP/s1t.jsonl" >/dev/null 2>&1 ||
  fail "shard_mb save"
r=$(check_shards "$TMP/s1/step_00000010" 3) && pass "pp 1, shard_mb 0.05: 3 size shards: $r" || fail "shard_mb shards: $r"
"$DTRAIN" train "${RUN[@]}" --resume "$TMP/s1/step_00000010" "${NOSAVE[@]}" --digest >"$TMP/s1r.out" 2>&1
[ "$(digest_of "$TMP/s1r.out")" = "$straight" ] && pass "sharded save + resume: bitwise the straight run" ||
  fail "sharded resume: $(digest_of "$TMP/s1r.out") vs $straight $(tail -1 "$TMP/s1r.out")"
[ "$(loaded_digest "$TMP/s1/step_00000010" 10)" = "$(loaded_digest "$TMP/one/step_00000010" 10)" ] &&
  pass "the shards hold bitwise the single file's weights" || fail "sharded vs single file weights"
"${MPI[@]}" -np 4 "$DTRAIN" train "${RUN[@]}" --resume "$TMP/s1/step_00000010" "${PP2[@]}" --set parallel.tp=2 "${NOSAVE[@]}" \
  --metrics "$TMP/s1t.jsonl" --digest >"$TMP/s1t.out" 2>&1 || fail "pp2 x tp2 resumes the shards: $(grep -v '^\[' "$TMP/s1t.out" | tail -2)"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/s1t.jsonl") && pass "single sharded save + pp2 x tp2 resume = single process ($r)" ||
  fail "pp2 x tp2 resume of single-process shards: $r"
# bitwise mode: a pp2 sharded save resumed in one process ends at the straight weights
BW=(--set parallel.determinism=bitwise --digest)
"$DTRAIN" train "${RUN[@]}" "${BW[@]}" >"$TMP/bw.out" 2>&1 || fail "bitwise single"
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${BW[@]}" "${PP2[@]}" "${S10[@]}" --save "$TMP/bw" >"$TMP/bwp.out" 2>&1 ||
  fail "bitwise pp2 save: $(grep -v '^\[' "$TMP/bwp.out" | tail -2)"
[ -f "$TMP/bw/step_00000010/model.safetensors.index.json" ] || fail "bitwise pp2: not sharded"
"$DTRAIN" train "${RUN[@]}" "${BW[@]}" --resume "$TMP/bw" >"$TMP/bwr.out" 2>&1
[ -n "$(digest_of "$TMP/bw.out")" ] && [ "$(digest_of "$TMP/bwr.out")" = "$(digest_of "$TMP/bw.out")" ] &&
  pass "bitwise: pp2 sharded save + single resume = the straight single-process weights" ||
  fail "bitwise pp2 shards -> single: $(digest_of "$TMP/bwr.out") vs $(digest_of "$TMP/bw.out")"

# --- 3. dp2 x pp2 x tp2 (8 ranks): shards of whole tensors, resumed in one process ---------
if full; then
  "${MPI[@]}" -np 8 "$DTRAIN" train "${RUN[@]}" "${PP2[@]}" --set parallel.tp=2 --set parallel.zero=1 "${S10[@]}" \
    --save "$TMP/p8" --metrics "$TMP/p8.jsonl" >"$TMP/p8.out" 2>&1 || fail "dp2 pp2 tp2 save: $(grep -v '^\[' "$TMP/p8.out" | tail -2)"
  r=$(check_shards "$TMP/p8/step_00000010" 2 0,1) && pass "dp2 x pp2 x tp2 (ZeRO-1): 2 stage shards of whole tensors: $r" ||
    fail "dp2 pp2 tp2 shards: $r"
  "$DTRAIN" train "${RUN[@]}" --resume "$TMP/p8" "${NOSAVE[@]}" --metrics "$TMP/p8.jsonl" >"$TMP/p8r.out" 2>&1 ||
    fail "one process resumes dp2 pp2 tp2 shards: $(tail -2 "$TMP/p8r.out")"
  r=$(compare_curves "$TMP/ref.jsonl" "$TMP/p8.jsonl") && pass "dp2 x pp2 x tp2 sharded save + single resume = single process ($r)" ||
    fail "dp2 pp2 tp2 resume: $r"
fi

# --- 4. crash points of a sharded save keep `latest` valid ----------------------------
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${PP2[@]}" --digest >"$TMP/pfull.out" 2>&1 || fail "pp2 straight run"
pstraight=$(digest_of "$TMP/pfull.out")
points="shard tmp renamed latest_tmp latest"
full || points="shard tmp latest"
for point in $points; do
  rm -rf "$TMP/k"
  DT_TEST_CRASH_AT=$point:10 timeout 120 "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${PP2[@]}" "${S10[@]}" \
    --save "$TMP/k" --save-every 5 >"$TMP/k.out" 2>&1
  rc=$?
  want=5; [ "$point" = latest ] && want=10
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(cat "$TMP/k/latest")" = "$(printf 'step_%08d' $want)" ] && complete "$TMP/k" ||
    { fail "crash at $point: exit $rc, latest '$(cat "$TMP/k/latest" 2>/dev/null)', expected a complete step $want"; continue; }
  "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${PP2[@]}" --resume "$TMP/k" --save "$TMP/k" --digest >"$TMP/kr.out" 2>&1
  grep -q "resumed at step $want from " "$TMP/kr.out" && [ "$(digest_of "$TMP/kr.out")" = "$pstraight" ] &&
    [ -z "$(leftovers "$TMP/k")" ] && complete "$TMP/k" &&
    pass "crash at $point: latest = complete step $want, resumes to the straight pp2 digest, no temporaries" ||
    fail "crash at $point: resume: $(digest_of "$TMP/kr.out") vs $pstraight; left: $(leftovers "$TMP/k") $(grep -v '^\[' "$TMP/kr.out" | tail -1)"
done
# a stage whose files fail: every rank stops (no hang), one error line, nothing committed, no temporaries
rm -rf "$TMP/f"
DT_TEST_FAIL_AT=shard:10 timeout 120 "${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${PP2[@]}" "${S10[@]}" --save "$TMP/f" \
  --save-every 5 >"$TMP/f.out" 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(grep -c '^dtrain: error' "$TMP/f.out")" -eq 1 ] && grep -q "stage 1's files could not be written" "$TMP/f.out" &&
  [ "$(cat "$TMP/f/latest")" = step_00000005 ] && complete "$TMP/f" && [ -z "$(leftovers "$TMP/f")" ] &&
  pass "stage 1 fails to write: exit 1 on every rank, latest still step 5, the temporary removed" ||
  fail "stage failure: exit $rc, latest $(cat "$TMP/f/latest" 2>/dev/null), left $(leftovers "$TMP/f"): $(grep '^dtrain: error' "$TMP/f.out")"

# --- 5. export of a sharded checkpoint: the single-file export, byte for byte ----------
"$DTRAIN" export "$TMP/s1" "$TMP/hf_s" >/dev/null 2>&1 && "$DTRAIN" export "$TMP/one" "$TMP/hf_1" >/dev/null 2>&1 &&
  [ -f "$TMP/hf_s/model.safetensors" ] && [ ! -e "$TMP/hf_s/model.safetensors.index.json" ] &&
  cmp -s "$TMP/hf_s/model.safetensors" "$TMP/hf_1/model.safetensors" &&
  cmp -s "$TMP/hf_s/model.safetensors" "$TMP/one/step_00000010/model.safetensors" &&
  cmp -s "$TMP/hf_s/config.json" "$TMP/hf_1/config.json" &&
  pass "export of size shards = the single-file checkpoint's model.safetensors, byte for byte" || fail "export of size shards"
"$DTRAIN" export "$TMP/p2" "$TMP/hf_p" >"$TMP/e.out" 2>&1 || fail "export of pp2 shards: $(cat "$TMP/e.out")"
out=$(python3 "$SRC/tests/hf_gpt2.py" same "$TMP/hf_p" "$TMP/p2/step_00000010") &&
  out2=$(python3 "$SRC/tests/hf_gpt2.py" header "$TMP/hf_p") &&
  pass "export of pp2 shards: one HF model.safetensors ($out2), every tensor the shards' bytes" || fail "export of pp2 shards: $out $out2"

# --- 6. train.init_from reads an index (or a directory holding one) ------------------------
want=$(loaded_digest "$TMP/s1/step_00000010" 10)
for src in "$TMP/s1/step_00000010/model.safetensors.index.json" "$TMP/s1/step_00000010"; do
  d=$("$DTRAIN" train "${RUN[@]}" --steps 0 --set train.init_from="$src" --digest 2>&1 | grep -o 'digest sha256:[0-9a-f]*')
  [ -n "$d" ] && [ "$d" = "$want" ] && pass "init_from=${src#$TMP/}: the shards' weights" || fail "init_from $src: $d vs $want"
done

# --- 7. bad indexes: one `dtrain: error` line naming the file and the cause, exit 2 -------
# bad NAME PATTERN PYTHON: PYTHON edits a copy of the sharded step (d: its path; idx: the model
# index as a dict; save(): writes idx back; st(f) / st_write(f, h): a shard's header), then
# resume, sample and export must each refuse it
bad() {
  local name=$1 pat=$2 code=$3 cmd rc n
  rm -rf "$TMP/b"; mkdir -p "$TMP/b"; cp -r "$TMP/s1/step_00000010" "$TMP/b/ck"
  python3 - "$TMP/b/ck" <<PY || { fail "$name: the edit failed"; return; }
import json, os, struct, sys
d = sys.argv[1]
ip = os.path.join(d, "model.safetensors.index.json")
idx = json.load(open(ip))
def save(text=None): open(ip, "w").write(json.dumps(idx, indent=2) if text is None else text)
def st(f):
    raw = open(os.path.join(d, f), "rb").read(); k = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + k]), raw[8 + k:]
def st_write(f, h, data):
    hb = json.dumps(h).encode(); open(os.path.join(d, f), "wb").write(struct.pack("<Q", len(hb)) + hb + data)
$code
PY
  for cmd in train sample export; do
    case $cmd in
      train) "$DTRAIN" train --resume "$TMP/b/ck" --set train.stop_after=1 --set checkpoint.dir= --set log.metrics= >"$TMP/b.out" 2>&1 ;;
      sample) "$DTRAIN" sample --checkpoint "$TMP/b/ck" --length 2 >"$TMP/b.out" 2>&1 ;;
      export) "$DTRAIN" export "$TMP/b/ck" "$TMP/b/hf" >"$TMP/b.out" 2>&1 ;;
    esac
    rc=$?; n=$(grep -c "^dtrain: error" "$TMP/b.out")
    [ $rc -eq 2 ] && [ "$n" -eq 1 ] && ! grep -q "Sanitizer\|runtime error" "$TMP/b.out" && grep "^dtrain: error" "$TMP/b.out" | grep -q "$pat" ||
      { fail "$name ($cmd): exit $rc, $n error lines: $(tail -2 "$TMP/b.out")"; return; }
  done
  pass "$name: exit 2 (resume, sample, export): $(grep '^dtrain: error' "$TMP/b.out")"
}
bad "not JSON" "model.safetensors.index.json': not valid JSON" 'save(open(ip).read()[:200])'
bad "no weight_map" "index.json': 'weight_map' is missing" 'del idx["weight_map"]; save()'
bad "weight_map not an object" "'weight_map' is missing or not an object" 'idx["weight_map"] = []; save()'
bad "no total_size" "index.json': 'metadata.total_size' is missing" 'del idx["metadata"]; save()'
bad "total_size mismatch" "total_size is [0-9]* but the tensors it maps hold" 'idx["metadata"]["total_size"] += 4; save()'
bad "a file that does not exist" "index.json': tensor 'h.0.ln_1.weight' maps to 'model-00009-of-00009.safetensors', which cannot be opened" \
  'idx["weight_map"]["h.0.ln_1.weight"] = "model-00009-of-00009.safetensors"; save()'
bad "path traversal (..)" "maps to '../../one/step_00000010/model.safetensors', not a plain file name" \
  'idx["weight_map"]["wte.weight"] = "../../one/step_00000010/model.safetensors"; save()'
bad "absolute path" "maps to '/etc/passwd', not a plain file name" 'idx["weight_map"]["wpe.weight"] = "/etc/passwd"; save()'
bad "path separator" "not a plain file name" 'idx["weight_map"]["ln_f.bias"] = "sub/model-00001-of-00003.safetensors"; save()'
bad "file name not a string" "tensor 'ln_f.bias' maps to a non-string" 'idx["weight_map"]["ln_f.bias"] = 3; save()'
bad "tensor listed twice" "tensor 'wpe.weight' is listed twice" \
  't = json.dumps(idx, indent=2); save(t.replace("\"wpe.weight\":", "\"wpe.weight\": \"x\", \"wpe.weight\":", 1))'
bad "tensor in the index, not in its file" "index.json': tensor 'h.0.ln_1.weight' is not in 'model-0000[1-3]-of-00003.safetensors'" \
  'f = idx["weight_map"]["h.0.ln_1.weight"]; h, data = st(f); del h["h.0.ln_1.weight"]; st_write(f, h, data)'
bad "tensor in two files" "tensor 'h.0.ln_1.weight' is in 'model-0000[1-3]-of-00003.safetensors' too, but the index maps it to" '
f = idx["weight_map"]["h.0.ln_1.weight"]; g = [x for x in sorted(set(idx["weight_map"].values())) if x != f][0]
h, data = st(f); e = h["h.0.ln_1.weight"]; b, end = e["data_offsets"]
h2, d2 = st(g); h2["h.0.ln_1.weight"] = {"dtype": "F32", "shape": e["shape"], "data_offsets": [len(d2), len(d2) + end - b]}
st_write(g, h2, d2 + data[b:end])'
bad "a shard tensor the index does not list" "tensor 'h.0.ln_1.weight' is not listed in the index" \
  'del idx["weight_map"]["h.0.ln_1.weight"]; save()'
bad "a tensor not in the model" "tensor 'h.7.ln_1.weight' is not part of this model" '
f = idx["weight_map"]["h.0.ln_1.weight"]; h, data = st(f); h["h.7.ln_1.weight"] = h["h.0.ln_1.weight"]
h["h.7.ln_1.weight"] = dict(h["h.0.ln_1.weight"], data_offsets=[len(data), len(data) + 128]); st_write(f, h, data + bytes(128))
idx["weight_map"]["h.7.ln_1.weight"] = f; idx["metadata"]["total_size"] += 128; save()'
bad "a missing tensor" "index.json': tensor 'ln_f.bias' is missing" '
f = idx["weight_map"].pop("ln_f.bias"); h, data = st(f); n = h.pop("ln_f.bias"); st_write(f, h, data)
idx["metadata"]["total_size"] -= n["data_offsets"][1] - n["data_offsets"][0]; save()'
bad "a corrupt shard" "model-00002-of-00003.safetensors: header" \
  'p = os.path.join(d, "model-00002-of-00003.safetensors"); raw = open(p, "rb").read(); open(p, "wb").write(raw[:8] + b"[" + raw[9:])'
bad "a shard that is a FIFO (its open would block)" "'model-00002-of-00003.safetensors' is special, not a regular file" \
  'p = os.path.join(d, "model-00002-of-00003.safetensors"); os.remove(p); os.mkfifo(p)'
bad "a shard that is a symbolic link out of the step" "'model-00002-of-00003.safetensors' is a symbolic link, not a regular file" \
  'p = os.path.join(d, "model-00002-of-00003.safetensors"); os.rename(p, p + ".real"); os.symlink(p + ".real", p)'
# the optimizer's index is checked the same way (resume only reads it)
rm -rf "$TMP/bo"; cp -r "$TMP/s1/step_00000010" "$TMP/bo"
python3 -c 'import sys; p = sys.argv[1] + "/optimizer.safetensors.index.json"; t = open(p).read(); open(p, "w").write(t.replace("optimizer-00001", "../optimizer-00001", 1))' "$TMP/bo"
"$DTRAIN" train --resume "$TMP/bo" --set train.stop_after=1 --set checkpoint.dir= --set log.metrics= >"$TMP/bo.out" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/bo.out")" -eq 1 ] && grep -q "optimizer.safetensors.index.json': tensor .* not a plain file name" "$TMP/bo.out" &&
  pass "bad optimizer index: $(grep '^dtrain: error' "$TMP/bo.out")" || fail "bad optimizer index: exit $rc $(tail -1 "$TMP/bo.out")"
finish
