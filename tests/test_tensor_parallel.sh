# Tensor parallelism (Megatron layout, vocabulary-parallel embedding and loss) and
# sequence parallelism train the single-process model: tp 2, tp 4 and dp 2 x tp 2 (with
# and without sp, gradient accumulation 4 or 2) give the single-process loss curve
# (per-step loss and grad norm, both validation losses) within 1e-5 relative; each rank
# holds 1/tp of the split tensors (exactly the bytes the layout implies) and with sp
# about 1/tp of the LayerNorm/residual activations; in bitwise mode tp 2 and 4 with dp, ZeRO,
# the central rank and pipelines give the single process's weights bit for bit; invalid
# layouts fail before any work.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
RUN=("${DP_RUN[@]}") # the base arguments of parity, refused and same_initial_weights
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "single-process run"
for layout in "tp2:2:--set parallel.tp=2" "dp2_tp2:4:--set parallel.tp=2" \
              "dp2_tp2_after:4:--set parallel.tp=2 --set parallel.overlap=false" \
              "dp2_tp2_zero1:4:--set parallel.tp=2 --set parallel.zero=1" \
              "dp2_tp2_zero3:4:--set parallel.tp=2 --set parallel.zero=3" \
              "dp2_tp2_ps:4:--set parallel.tp=2 --set parallel.dp_mode=ps" \
              "dp2_tp2_zero2:4:--set parallel.tp=2 --set parallel.zero=2" \
              "tp2_sp:2:--set parallel.tp=2 --set parallel.sp=true" \
              "dp2_tp2_sp_zero3:4:--set parallel.tp=2 --set parallel.sp=true --set parallel.zero=3"; do
  name=${layout%%:*}; rest=${layout#*:}; np=${rest%%:*}; args=${rest#*:}
  case $name in tp2|tp2_sp|dp2_tp2|dp2_tp2_zero3|dp2_tp2_sp_zero3) ;; *) full || continue ;; esac
  parity "$name" $np "$TMP/ref.jsonl" $args
done
grep -q "tensor parallel 2" "$TMP/tp2.out" && pass "the header names the layout" || fail "header: $(head -5 "$TMP/tp2.out")"

# parameter bytes per rank: replicated tensors whole, the split ones halved
python3 - "$TMP/ref.jsonl" "$TMP/tp2.jsonl" <<'PY' && pass "tp2 ranks hold half of the split tensors" || fail "tp2 memory"
import json, sys
mem = lambda p: [r for r in map(json.loads, open(p)) if r.get("event") == "summary"][0]["mem"]
C, L, Vp, T = 32, 2, 320, 32   # tests/data/tiny.json
split = L * (12 * C * C + 7 * C) + Vp * C     # c_attn w+b, attn c_proj w, c_fc w+b, mlp c_proj w; wte
replicated = T * C + L * 6 * C + 2 * C         # wpe, ln_1/ln_2, the c_proj biases, ln_f
one, two = mem(sys.argv[1])[0]["params"], [m["params"] for m in mem(sys.argv[2])]
print("params: 1 rank %d B, tp2 ranks %s B" % (one, two))
sys.exit(0 if one == 4 * (split + replicated) and two == [4 * (split // 2 + replicated)] * 2 else 1)
PY

# per-rank memory (params, grads, optimizer, activations) against `dtrain estimate`
"$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.tp=2 -n 2 --json > "$TMP/est.json" 2>&1 || fail "estimate tp2"
python3 - "$TMP/dp2_tp2.jsonl" "$TMP/est.json" <<'PY' && pass "dp2 x tp2 memory = dtrain estimate" || fail "tp memory vs estimate"
import json, sys
mem = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "summary"][0]["mem"]
est = json.load(open(sys.argv[2]))
z0 = est["fp32"][0]
want = {"params": z0["params"], "grads": z0["grads"], "optim": z0["optim"], "activations": est["activations"]}
worst = max(abs(m[k] - v) / v for m in mem for k, v in want.items())
print("estimate %s; measured rank 0 %s; worst %.2e" % (want, {k: mem[0][k] for k in want}, worst))
sys.exit(0 if worst <= 0.02 and len(mem) == 4 else 1)
PY

# sequence parallelism: activations per rank = the estimate's, the LayerNorm/residual
# rows about halved, and fewer bytes in all than tp2 without sp
"$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.tp=2 -n 1 --json > "$TMP/est_tp.json" 2>&1 || fail "estimate tp2"
"$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.tp=2 --set parallel.sp=true -n 1 --json > "$TMP/est_sp.json" 2>&1 ||
  fail "estimate tp2 sp"
python3 - "$TMP/tp2_sp.jsonl" "$TMP/tp2.jsonl" "$TMP/est_sp.json" "$TMP/est_tp.json" <<'PY' &&
import json, sys
act = lambda p: [m["activations"] for m in [r for r in map(json.loads, open(p)) if r.get("event") == "summary"][0]["mem"]]
sp, tp = act(sys.argv[1]), act(sys.argv[2])
esp, etp = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
seq = esp["activation_regions"]["sequence"] / etp["activation_regions"]["sequence"]
print("activations per rank: tp2 %s, tp2+sp %s (estimate %d); LayerNorm/residual rows x%.3f" %
      (tp, sp, esp["activations"], seq))
sys.exit(0 if all(abs(a - esp["activations"]) <= 0.02 * esp["activations"] and a < b for a, b in zip(sp, tp))
         and len(sp) == 2 and 0.45 <= seq <= 0.55 else 1)
PY
  pass "tp2 sp activations = estimate, LayerNorm/residual rows halved" || fail "sp activations"

# tp 4 (4 heads) and a vocabulary that tp does not divide (299: the last piece holds
# real rows and padding)
SIX=(--set model.n_head=4 --set model.vocab_size=299)
"$DTRAIN" train "${DP_RUN[@]}" "${SIX[@]}" --metrics "$TMP/ref4.jsonl" >"$TMP/ref4.out" 2>&1 || fail "single (4 heads)"
if "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" "${SIX[@]}" --set parallel.tp=4 --metrics "$TMP/tp4.jsonl" \
   >"$TMP/tp4.out" 2>&1; then
  r=$(compare_curves "$TMP/ref4.jsonl" "$TMP/tp4.jsonl") && pass "tp4, vocabulary 299, matches single process ($r)" ||
    fail "tp4: $r"
else
  fail "tp4 run: $(tail -2 "$TMP/tp4.out")"
fi
if "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" "${SIX[@]}" --set parallel.tp=4 --set parallel.sp=true \
   --metrics "$TMP/tp4sp.jsonl" >"$TMP/tp4sp.out" 2>&1; then
  r=$(compare_curves "$TMP/ref4.jsonl" "$TMP/tp4sp.jsonl") && pass "tp4 sp, vocabulary 299, matches single process ($r)" ||
    fail "tp4 sp: $r"
else
  fail "tp4 sp run: $(tail -2 "$TMP/tp4sp.out")"
fi

# every layout starts from the single-process weights, bit for bit
same_initial_weights "${SIX[@]}" -- "tp2:2:--set parallel.tp=2" "tp4:4:--set parallel.tp=4" \
  "dp2_tp2_zero3:4:--set parallel.tp=2 --set parallel.zero=3"

# checkpoints hold whole tensors: tp2 saves and resumes; a tp2 checkpoint resumes in one
# process and a single-process one under tp2, each continuing the same curve
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --set parallel.tp=2 --set train.stop_after=10 --save "$TMP/c2" \
  --metrics "$TMP/c2.jsonl" >"$TMP/c2.out" 2>&1 || fail "tp2 first half"
cp -r "$TMP/c2" "$TMP/c2copy" && cp "$TMP/c2.jsonl" "$TMP/c2b.jsonl"
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/c2" --set parallel.tp=2 --metrics "$TMP/c2.jsonl" \
  >"$TMP/c2r.out" 2>&1 || fail "tp2 resume"
grep -q "tensor parallel 2" "$TMP/c2r.out" && pass "the resumed run is tp2" || fail "the resumed run is not tp2"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c2.jsonl") && pass "tp2 save + tp2 resume = single process ($r)" ||
  fail "tp2 resume: $r"
"$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/c2copy" --save "$TMP/c2copy" --metrics "$TMP/c2b.jsonl" \
  > "$TMP/c2b.out" 2>&1 || fail "one process resumes a tp2 checkpoint: $(tail -2 "$TMP/c2b.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c2b.jsonl") && pass "tp2 save + single resume = single process ($r)" ||
  fail "tp2 -> single: $r"
"$DTRAIN" train "${DP_RUN[@]}" --set train.stop_after=10 --save "$TMP/c1" --metrics "$TMP/c1.jsonl" > /dev/null 2>&1 ||
  fail "single first half"
for z in 1 3; do cp -r "$TMP/c1" "$TMP/c1z$z" && cp "$TMP/c1.jsonl" "$TMP/z$z.jsonl"; done
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/c1" --set parallel.tp=2 --metrics "$TMP/c1.jsonl" \
  >"$TMP/c1r.out" 2>&1 || fail "tp2 resumes a single-process checkpoint: $(tail -2 "$TMP/c1r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c1.jsonl") && pass "single save + tp2 resume = single process ($r)" ||
  fail "single -> tp2: $r"
if full; then # (the ASan pass: the other resumes take these paths)
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --set parallel.tp=2 --set parallel.zero=1 --set train.stop_after=10 \
    --save "$TMP/cz" --metrics "$TMP/cz.jsonl" >"$TMP/cz.out" 2>&1 || fail "dp2 tp2 zero1 first half"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/cz" --set parallel.tp=2 --set parallel.zero=0 \
    --metrics "$TMP/cz.jsonl" >"$TMP/czr.out" 2>&1 || fail "tp2 resumes a dp2 tp2 zero1 checkpoint: $(tail -2 "$TMP/czr.out")"
  r=$(compare_curves "$TMP/ref.jsonl" "$TMP/cz.jsonl") && pass "dp2 tp2 zero1 save + tp2 resume = single process ($r)" ||
    fail "zero1+tp2 -> tp2: $r"
fi
# ZeRO with tp loads checkpoints too (each rank reads its pieces, then its shard of them)
for z in $(full && echo 1 3 || echo 3); do
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/c1z$z" --save "$TMP/c1z$z" --set parallel.tp=2 \
    --set parallel.zero=$z --metrics "$TMP/z$z.jsonl" >"$TMP/z$z.out" 2>&1 || fail "dp2 tp2 zero$z resumes: $(tail -2 "$TMP/z$z.out")"
  r=$(compare_curves "$TMP/ref.jsonl" "$TMP/z$z.jsonl") &&
    pass "single save + dp2 tp2 zero$z resume = single process ($r)" || fail "single -> zero$z tp2: $r"
done
if full; then
  PS=(--set parallel.tp=2 --set parallel.dp_mode=ps)
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" "${PS[@]}" --set train.stop_after=10 --save "$TMP/cp" \
    --metrics "$TMP/cp.jsonl" >"$TMP/cp.out" 2>&1 || fail "dp2 tp2 ps first half"
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" "${PS[@]}" --resume "$TMP/cp" --metrics "$TMP/cp.jsonl" \
    >"$TMP/cpr.out" 2>&1 || fail "dp2 tp2 ps resume: $(tail -2 "$TMP/cpr.out")"
  r=$(compare_curves "$TMP/ref.jsonl" "$TMP/cp.jsonl") && pass "dp2 tp2 ps save + resume = single process ($r)" ||
    fail "ps+tp2 resume: $r"
fi

# the final sample: the tensor-parallel ranks of the first replica draw it together from
# vocabulary-parallel logits (ZeRO-3 gathers the weights first): the single-process text
"$DTRAIN" train "${DP_RUN[@]}" --set log.sample_tokens=40 >"$TMP/s1.out" 2>&1 || fail "single-process sample run"
"${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --set parallel.tp=2 --set parallel.zero=3 --set log.sample_tokens=40 \
  >"$TMP/s4.out" 2>&1 || fail "dp2 tp2 zero3 sample run: $(tail -2 "$TMP/s4.out")"
s1=$(sed -n '/^--- sample/,/^---$/p' "$TMP/s1.out"); s4=$(sed -n '/^--- sample/,/^---$/p' "$TMP/s4.out")
[ -n "$s1" ] && [ "$s1" = "$s4" ] && pass "dp2 tp2 zero3 samples the single-process text" ||
  fail "samples differ: '$s1' vs '$s4'"

# bitwise mode (src/model/tp_chunks.c): every tensor-parallel sum in 4 canonical chunks
# summed by one tree, the same in one process: tp 2 and 4, with dp and each ZeRO stage,
# the central rank, pipelines, recompute, sequence parallelism (its norms' weight
# gradients over every piece's rows, its reduce-scatter the tree's) and other thread
# counts end on the single process's weights bit for bit, and each rank allocates the
# estimate to the byte
H4=(--set model.n_head=4)
bref=$(dp_run bw1 1 "${H4[@]}" --set parallel.determinism=bitwise)
[ -n "$bref" ] && pass "bitwise single process: $bref" || fail "bitwise single process: $(tail -2 "$TMP/bw1.out")"
for lay in "tp2:2:--set parallel.tp=2" "tp4:4:--set parallel.tp=4" "dp2_tp2_zero3:4:--set parallel.tp=2 --set parallel.zero=3" \
           "pp2_tp2:4:--set parallel.tp=2 --set parallel.pp=2" "dp2_tp2:4:--set parallel.tp=2" \
           "dp2_tp2_zero1:4:--set parallel.tp=2 --set parallel.zero=1" "dp2_tp2_zero2:4:--set parallel.tp=2 --set parallel.zero=2" \
           "dp2_tp2_ps:4:--set parallel.tp=2 --set parallel.dp_mode=ps" \
           "pp2_tp2_zbh1:4:--set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=zb-h1" \
           "tp2_recompute:2:--set parallel.tp=2 --set train.recompute=full" \
           "tp2_threads2:2:--set parallel.tp=2 --threads 2" "tp2_sp:2:--set parallel.tp=2 --set parallel.sp=true" \
           "tp4_sp:4:--set parallel.tp=4 --set parallel.sp=true" \
           "dp2_tp2_sp_zero3:4:--set parallel.tp=2 --set parallel.sp=true --set parallel.zero=3" \
           "pp2_tp2_sp:4:--set parallel.tp=2 --set parallel.sp=true --set parallel.pp=2"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
  case $name in tp2|dp2_tp2_zero3|tp2_sp) ;; *) full || continue ;; esac
  got=$(OMP_NUM_THREADS=$([ $name = tp2_threads2 ] && echo 2 || echo 1) dp_run "bw_$name" "$np" "${H4[@]}" \
        --set parallel.determinism=bitwise $args)
  [ -n "$bref" ] && [ "$got" = "$bref" ] && pass "bitwise $name: the single process's digest" ||
    fail "bitwise $name: $got vs $bref $(grep -m1 error "$TMP/bw_$name.out")"
done
"$DTRAIN" estimate "${DP_RUN[@]}" "${H4[@]}" --set parallel.determinism=bitwise --set parallel.tp=2 --set parallel.zero=3 \
  -n 2 --json >"$TMP/bwe.json" || fail "estimate bitwise dp2 tp2 zero3"
r=$(alloc_is_estimate "$TMP/bw_dp2_tp2_zero3.jsonl" "$TMP/bwe.json" 4) && pass "bitwise dp2 tp2 zero3: allocation = estimate ($r)" ||
  fail "bitwise dp2 tp2 zero3 memory: $r"
refused "bitwise tp 8 (4 chunks)" "4 canonical chunks, which tp must divide" 8 --set parallel.tp=8 --set model.n_head=8 \
  --set parallel.determinism=bitwise
# bf16: each leaf and tree node rounded to bf16, in one process as across the ranks
full && bref16=$(dp_run bw16 1 "${H4[@]}" --set parallel.determinism=bitwise --set precision=bf16)
full && for lay in "tp2:2:--set parallel.tp=2" "tp4:4:--set parallel.tp=4" "dp2_tp2_zero3:4:--set parallel.tp=2 --set parallel.zero=3" \
                  "tp2_sp:2:--set parallel.tp=2 --set parallel.sp=true"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
  got=$(dp_run "bw16_$name" "$np" "${H4[@]}" --set parallel.determinism=bitwise --set precision=bf16 $args)
  [ -n "$bref16" ] && [ "$got" = "$bref16" ] && [ "$bref16" != "$bref" ] && pass "bitwise bf16 $name: the bf16 single process's digest" ||
    fail "bitwise bf16 $name: $got vs $bref16 $(grep -m1 error "$TMP/bw16_$name.out")"
done
refused "bitwise tp without the chunks" "bitwise with parallel.tp_chunks 1" 2 --set parallel.tp=2 \
  --set parallel.tp_chunks=1 --set parallel.determinism=bitwise
refused "n_head % tp" "must divide model.n_head" 2 --set parallel.tp=2 --set model.n_head=1
refused "vocabulary % tp" "padded vocabulary" 3 --set parallel.tp=3 --set model.n_head=3 --set model.n_embd=48
refused "world % tp" "not divisible by tp" 3 --set parallel.tp=2
refused "sp without tp" "parallel.sp needs parallel.tp" 2 --set parallel.sp=true
refused "a checkpoint of another shape" "the model needs" 2 --set parallel.tp=2 --set parallel.zero=1 \
  --set model.n_embd=64 --set train.init_from="$TMP/c1/step_00000010/model.safetensors"
refused "a micro-batch that does not split" "do not split" 2 --set parallel.tp=2 --set parallel.sp=true \
  --set train.seq_len=31 --set train.micro_batch=1
refused "sp with the final sample" "sample" 2 --set parallel.tp=2 --set parallel.sp=true --set log.sample_tokens=10 \
  --save "$TMP/ck"
[ ! -e "$TMP/ck" ] && pass "a refused layout writes nothing" || fail "a refused layout wrote $TMP/ck"
finish
