# CLI contract (../shared/spec/interface.md): help, config printing, metrics JSONL
# shape, digest line, plain progress lines when stdout is not a TTY, docs in sync.
source "$(dirname "$0")/lib.sh"
prepare_tiny
for cmd in "" train sample prepare config; do
  "$DTRAIN" $cmd --help >"$TMP/help" 2>&1 && grep -q usage "$TMP/help" && pass "help: dtrain $cmd --help" \
    || fail "help for '$cmd'"
done
"$DTRAIN" >/dev/null 2>&1; [ $? -eq 2 ] && pass "no command exits 2" || fail "no command"
# a CUDA build opens cuBLASLt only when the CUDA backend starts: loading it costs every
# process (each rank, CPU runs too) about 0.4 s of CPU
LD_DEBUG=files "$DTRAIN" train "${TINY[@]}" --steps 1 >/dev/null 2>"$TMP/ld.txt" || fail "one CPU step"
grep -q cublasLt "$TMP/ld.txt" && fail "a CPU run loads cuBLASLt" || pass "a CPU run does not load cuBLASLt"
# every key printed by `config --doc` is documented in docs/config.md
"$DTRAIN" config --doc >"$TMP/doc"
missing=$(grep -vxF -f "$SRC/docs/config.md" "$TMP/doc" | head -3)
[ -z "$missing" ] && pass "docs/config.md lists every key" || fail "docs/config.md is stale: $missing"
# --set and --config compose, later wins; values round-trip through `config`
"$DTRAIN" config --config "$SRC/tests/data/tiny.json" --set model.n_layer=3 --steps 7 >"$TMP/cfg.json" \
  || fail "config print"
python3 - "$TMP/cfg.json" <<'PY' && pass "config file + --set + shorthand" || fail "config composition"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model"]["n_layer"] == 3 and c["model"]["n_embd"] == 32 and c["train"]["steps"] == 7, c
PY
# the resolved layout: each rank's coordinates and groups (world 8 = dp 2 x cp 2 x tp 2)
"$DTRAIN" config --config "$SRC/tests/data/tiny.json" --set parallel.tp=2 --set parallel.cp=2 -n 8 >"$TMP/lay.txt" ||
  fail "config -n 8"
grep -q "^layout: world 8 = dp 2 x pp 1 x cp 2 x tp 2" "$TMP/lay.txt" &&
  grep -Eq "^5 +1 +0 +0 +1 +\{4,5\} +\{5,7\} +\{5\} +\{1,5\} +\{1,3,5,7\}" "$TMP/lay.txt" &&
  pass "config -n prints the layout's groups" || fail "layout print: $(tail -3 "$TMP/lay.txt")"
"$DTRAIN" config --config "$SRC/tests/data/tiny.json" --set parallel.tp=4 -n 6 >/dev/null 2>"$TMP/lay.err"
[ $? -eq 2 ] && grep -q "not divisible by tp x pp x cp" "$TMP/lay.err" && pass "config -n: a world the layout does not divide" ||
  fail "config -n 6: $(cat "$TMP/lay.err")"
# the planner: layouts ranked by predicted step time; a bad option is one line, exit 2
"$DTRAIN" plan --config "$SRC/tests/data/tiny.json" -n 4 --flops 1e10 --top 3 >"$TMP/plan.txt" 2>&1 &&
  grep -q "^plan: 4 ranks" "$TMP/plan.txt" && [ "$(grep -c '^[123] ' "$TMP/plan.txt")" -eq 3 ] &&
  pass "plan -n 4 lists the best 3 layouts" || fail "plan: $(tail -3 "$TMP/plan.txt")"
# calibrated here (no --flops): a rate per shard shape and the optimizer's time; 4 ranks
# sharing 2 cores compute at half speed
"$DTRAIN" plan --config "$SRC/tests/data/tiny.json" -n 4 --cores 2 --threads 1 --json --top 100 >"$TMP/plan.json" 2>&1 &&
python3 - "$TMP/plan.json" <<'PY' && pass "plan: calibrated, cores shared" || fail "plan --cores: $(tail -2 "$TMP/plan.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) > 5 and all(r["dp"] * r["pp"] * r["cp"] * r["tp"] == 4 for r in rows), rows
assert all(r["share"] == 2 and r["optim_s"] > 0 and r["step_s"] >= 2 * r["compute_s"] for r in rows), rows[0]
PY
# --load 2: the rates measured with 2 copies at once (a loaded rank's), so no core sharing
# is counted on top; with --cores it is refused
"$DTRAIN" plan --config "$SRC/tests/data/tiny.json" -n 2 --load 2 --threads 1 --json --top 100 >"$TMP/plan.json" 2>&1 &&
python3 - "$TMP/plan.json" <<'PY' && pass "plan --load 2: calibrated under load" || fail "plan --load: $(tail -2 "$TMP/plan.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) > 2 and all(r["share"] == 1 and r["compute_s"] > 0 and r["optim_s"] > 0 for r in rows), rows
PY
"$DTRAIN" plan --config "$SRC/tests/data/tiny.json" -n 4 --load 4 --cores 2 >/dev/null 2>"$TMP/plan.err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/plan.err")" -eq 1 ] && grep -q "not with --cores" "$TMP/plan.err" &&
  pass "plan: --load with --cores refused" || fail "plan --load --cores: $(cat "$TMP/plan.err")"
"$DTRAIN" plan --config "$SRC/tests/data/tiny.json" --set model.n_embd=1024 --set model.n_head=16 -n 4 --load 4096 \
  >/dev/null 2>"$TMP/plan.err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/plan.err")" -eq 1 ] && grep -q "4096 calibrations at once need" "$TMP/plan.err" &&
  pass "plan: --load beyond memory refused before forking" || fail "plan --load 4096: $(cat "$TMP/plan.err")"
# `bench comm` fits alpha-beta per sweep and prints what `plan --intra/--inter` takes
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if command -v mpirun >/dev/null; then
mpirun --oversubscribe --mca btl self,vader -np 2 "$DTRAIN" bench comm --ops allreduce --algos ring --sizes 4K:1M \
  >"$TMP/bc.txt" 2>&1 || fail "bench comm: $(tail -2 "$TMP/bc.txt")"
link=$(grep -oE '^# fit allreduce ring: alpha .* \(dtrain plan --intra or --inter [0-9.e+-]+:[0-9.e+-]+\)$' "$TMP/bc.txt" |
       grep -oE '[0-9.e+-]+:[0-9.e+-]+')
[ -n "$link" ] && "$DTRAIN" plan --config "$SRC/tests/data/tiny.json" -n 4 --flops 1e10 --intra "$link" --top 1 >/dev/null &&
  pass "bench comm's fit ($link) feeds plan --intra" || fail "bench comm fit: $(grep fit "$TMP/bc.txt")"
# --group 2 of 4 ranks: two all-reduces of 2 ranks at once (a link under its layout's load)
mpirun --oversubscribe --mca btl self,vader -np 4 "$DTRAIN" bench comm --ops allreduce --algos ring --sizes 4K:64K \
  --group 2 >"$TMP/bc.txt" 2>&1 && grep -q "^# bench comm: 2 ranks in each of 2 groups at once" "$TMP/bc.txt" &&
  [ "$(grep -c '^allreduce .* ring ' "$TMP/bc.txt")" -eq 3 ] && pass "bench comm --group 2 of 4" ||
  fail "bench comm --group: $(tail -2 "$TMP/bc.txt")"
# --between: computation before each call, the call's time the loop's less the computation's
mpirun --oversubscribe --mca btl self,vader -np 4 "$DTRAIN" bench comm --ops allreduce --algos ring --sizes 64K:1M \
  --group 2 --between 2000 --iters 5 >"$TMP/bc.txt" 2>&1 && grep -q "^# between calls: computation per rank" "$TMP/bc.txt" &&
  [ "$(grep -c '^allreduce .* ring ' "$TMP/bc.txt")" -eq 3 ] &&
  grep -qE "^# fit allreduce ring: .*--inter [0-9.e+-]+:[0-9.e+-]+\)$" "$TMP/bc.txt" && pass "bench comm --between" ||
  fail "bench comm --between: $(tail -3 "$TMP/bc.txt")"
mpirun --oversubscribe --mca btl self,vader -np 4 "$DTRAIN" bench comm --group 3 >/dev/null 2>"$TMP/bc.err"
[ $? -eq 2 ] && grep -q "group 3 does not divide the 4 ranks" "$TMP/bc.err" && pass "bench comm: --group 3 of 4 refused" ||
  fail "bench comm --group 3: $(cat "$TMP/bc.err")"
fi
# nothing fits: that one line (not a refused layout's), exit 2
"$DTRAIN" plan --config "$SRC/tests/data/tiny.json" -n 4 --flops 1e10 --memory 0.000001 >/dev/null 2>"$TMP/plan.err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/plan.err")" -eq 1 ] && grep -q "no layout of 4 ranks fits" "$TMP/plan.err" &&
  pass "plan: nothing fits, one line" || fail "plan --memory tiny: $(cat "$TMP/plan.err")"
"$DTRAIN" plan --config "$SRC/tests/data/tiny.json" -n 4 --flops 1e10 --intra fast >/dev/null 2>"$TMP/plan.err"
[ $? -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/plan.err")" -eq 1 ] && grep -q "ALPHA:GBPS" "$TMP/plan.err" &&
  pass "plan: a bad link is refused" || fail "plan --intra fast: $(cat "$TMP/plan.err")"
# metrics JSONL: every step line, val lines, a summary with per-rank memory
"$DTRAIN" train "${TINY[@]}" --steps 6 --set train.val_every=3 --metrics "$TMP/m.jsonl" --digest >"$TMP/out" 2>&1 \
  || fail "train"
python3 - "$TMP/m.jsonl" <<'PY' && pass "metrics JSONL follows interface.md" || fail "metrics format"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "event" not in l]
assert [s["step"] for s in steps] == list(range(1, 7))
for s in steps:
    assert set(s) >= {"step", "loss", "lr", "grad_norm", "tokens_per_s", "ms"}, s
vals = [l for l in lines if l.get("event") == "val"]
assert [v["step"] for v in vals] == [3, 6] and all("val_loss" in v for v in vals), vals
summ = [l for l in lines if l.get("event") == "summary"]
assert len(summ) == 1 and lines[-1] is summ[0]
s = summ[0]
assert s["steps"] == 6 and s["final_loss"] == steps[-1]["loss"] and s["tokens_per_s"] > 0
m = s["mem"][0]
assert all(m[k] > 0 for k in ("params", "grads", "optim", "activations", "peak_rss")), m
assert m["optim"] == 2 * m["params"]
PY
grep -qE '^digest sha256:[0-9a-f]{64}$' "$TMP/out" && pass "digest line" || fail "digest line"
grep -qE '^step 6/6 \| loss [0-9.]+ \| lr' "$TMP/out" && ! grep -q $'\r' "$TMP/out" \
  && pass "plain progress lines when not a TTY" || fail "progress lines"
grep -q '^summary: ' "$TMP/out" && pass "final summary" || fail "summary"
# the same seed gives the same weights; another seed does not
d1=$(digest_of "$TMP/out")
"$DTRAIN" train "${TINY[@]}" --steps 6 --digest >"$TMP/out2" 2>&1
"$DTRAIN" train "${TINY[@]}" --steps 6 --seed 43 --digest >"$TMP/out3" 2>&1
[ "$d1" = "$(digest_of "$TMP/out2")" ] && [ "$d1" != "$(digest_of "$TMP/out3")" ] \
  && pass "deterministic for a seed" || fail "determinism"
finish
