# Context parallelism trains the single-process model: each sequence cut into 2·cp chunks,
# rank i of the cp group holding chunks i and 2·cp−1−i (equal causal work), attention by
# ring (keys and values passed around the cp group, dk and dv back to their owners),
# gradients reduced over data- and context-parallel ranks together. cp 2 and 4, with tp
# (and sp), dp and ZeRO, pp, and 8-rank 4D layouts give the single-process loss curve
# (per-step loss and grad norm, both validation losses) within 1e-5 relative; every
# layout starts from the single-process weights; activations per rank shrink by about cp
# (measured, and as `dtrain estimate` says); a cp checkpoint resumes in one process; bad
# layouts fail before any work with one line. In bitwise mode (parallel.cp_chunks) the
# same layouts give the single process's weights bit for bit.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
RUN=("${DP_RUN[@]}" --set log.sample_tokens=0)
"$DTRAIN" train "${RUN[@]}" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "single-process run"
for layout in "cp2:2:--set parallel.cp=2" \
              "cp2_tp2:4:--set parallel.cp=2 --set parallel.tp=2" \
              "dp2_cp2_zero1:4:--set parallel.cp=2 --set parallel.zero=1" \
              "cp4:4:--set parallel.cp=4" \
              "cp2_tp2_sp:4:--set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true" \
              "pp2_cp2:4:--set parallel.cp=2 --set parallel.pp=2" \
              "dp2_cp2_zero3:4:--set parallel.cp=2 --set parallel.zero=3" \
              "dp2_cp2_tp2_zero1:8:--set parallel.cp=2 --set parallel.tp=2 --set parallel.zero=1" \
              "pp2_cp2_tp2:8:--set parallel.pp=2 --set parallel.cp=2 --set parallel.tp=2" \
              "dp2_pp2_cp2_zero3:8:--set parallel.pp=2 --set parallel.cp=2 --set parallel.zero=3"; do
  name=${layout%%:*}; rest=${layout#*:}; np=${rest%%:*}; args=${rest#*:}
  case $name in cp2|cp2_tp2|dp2_cp2_zero1) ;; *) full || continue ;; esac
  parity "$name" $np "$TMP/ref.jsonl" $args
done
grep -q "context parallel 2 (ring attention; each rank holds 2 of 4 sequence chunks, 16 positions; .*imbalance 0.0%)" \
  "$TMP/cp2.out" && pass "the header reports the chunking and equal attention work" ||
  fail "cp header: $(grep 'context parallel' "$TMP/cp2.out")"

same_initial_weights -- "cp2:2:--set parallel.cp=2" "cp2_tp2:4:--set parallel.cp=2 --set parallel.tp=2"

# activations per rank: measured against the single process, and against the estimate
"$DTRAIN" estimate "${RUN[@]}" --set parallel.cp=2 -n 1 --json >"$TMP/est.json" 2>&1 || fail "estimate cp2"
python3 - "$TMP/ref.jsonl" "$TMP/cp2.jsonl" "$TMP/est.json" <<'PY' && pass "activations per rank shrink with cp, as estimated" ||
import json, sys
mem = lambda p: [r for r in map(json.loads, open(p)) if r.get("event") == "summary"][0]["mem"]
one, cp = mem(sys.argv[1])[0]["activations"], [m["activations"] for m in mem(sys.argv[2])]
est = json.load(open(sys.argv[3]))["activations"]
print("activations: one process %d, cp2 ranks %s (ratio %.3f), estimate %d" % (one, cp, cp[0] / one, est))
sys.exit(0 if cp[0] == cp[1] and cp[0] / one < 0.6 and abs(cp[0] - est) / est <= 0.02 else 1)
PY
  fail "cp activations"

# checkpoints hold whole tensors: a cp2 save resumes in one process on the same curve
"${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set parallel.cp=2 --set train.stop_after=10 --save "$TMP/ck" \
  --metrics "$TMP/ck.jsonl" >"$TMP/ck.out" 2>&1 || fail "cp2 first half: $(tail -2 "$TMP/ck.out")"
"$DTRAIN" train "${RUN[@]}" --resume "$TMP/ck" --set parallel.cp=1 --metrics "$TMP/ck.jsonl" >"$TMP/ckr.out" 2>&1 ||
  fail "one process resumes a cp2 checkpoint: $(tail -2 "$TMP/ckr.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/ck.jsonl") && pass "cp2 save + single resume = single process ($r)" ||
  fail "cp2 -> single: $r"

refused "a sequence 2·cp does not divide" "must split into 2 x cp = 6" 3 --set parallel.cp=3
refused "a world cp does not divide" "not divisible by tp x pp x cp" 3 --set parallel.cp=2
# each rank holds 6 of 12 positions: 6 rows do not split over tp 4 (the whole 12 would)
refused "sp rows per rank under cp" "1 x 6 tokens do not split into parallel.tp 4" 8 --set parallel.cp=2 \
  --set parallel.tp=4 --set parallel.sp=true --set model.n_head=4 --set train.micro_batch=1 --set train.seq_len=12
# bitwise mode (src/parallel/model_parallel/cp_chunks.c): the sequence in parallel.cp_chunks
# canonical chunks, in one process as across the cp ranks: cp 2 and 4, with dp and ZeRO-3,
# tp, pp, recompute and other thread counts end on the single process's weights bit for
# bit, and each rank allocates the estimate to the byte
BW=(--set model.n_head=4 --set parallel.determinism=bitwise --set log.sample_tokens=0)
bref=$(dp_run cbw1 1 "${BW[@]}" --set parallel.cp_chunks=4)
bref8=$(full && dp_run cbw8 1 "${BW[@]}" --set parallel.cp_chunks=8)
[ -n "$bref" ] && pass "bitwise single process with 4 sequence chunks: $bref" ||
  fail "bitwise single process: $(tail -2 "$TMP/cbw1.out")"
if full; then
  plain=$(dp_run cbw0 1 "${BW[@]}")
  [ -n "$plain" ] && [ "$plain" != "$bref" ] && pass "the chunks change the bits (another canonical order)" ||
    fail "bitwise without chunks: '$plain' vs '$bref'"
fi
for lay in "cp2:2:4:--set parallel.cp=2" "dp2_cp2_zero3_threads2:4:4:--set parallel.cp=2 --set parallel.zero=3" \
           "cp2_tp2:4:4:--set parallel.cp=2 --set parallel.tp=2" "cp4:4:8:--set parallel.cp=4" \
           "cp2_of8:2:8:--set parallel.cp=2" "dp2_tp2_cp2:8:4:--set parallel.cp=2 --set parallel.tp=2" \
           "pp2_cp2:4:4:--set parallel.cp=2 --set parallel.pp=2" \
           "pp2_cp2_zbh1:4:4:--set parallel.cp=2 --set parallel.pp=2 --set parallel.schedule=zb-h1" \
           "cp2_recompute:2:4:--set parallel.cp=2 --set train.recompute=full" \
           "tp2_chunks:2:4:--set parallel.tp=2" "cp2_tp2_sp:4:4:--set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; rest=${rest#*:}; q=${rest%%:*}; args=${rest#*:}
  case $name in cp2|dp2_cp2_zero3_threads2) ;; *) full || continue ;; esac
  th=1; case $name in *threads2) th=2 ;; esac
  want=$([ "$q" = 8 ] && echo "$bref8" || echo "$bref")
  got=$(OMP_NUM_THREADS=$th dp_run "cbw_$name" "$np" "${BW[@]}" --set parallel.cp_chunks=$q --threads $th $args)
  [ -n "$want" ] && [ "$got" = "$want" ] && pass "bitwise $name: the single process's digest ($q chunks)" ||
    fail "bitwise $name: $got vs $want $(grep -m1 error "$TMP/cbw_$name.out")"
done
# packed documents: each row's documents masked apart, blocks ending with them, positions
# restarting at each (the embeddings' runs over the gathered sequence)
if full; then
  prepare_prompt_docs
  DOCS=(--set "data.train=$TMP/d_train.bin" --set "data.val=$TMP/d_val.bin" --set data.layout=pack)
  dref=$(dp_run cbwd1 1 "${BW[@]}" "${DOCS[@]}" --set parallel.cp_chunks=4)
  got=$(dp_run cbwd2 2 "${BW[@]}" "${DOCS[@]}" --set parallel.cp_chunks=4 --set parallel.cp=2)
  [ -n "$dref" ] && [ "$got" = "$dref" ] && pass "bitwise cp2 with packed documents: the single process's digest" ||
    fail "bitwise cp2 documents: $got vs $dref $(grep -m1 error "$TMP/cbwd2.out")"
fi
"$DTRAIN" estimate "${RUN[@]}" "${BW[@]}" --set parallel.cp_chunks=4 --set parallel.cp=2 --set parallel.zero=3 \
  -n 2 --json >"$TMP/cbwe.json" || fail "estimate bitwise dp2 cp2 zero3"
r=$(alloc_is_estimate "$TMP/cbw_dp2_cp2_zero3_threads2.jsonl" "$TMP/cbwe.json" 4) && pass "bitwise dp2 cp2 zero3: allocation = estimate ($r)" ||
  fail "bitwise dp2 cp2 zero3 memory: $r"
refused "bitwise cp without the chunks" "needs parallel.cp_chunks" 2 --set parallel.cp=2 \
  --set parallel.determinism=bitwise
refused "bitwise cp4 with 4 chunks" "cp_chunks must be a multiple of 2 x cp" 4 --set parallel.cp=4 \
  --set parallel.cp_chunks=4 --set parallel.determinism=bitwise
refused "bitwise tp2 x cp4 with 4 tp chunks" "tp_chunks must be a multiple of tp x cp" 8 --set parallel.cp=4 \
  --set parallel.tp=2 --set model.n_head=4 --set parallel.cp_chunks=8 --set parallel.determinism=bitwise
# the final sample: one sequence of 1, 2, ... positions, which the chunks cannot cut; without
# cp ranks they step aside for it (dt_par_gather_full), the weights' digest unchanged
out=$("$DTRAIN" train "${RUN[@]}" "${BW[@]}" --set parallel.cp_chunks=4 --set log.sample_tokens=20 --digest 2>&1)
[ -n "$bref" ] && echo "$out" | grep -q -- "--- sample (20 tokens" && echo "$out" | grep -qF "$bref" &&
  pass "bitwise with the chunks prints the sample (digest unchanged)" || fail "bitwise chunks with the sample: $(echo "$out" | tail -3)"
refused "bitwise cp2 with the final sample" "not implemented with context parallelism" 2 --set parallel.cp=2 \
  --set parallel.cp_chunks=4 --set log.sample_tokens=5 --set parallel.determinism=bitwise
refused "bitwise chunks in bf16" "no chunked attention" 1 --set parallel.cp_chunks=4 --set precision=bf16 \
  --set parallel.determinism=bitwise
refused "bitwise chunks without tp chunks" "needs the canonical tensor-parallel chunks" 1 --set parallel.cp_chunks=4 \
  --set parallel.tp_chunks=1 --set parallel.determinism=bitwise
refused "cp with the final sample" "not implemented with context parallelism" 2 --set parallel.cp=2 \
  --set log.sample_tokens=5 --save "$TMP/ck2"
[ ! -e "$TMP/ck2" ] && pass "a refused layout writes nothing" || fail "a refused layout wrote $TMP/ck2"
finish
