# Pipeline parallelism trains the single-process model: the layer stack cut into stages
# (balanced; a block count pp does not divide too), micro-batches run by the gpipe, 1f1b,
# interleaved (two model chunks per rank) or zb-h1 schedule with activations and
# gradients sent between stages, the tied wte summed over the first and last stage;
# pp 2 and 4, dp 2 x pp 2, pp 2 x tp 2 (with sp) and dp 2 x pp 2 x tp 2 on 8 ranks give
# the single-process loss curve (per-step loss and grad norm, both validation losses)
# within 1e-5 relative, and in bitwise mode its weights bit for bit. Layouts the pipeline does not
# run fail before any work with one line.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
RUN=("${DP_RUN[@]}" --set log.sample_tokens=0)
FIVE=(--set model.n_layer=5)
EIGHT=(--set model.n_layer=8)
IL=(--set parallel.schedule=interleaved --set parallel.virtual_stages=2)
"$DTRAIN" train "${RUN[@]}" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "single-process run"
"$DTRAIN" train "${RUN[@]}" "${FIVE[@]}" --metrics "$TMP/ref5.jsonl" >"$TMP/ref5.out" 2>&1 || fail "single (5 blocks)"
"$DTRAIN" train "${RUN[@]}" "${EIGHT[@]}" --metrics "$TMP/ref8.jsonl" >"$TMP/ref8.out" 2>&1 || fail "single (8 blocks)"
"$DTRAIN" train "${RUN[@]}" --set parallel.micro_batches=8 --metrics "$TMP/refm8.jsonl" >"$TMP/refm8.out" 2>&1 ||
  fail "single (8 micro-batches)"
for layout in "pp2_1f1b:2:ref:--set parallel.pp=2" \
              "pp2_gpipe:2:ref:--set parallel.pp=2 --set parallel.schedule=gpipe" \
              "pp4_1f1b_5blocks:4:ref5:--set parallel.pp=4 ${FIVE[*]}" \
              "pp4_gpipe_5blocks:4:ref5:--set parallel.pp=4 --set parallel.schedule=gpipe ${FIVE[*]}" \
              "pp2_zbh1:2:ref:--set parallel.pp=2 --set parallel.schedule=zb-h1" \
              "pp4_zbh1_5blocks:4:ref5:--set parallel.pp=4 --set parallel.schedule=zb-h1 ${FIVE[*]}" \
              "pp2_interleaved_5blocks:2:ref5:--set parallel.pp=2 ${IL[*]} ${FIVE[*]}" \
              "pp2_split_4_1:2:ref5:--set parallel.pp=2 --set parallel.pp_split=4,1 ${FIVE[*]}" \
              "pp2_interleaved_split:2:ref5:--set parallel.pp=2 ${IL[*]} --set parallel.pp_split=1,2,1,1 ${FIVE[*]}" \
              "pp4_interleaved_8blocks:4:ref8:--set parallel.pp=4 ${IL[*]} ${EIGHT[*]}" \
              "dp2_pp2_interleaved_zero1:4:ref5:--set parallel.pp=2 ${IL[*]} --set parallel.zero=1 ${FIVE[*]}" \
              "dp2_pp2_interleaved_zero3:4:ref5:--set parallel.pp=2 ${IL[*]} --set parallel.zero=3 ${FIVE[*]}" \
              "pp2_tp2_interleaved:4:ref5:--set parallel.pp=2 --set parallel.tp=2 ${IL[*]} ${FIVE[*]}" \
              "dp2_pp2_zbh1_zero1:4:ref:--set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.zero=1" \
              "dp2_pp2_zbh1_zero2:4:ref:--set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.zero=2" \
              "dp2_pp2_zbh1_zero3:4:ref:--set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.zero=3" \
              "dp2_pp2:4:ref:--set parallel.pp=2" \
              "dp2_pp2_gpipe_after:4:ref:--set parallel.pp=2 --set parallel.schedule=gpipe --set parallel.overlap=false" \
              "dp2_pp2_zero1:4:ref:--set parallel.pp=2 --set parallel.zero=1" \
              "dp2_pp2_zero2_gpipe:4:ref:--set parallel.pp=2 --set parallel.zero=2 --set parallel.schedule=gpipe" \
              "dp2_pp2_zero3:4:ref:--set parallel.pp=2 --set parallel.zero=3" \
              "dp2_pp2_ps:4:ref:--set parallel.pp=2 --set parallel.dp_mode=ps" \
              "pp2_tp2_sp:4:ref:--set parallel.pp=2 --set parallel.tp=2 --set parallel.sp=true" \
              "dp2_pp2_tp2:8:ref:--set parallel.pp=2 --set parallel.tp=2" \
              "pp2_m8:2:refm8:--set parallel.pp=2 --set parallel.micro_batches=8" \
              "dp2_pp2_m4:4:ref:--set parallel.pp=2 --set parallel.micro_batches=4"; do
  name=${layout%%:*}; rest=${layout#*:}; np=${rest%%:*}; rest=${rest#*:}; ref=${rest%%:*}; args=${rest#*:}
  case $name in pp2_m8|pp2_1f1b|pp2_gpipe|pp4_1f1b_5blocks|pp2_zbh1|pp2_interleaved_5blocks|pp2_split_4_1|dp2_pp2_zbh1_zero3|dp2_pp2_zero1|dp2_pp2_zero3|pp2_tp2_sp) ;;
    *) full || continue ;; esac
  parity "$name" $np "$TMP/$ref.jsonl" $args
done
grep -q "blocks per stage: \[0, 2) \[2, 3) \[3, 4) \[4, 5)" "$TMP/pp4_1f1b_5blocks.out" &&
  pass "5 blocks over 4 stages: 2 + 1 + 1 + 1" || fail "stage split: $(grep pipeline "$TMP/pp4_1f1b_5blocks.out")"
# parallel.micro_batches m sets the step's micro-batches (the micro-batch is global / (dp·m))
grep -q "micro-batch 1 x 1 data-parallel x 8 accumulation" "$TMP/pp2_m8.out" && grep -q "8 micro-batches per step" "$TMP/pp2_m8.out" &&
  pass "parallel.micro_batches 8: micro-batch 1, 8 micro-batches per step" ||
  fail "parallel.micro_batches: $(grep -E 'global batch|pipeline parallel' "$TMP/pp2_m8.out")"
grep -q "pipeline bubble: measured" "$TMP/pp4_1f1b_5blocks.out" && pass "the summary reports the bubble" ||
  fail "no bubble report"
grep -q "blocks per stage: \[0, 4) \[4, 5)" "$TMP/pp2_split_4_1.out" && pass "parallel.pp_split 4,1: the stages it names" ||
  fail "explicit split: $(grep pipeline "$TMP/pp2_split_4_1.out")"
grep -q "blocks per stage: {\[0, 2) \[3, 4)} {\[2, 3) \[4, 5)}" "$TMP/pp2_interleaved_5blocks.out" &&
  grep -q "formula (p-1)/(v·m+p-1) = 0.111" "$TMP/pp2_interleaved_5blocks.out" &&
  pass "interleaved: each rank holds two chunks (5 blocks in 4 pieces), bubble formula with v" ||
  fail "interleaved stages: $(grep pipeline "$TMP/pp2_interleaved_5blocks.out")"

# each stage holds its blocks (the first and last the tied wte as well, the last with a
# gap the size of wpe so that its unit 0 shards like the first stage's), and 1f1b keeps
# fewer micro-batches in flight than gpipe (activation slots: p - rank against m = 4)
python3 - "$TMP/ref.jsonl" "$TMP/pp2_1f1b.jsonl" "$TMP/pp2_gpipe.jsonl" <<'PY' && pass "stage memory" || fail "stage memory"
import json, sys
mem = lambda p: [r for r in map(json.loads, open(p)) if r.get("event") == "summary"][0]["mem"]
one, f1, gp = mem(sys.argv[1])[0], mem(sys.argv[2]), mem(sys.argv[3])
C, L, Vp, T = 32, 2, 320, 32                       # tests/data/tiny.json
block = 12 * C * C + 13 * C
want = [4 * (Vp * C + T * C + block), 4 * (Vp * C + T * C + block + 2 * C)]   # the last: wte + a wpe-sized gap
print("params per stage %s (want %s); activations 1f1b %s, gpipe %s" %
      ([m["params"] for m in f1], want, [m["activations"] for m in f1], [m["activations"] for m in gp]))
ok = [m["params"] for m in f1] == want and sum(want) == one["params"] + 4 * (Vp * C + T * C)
ok &= f1[0]["activations"] < gp[0]["activations"] and f1[1]["activations"] < gp[1]["activations"]
sys.exit(0 if ok else 1)
PY

# every layout starts from the single-process weights, bit for bit (digest of the whole model)
same_initial_weights "${FIVE[@]}" -- "pp2:2:--set parallel.pp=2" "pp4:4:--set parallel.pp=4" \
  "pp2_tp2:4:--set parallel.pp=2 --set parallel.tp=2"

# checkpoints hold whole tensors: a pp2 save resumes in one process, and a single-process
# save under pp4 (5 blocks) and under pp2 x tp2, each continuing the same curve
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set parallel.pp=2 --set train.stop_after=10 --save "$TMP/c2" \
  --metrics "$TMP/c2.jsonl" >"$TMP/c2.out" 2>&1 || fail "pp2 first half: $(tail -2 "$TMP/c2.out")"
"$DTRAIN" train "${RUN[@]}" --resume "$TMP/c2" --metrics "$TMP/c2.jsonl" >"$TMP/c2r.out" 2>&1 ||
  fail "one process resumes a pp2 checkpoint: $(tail -2 "$TMP/c2r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c2.jsonl") && pass "pp2 save + single resume = single process ($r)" ||
  fail "pp2 -> single: $r"
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" "${FIVE[@]}" --set parallel.pp=2 "${IL[@]}" --set train.stop_after=10 \
  --save "$TMP/ci" --metrics "$TMP/ci.jsonl" >"$TMP/ci.out" 2>&1 || fail "interleaved first half: $(tail -2 "$TMP/ci.out")"
"${MPI[@]}" -np 4 "$DTRAIN" train "${RUN[@]}" "${FIVE[@]}" --set parallel.pp=4 --resume "$TMP/ci" \
  --set parallel.schedule=1f1b --set parallel.virtual_stages=1 \
  --metrics "$TMP/ci.jsonl" >"$TMP/cir.out" 2>&1 || fail "pp4 resumes an interleaved checkpoint: $(tail -2 "$TMP/cir.out")"
r=$(compare_curves "$TMP/ref5.jsonl" "$TMP/ci.jsonl") && pass "interleaved save + pp4 1f1b resume = single process ($r)" ||
  fail "interleaved -> pp4: $r"
Z3=(--set parallel.pp=2 --set parallel.zero=3)
"${MPI[@]}" -np 4 "$DTRAIN" train "${RUN[@]}" "${Z3[@]}" --set train.stop_after=10 --save "$TMP/c3" \
  --metrics "$TMP/c3.jsonl" >"$TMP/c3.out" 2>&1 || fail "dp2 pp2 zero3 first half: $(tail -2 "$TMP/c3.out")"
"${MPI[@]}" -np 4 "$DTRAIN" train "${RUN[@]}" "${Z3[@]}" --resume "$TMP/c3" --metrics "$TMP/c3.jsonl" \
  >"$TMP/c3r.out" 2>&1 || fail "dp2 pp2 zero3 resume: $(tail -2 "$TMP/c3r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c3.jsonl") && pass "dp2 pp2 zero3 save + resume = single process ($r)" ||
  fail "zero3 pp2 resume: $r"
"$DTRAIN" train "${RUN[@]}" "${FIVE[@]}" --set train.stop_after=10 --save "$TMP/c1" --metrics "$TMP/c1.jsonl" \
  >/dev/null 2>&1 || fail "single first half"
cp -r "$TMP/c1" "$TMP/c1b" && cp "$TMP/c1.jsonl" "$TMP/c1b.jsonl"
"${MPI[@]}" -np 4 "$DTRAIN" train "${RUN[@]}" "${FIVE[@]}" --resume "$TMP/c1" --set parallel.pp=4 \
  --metrics "$TMP/c1.jsonl" >"$TMP/c1r.out" 2>&1 || fail "pp4 resumes a single-process checkpoint: $(tail -2 "$TMP/c1r.out")"
r=$(compare_curves "$TMP/ref5.jsonl" "$TMP/c1.jsonl") && pass "single save + pp4 resume = single process ($r)" ||
  fail "single -> pp4: $r"
"${MPI[@]}" -np 4 "$DTRAIN" train "${RUN[@]}" "${FIVE[@]}" --resume "$TMP/c1b" --save "$TMP/c1b" --set parallel.pp=2 \
  --set parallel.tp=2 --metrics "$TMP/c1b.jsonl" >"$TMP/c1br.out" 2>&1 ||
  fail "pp2 tp2 resumes a single-process checkpoint: $(tail -2 "$TMP/c1br.out")"
r=$(compare_curves "$TMP/ref5.jsonl" "$TMP/c1b.jsonl") && pass "single save + pp2 tp2 resume = single process ($r)" ||
  fail "single -> pp2 tp2: $r"

# bitwise mode: the pipeline changes no arithmetic, so every schedule (with any dp and
# ZeRO) lands on the single-process weights bit for bit (the tied wte's head and
# embedding shares are folded apart on every layout, and summed once)
BW=("${RUN[@]}" --set parallel.determinism=bitwise --digest)
"$DTRAIN" train "${BW[@]}" "${FIVE[@]}" >"$TMP/bw5.out" 2>&1 || fail "bitwise single process"
ref=$(digest_of "$TMP/bw5.out")
[ -n "$ref" ] || fail "no bitwise digest"
for layout in "pp2_1f1b:2:--set parallel.pp=2" "pp2_zbh1:2:--set parallel.pp=2 --set parallel.schedule=zb-h1" \
              "pp2_interleaved:2:--set parallel.pp=2 ${IL[*]}" \
              "dp2_pp2_zero1:4:--set parallel.pp=2 --set parallel.zero=1" \
              "pp2_gpipe:2:--set parallel.pp=2 --set parallel.schedule=gpipe" \
              "pp4_1f1b:4:--set parallel.pp=4" "pp4_gpipe:4:--set parallel.pp=4 --set parallel.schedule=gpipe" \
              "pp4_zbh1:4:--set parallel.pp=4 --set parallel.schedule=zb-h1" \
              "dp2_pp2_ps:4:--set parallel.pp=2 --set parallel.dp_mode=ps" \
              "dp2_pp2_zbh1_zero2:4:--set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.zero=2" \
              "dp2_pp2_interleaved_zero3:4:--set parallel.pp=2 ${IL[*]} --set parallel.zero=3"; do
  name=${layout%%:*}; rest=${layout#*:}; np=${rest%%:*}; args=${rest#*:}
  case $name in pp2_1f1b|pp2_zbh1|pp2_interleaved|dp2_pp2_zero1) ;; *) full || continue ;; esac
  "${MPI[@]}" -np $np "$DTRAIN" train "${BW[@]}" "${FIVE[@]}" $args >"$TMP/bw.out" 2>&1
  [ "$(digest_of "$TMP/bw.out")" = "$ref" ] && pass "bitwise $name: the single-process digest" ||
    fail "bitwise $name: $(digest_of "$TMP/bw.out") vs $ref $(grep -v '^\[' "$TMP/bw.out" | tail -2)"
done
if full; then
  "$DTRAIN" train "${BW[@]}" "${EIGHT[@]}" >"$TMP/bw8.out" 2>&1 || fail "bitwise single process (8 blocks)"
  "${MPI[@]}" -np 4 "$DTRAIN" train "${BW[@]}" "${EIGHT[@]}" --set parallel.pp=4 "${IL[@]}" >"$TMP/bw.out" 2>&1
  [ "$(digest_of "$TMP/bw.out")" = "$(digest_of "$TMP/bw8.out")" ] && pass "bitwise pp4 interleaved: the single-process digest" ||
    fail "bitwise pp4 interleaved: $(digest_of "$TMP/bw.out") $(grep -v '^\[' "$TMP/bw.out" | tail -2)"
fi
if full; then
  "${MPI[@]}" -np 2 "$DTRAIN" train "${BW[@]}" "${FIVE[@]}" --set parallel.pp=2 --set train.stop_after=10 \
    --save "$TMP/cb" >"$TMP/cb.out" 2>&1 || fail "bitwise pp2 first half: $(tail -2 "$TMP/cb.out")"
  "$DTRAIN" train "${BW[@]}" "${FIVE[@]}" --resume "$TMP/cb" >"$TMP/cbr.out" 2>&1
  [ "$(digest_of "$TMP/cbr.out")" = "$ref" ] &&
    pass "bitwise: pp2 save + single resume = the straight single-process weights" ||
    fail "bitwise pp2 -> single: $(digest_of "$TMP/cbr.out") $(tail -2 "$TMP/cbr.out")"
fi

# the final sample through the pipeline (the sequence passes the stages, the last one's
# logits are broadcast): in bitwise mode the same text as one process
SAMPLE=(--set log.sample_tokens=40)
"$DTRAIN" train "${BW[@]}" "${FIVE[@]}" "${SAMPLE[@]}" 2>&1 | sed -n '/^--- sample/,/^---$/p' >"$TMP/s1.txt"
for layout in "pp2:2:--set parallel.pp=2" "pp2_interleaved:2:--set parallel.pp=2 ${IL[*]}"; do
  name=${layout%%:*}; rest=${layout#*:}; np=${rest%%:*}; args=${rest#*:}
  [ $name = pp2_interleaved ] || full || continue
  "${MPI[@]}" -np $np "$DTRAIN" train "${BW[@]}" "${FIVE[@]}" "${SAMPLE[@]}" $args 2>&1 |
    sed -n '/^--- sample/,/^---$/p' >"$TMP/s2.txt"
  [ "$(wc -l <"$TMP/s1.txt")" -ge 3 ] && cmp -s "$TMP/s1.txt" "$TMP/s2.txt" &&
    pass "sample under $name = one process's: $(sed -n 2p "$TMP/s2.txt" | cut -c1-30)..." ||
    fail "sample under $name: $(cat "$TMP/s2.txt") vs $(cat "$TMP/s1.txt")"
done

# per-rank memory against `dtrain estimate` (per stage: parameters, gradients, optimizer
# state with ZeRO's formulas over dp, activation slots), within 2%
"$DTRAIN" estimate "${RUN[@]}" --set parallel.pp=2 -n 1 --json >"$TMP/est1.json" 2>&1 || fail "estimate pp2"
"$DTRAIN" estimate "${RUN[@]}" --set parallel.pp=2 --set parallel.zero=1 -n 2 --json >"$TMP/est2.json" 2>&1 ||
  fail "estimate dp2 pp2 zero1"
"$DTRAIN" estimate "${RUN[@]}" --set parallel.pp=2 "${IL[@]}" "${FIVE[@]}" -n 1 --json >"$TMP/est3.json" 2>&1 ||
  fail "estimate pp2 interleaved"
python3 - "$TMP/pp2_1f1b.jsonl" "$TMP/est1.json" "$TMP/dp2_pp2_zero1.jsonl" "$TMP/est2.json" \
  "$TMP/pp2_interleaved_5blocks.jsonl" "$TMP/est3.json" <<'PY' &&
import json, sys
mem = lambda p: [r for r in map(json.loads, open(p)) if r.get("event") == "summary"][0]["mem"]
worst, lines = 0.0, []
for run, est, z, ranks in ((sys.argv[1], sys.argv[2], 0, [0, 1]), (sys.argv[3], sys.argv[4], 1, [0, 1]),
                          (sys.argv[5], sys.argv[6], 0, [0, 1])):
    m, e = mem(run), json.load(open(est))
    n = e["n"]
    for stage, rank in enumerate(ranks):          # world rank of (dp 0, stage): rank = dp·pp + stage
        st = e["stages"][stage]; psi = st["psi"]
        want = {"params": 4 * psi, "grads": 4 * psi, "optim": 8 * psi / (n if z else 1), "activations": st["activations"]}
        got = {k: m[rank][k] for k in want}
        worst = max([worst] + [abs(got[k] - v) / v for k, v in want.items()])
        lines.append("zero %d stage %d: %s vs %s" % (z, stage, got, want))
print("\n".join(lines) + "\nworst %.2e" % worst)
sys.exit(0 if worst <= 0.02 else 1)
PY
  pass "per-stage memory = dtrain estimate" || fail "per-stage memory vs estimate"

refused "more stages than blocks" "cannot give every stage" 4 --set parallel.pp=4
refused "interleaved micro-batches" "multiple of the" 2 --set parallel.pp=2 --set parallel.schedule=interleaved \
  --set parallel.virtual_stages=2 --set train.global_batch=6 "${FIVE[@]}"
refused "virtual stages without interleaving" "needs parallel.schedule interleaved" 2 --set parallel.pp=2 \
  --set parallel.virtual_stages=2 "${FIVE[@]}"
refused "micro-batches that do not divide the global batch" "parallel.micro_batches 3" 2 --set parallel.pp=2 \
  --set parallel.micro_batches=3
refused "unknown schedule" "parallel.schedule" 2 --set parallel.pp=2 --set parallel.schedule=pipedream
refused "a split that does not add up" "parallel.pp_split '3,3'" 2 --set parallel.pp=2 --set parallel.pp_split=3,3 \
  "${FIVE[@]}"
refused "a split that is not a list" "parallel.pp_split '4,x'" 2 --set parallel.pp=2 --set parallel.pp_split=4,x \
  "${FIVE[@]}"
refused "more stages than blocks, with --save" "cannot give every stage" 4 --set parallel.pp=4 --save "$TMP/ck"
[ ! -e "$TMP/ck" ] && pass "a refused layout writes nothing" || fail "a refused layout wrote $TMP/ck"
finish
