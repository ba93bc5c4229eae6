# The Llama family in every layout (issue 28): a small model with grouped-query attention
# (4 heads, 2 key/value heads), untied head and q/k/v biases trains the single process's
# model with dp2 (ps, DDP, ZeRO-1/2/3), tp2 (with and without sp), pp2 under each schedule,
# cp2, dp2 x pp2 x tp2, recompute and the emulated device, and tp above the key/value
# heads (replicated: tp4 over 2, with sp; multi-query under tp2, tp4, pp2 x tp2 zb-h1, dp2
# x tp2 ZeRO-3; its checkpoints across tp4 and one process): per-step loss, gradient norm
# and validation loss within 1e-5 (fp32); bitwise mode gives the single process's weights
# with dp2 (ZeRO-3), pp2, tp, sp and cp, key/value heads replicated over tp included; packed documents restart the rotary positions in every
# layout that splits them (dp2, tp2, cp2); bf16 follows the fp32 curve within 1%; a tied
# variant too; optimizer offload (nvme) and frozen groups (dp2 ZeRO-3) as for GPT-2; every
# rank allocates what `dtrain estimate` says (ZeRO-3, pp2, tp4 over 2 key/value heads).
# Bad shapes (a tp neither dividing nor a multiple of the key/value heads) are refused
# with one line, exit 2.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
LLAMA=(--set model.family=llama --set model.n_head=4 --set model.n_kv_head=2 --set model.n_embd=32
       --set model.intermediate_size=64 --set model.tie_embeddings=false --set model.qkv_bias=true
       --set model.rope_theta=500000 --set model.n_layer=4)
DP_RUN+=("${LLAMA[@]}")
ref=$(dp_run ref 1)
[ -n "$ref" ] || { tail -3 "$TMP/ref.out"; fail "the single process"; finish; exit 1; }
LAYOUTS=("${PARITY_LAYOUTS[@]}" "recompute:1:--set train.recompute=full" "emulated:1:--set backend=emulated")
full || LAYOUTS=("dp2-zero3:2:--set parallel.zero=3" "tp2-sp:2:--set parallel.tp=2 --set parallel.sp=true"
                 "pp2-zbh1:2:--set parallel.pp=2 --set parallel.schedule=zb-h1" "cp2:2:--set parallel.cp=2")
for lay in "${LAYOUTS[@]}"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
  # shellcheck disable=SC2086
  dp_run "$name" "$np" $args >/dev/null
  r=$(compare_curves "$TMP/ref.jsonl" "$TMP/$name.jsonl" 2>&1) && pass "$name = single process: $r" ||
    fail "$name: $r $(grep -m1 -i error "$TMP/$name.out")"
done
# tp above the key/value heads (Megatron's replication: rank t holds head t / (tp /
# n_kv_head), the replicas sum its gradient): tp4 over 2 heads, with sp; multi-query (one
# head) under tp2, tp4, a split backward (pp2 x tp2, zb-h1) and dp2 x tp2 ZeRO-3, each
# the single process's curve
KVREP=("tp4-kv2:4:--set parallel.tp=4" "tp4-kv2-sp:4:--set parallel.tp=4 --set parallel.sp=true")
MQA=("mqa-tp2:2:--set parallel.tp=2" "mqa-tp4:4:--set parallel.tp=4"
     "mqa-pp2xtp2-zbh1:4:--set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=zb-h1"
     "mqa-dp2xtp2-zero3:4:--set parallel.tp=2 --set parallel.zero=3")
full || { KVREP=("${KVREP[0]}"); MQA=("${MQA[2]}"); }
dp_run mqa 1 --set model.n_kv_head=1 >/dev/null
for lay in "${KVREP[@]}" "${MQA[@]}"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}; base=ref; kv=()
  [ "${name#mqa}" != "$name" ] && base=mqa && kv=(--set model.n_kv_head=1)
  # shellcheck disable=SC2086
  dp_run "$name" "$np" "${kv[@]}" $args >/dev/null
  r=$(compare_curves "$TMP/$base.jsonl" "$TMP/$name.jsonl" 2>&1) && pass "$name = single process: $r" ||
    fail "$name: $r $(grep -m1 -i error "$TMP/$name.out")"
done
# checkpoints of replicated heads hold each head once: a tp4 (2 heads) checkpoint at step
# 10 is the weights tp4 had (digest), and one process resuming it, or tp4 resuming a
# single process's, continues the single process's curve
"${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --set parallel.tp=4 --set train.stop_after=10 --save "$TMP/k4" \
  --digest --metrics "$TMP/k4.jsonl" >"$TMP/k4.out" 2>&1 || fail "tp4 first half: $(tail -2 "$TMP/k4.out")"
cp -r "$TMP/k4" "$TMP/k4w" && cp "$TMP/k4.jsonl" "$TMP/k4r.jsonl"
d4=$(digest_of "$TMP/k4.out")
d1=$("$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/k4w" --save "$TMP/k4w" --steps 10 --digest 2>&1 | grep -o 'digest sha256:[0-9a-f]*')
[ -n "$d4" ] && [ "$d1" = "$d4" ] && pass "a tp4 checkpoint over 2 key/value heads loads in one process as tp4's weights ($d4)" ||
  fail "tp4 checkpoint weights: $d1 vs $d4"
"$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/k4" --save "$TMP/k4" --metrics "$TMP/k4r.jsonl" >"$TMP/k4r.out" 2>&1 ||
  fail "one process resumes a tp4 checkpoint: $(tail -2 "$TMP/k4r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/k4r.jsonl" 2>&1) && pass "tp4 save + single resume = single process: $r" ||
  fail "tp4 -> single: $r"
if full; then
  "$DTRAIN" train "${DP_RUN[@]}" --set train.stop_after=10 --save "$TMP/k1" --metrics "$TMP/k1.jsonl" >/dev/null 2>&1 ||
    fail "single first half"
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/k1" --save "$TMP/k1" --set parallel.tp=4 \
    --metrics "$TMP/k1.jsonl" >"$TMP/k1r.out" 2>&1 || fail "tp4 resumes a single process's checkpoint: $(tail -2 "$TMP/k1r.out")"
  r=$(compare_curves "$TMP/ref.jsonl" "$TMP/k1.jsonl" 2>&1) && pass "single save + tp4 resume = single process: $r" ||
    fail "single -> tp4: $r"
fi
# packed documents (rotary positions restart at each one; tests/test_documents_model checks
# that against each document alone): dp2, tp2 and cp2 give the single process's curve
prepare_prompt_docs
DOCS=(--set "data.train=$TMP/d_train.bin" --set "data.val=$TMP/d_val.bin" --set data.layout=pack)
dp_run pack-ref 1 "${DOCS[@]}" >/dev/null
for lay in "pack-dp2:2:" "pack-tp2:2:--set parallel.tp=2" "pack-cp2:2:--set parallel.cp=2"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
  # shellcheck disable=SC2086
  dp_run "$name" "$np" "${DOCS[@]}" $args >/dev/null
  r=$(compare_curves "$TMP/pack-ref.jsonl" "$TMP/$name.jsonl" 2>&1) && pass "$name = single process: $r" ||
    fail "$name: $r $(grep -m1 -i error "$TMP/$name.out")"
done
# bitwise mode: the single process's weights
bref=$(dp_run bref 1 --set parallel.determinism=bitwise)
# and with tensor parallelism (src/model/tp_chunks.c: q, k, v, o, gate, up and down in the
# canonical chunks, as GPT-2's projections): tp 2 alone, with ZeRO-3, with pp and on 2
# threads, and tp 4 where the key/value heads split 4 ways
for lay in "dp2-zero3:2:--set parallel.zero=3" "pp2:2:--set parallel.pp=2" "tp2:2:--set parallel.tp=2" \
           "dp2-tp2-zero3:4:--set parallel.tp=2 --set parallel.zero=3" "pp2-tp2:4:--set parallel.tp=2 --set parallel.pp=2" \
           "tp2-threads2:2:--set parallel.tp=2 --threads 2" "tp2-sp:2:--set parallel.tp=2 --set parallel.sp=true"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
  case $name in dp2-zero3|pp2|tp2) ;; *) full || continue ;; esac
  # shellcheck disable=SC2086
  got=$(OMP_NUM_THREADS=$(case $name in *threads2) echo 2 ;; *) echo 1 ;; esac) \
        dp_run "b$name" "$np" --set parallel.determinism=bitwise $args)
  [ -n "$bref" ] && [ "$got" = "$bref" ] && pass "bitwise $name: the single process's weights" ||
    fail "bitwise $name: $got vs $bref"
done
# context parallelism in bitwise mode (parallel.cp_chunks: cp_chunks.c), Llama as GPT-2
CHK=(--set parallel.determinism=bitwise --set parallel.cp_chunks=4 --set log.sample_tokens=0)
bcp=$(full && dp_run bcp1 1 "${CHK[@]}")
full && for lay in "cp2:2:--set parallel.cp=2" "cp2-tp2:4:--set parallel.cp=2 --set parallel.tp=2"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
  # shellcheck disable=SC2086
  got=$(dp_run "b$name" "$np" "${CHK[@]}" $args)
  [ -n "$bcp" ] && [ "$got" = "$bcp" ] && pass "bitwise $name (4 sequence chunks): the single process's weights" ||
    fail "bitwise $name: $got vs $bcp $(grep -m1 error "$TMP/b$name.out")"
done
MHA=(--set model.n_kv_head=4)
if full; then
  bmha=$(dp_run bmha 1 --set parallel.determinism=bitwise "${MHA[@]}")
  got=$(dp_run btp4 4 --set parallel.determinism=bitwise "${MHA[@]}" --set parallel.tp=4)
  [ -n "$bmha" ] && [ "$got" = "$bmha" ] && pass "bitwise tp4 (4 key/value heads): the single process's weights" ||
    fail "bitwise tp4: $got vs $bmha $(grep -m1 error "$TMP/btp4.out")"
fi
# key/value heads replicated over tp (attention.c's rope_canon_bwd: each query head's dk, dv
# a leaf of one tree per group, the replicas' levels by tensor_parallel.c's kv tree; k and
# v in the single process's blocks on every replica): tp 4 over 2 heads (each rank's
# allocation the estimate's), and multi-query under tp 2, tp 4 with sp, pp 2 x tp 2 with
# a split backward, dp 2 x tp 2 ZeRO-3, bf16 and on the emulated device
BWK=(--set parallel.determinism=bitwise --set log.sample_tokens=0)
got=$(dp_run bkv4 4 "${BWK[@]}" --set parallel.tp=4)
[ -n "$bref" ] && [ "$got" = "$bref" ] && pass "bitwise tp4 over 2 key/value heads: the single process's weights" ||
  fail "bitwise tp4 over 2 key/value heads: $got vs $bref $(grep -m1 error "$TMP/bkv4.out")"
"$DTRAIN" estimate "${DP_RUN[@]}" "${BWK[@]}" --set parallel.tp=4 -n 1 --json >"$TMP/bkv4e.json" ||
  fail "estimate bitwise tp4 over 2 key/value heads"
r=$(alloc_is_estimate "$TMP/bkv4.jsonl" "$TMP/bkv4e.json" 4) &&
  pass "bitwise tp4 over 2 key/value heads: allocation = estimate ($r)" || fail "bitwise tp4 kv memory: $r"
if full; then
  MQ=(--set model.n_kv_head=1)
  for prec in fp32 bf16; do
    bmq=$(dp_run "bmq-$prec" 1 "${BWK[@]}" "${MQ[@]}" --set precision=$prec)
    for lay in "tp2:2:--set parallel.tp=2" "tp4-sp:4:--set parallel.tp=4 --set parallel.sp=true" \
               "pp2-tp2-zbh1:4:--set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=zb-h1" \
               "dp2-tp2-zero3:4:--set parallel.tp=2 --set parallel.zero=3" "emulated-tp2:2:--set backend=emulated --set parallel.tp=2"; do
      name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
      [ $prec = bf16 ] && [ "$name" != tp2 ] && continue
      # shellcheck disable=SC2086
      got=$(dp_run "bmq-$prec-$name" "$np" "${BWK[@]}" "${MQ[@]}" --set precision=$prec $args)
      [ -n "$bmq" ] && [ "$got" = "$bmq" ] && pass "bitwise multi-query $name ($prec): the single process's weights" ||
        fail "bitwise multi-query $name ($prec): $got vs $bmq $(grep -m1 error "$TMP/bmq-$prec-$name.out")"
    done
  done
fi
RUN=("${DP_RUN[@]}")
# replicas whose query heads do not split at a power of two: the tree's levels would not
refused "bitwise multi-query tp2 over 3 query heads a rank" "not a power of two" 2 --set parallel.tp=2 \
  --set parallel.determinism=bitwise --set model.n_head=6 --set model.n_embd=48 --set model.n_kv_head=1
# bf16 follows fp32; the tied variant in a pipeline (the head's share of the embedding summed)
dp_run bf16 1 --set precision=bf16 >/dev/null
python3 - "$TMP/ref.jsonl" "$TMP/bf16.jsonl" <<'PY' && pass "bf16 within 1% of fp32" || fail "bf16 vs fp32"
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"event"' not in l] for p in sys.argv[1:3])
w = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
print("bf16: max loss rel diff %.2e" % w); sys.exit(0 if len(a) == len(b) == 20 and w < 0.01 else 1)
PY
dp_run tied 1 --set model.tie_embeddings=true >/dev/null
dp_run tied-pp2 2 --set model.tie_embeddings=true --set parallel.pp=2 >/dev/null
r=$(compare_curves "$TMP/tied.jsonl" "$TMP/tied-pp2.jsonl" 2>&1) && pass "tied, pp2 = single process: $r" ||
  fail "tied pp2: $r"
# offload (ZeRO-Infinity's optimizer state in NVMe files) trains the same model; frozen
# groups (train.freeze over Llama names) give dp2 ZeRO-3 the single process's curve
mkdir -p "$TMP/nvme"
dp_run offload 1 --set offload.optimizer=nvme --set offload.nvme_path="$TMP/nvme" >/dev/null
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/offload.jsonl" 2>&1) && pass "optimizer offload (nvme) = single process: $r" ||
  fail "offload: $r $(grep -m1 -i error "$TMP/offload.out")"
FRZ=(--set "train.freeze=model.embed_tokens.weight,model.layers.0.*")
dp_run freeze 1 "${FRZ[@]}" >/dev/null
dp_run freeze-z3 2 "${FRZ[@]}" --set parallel.zero=3 >/dev/null
r=$(compare_curves "$TMP/freeze.jsonl" "$TMP/freeze-z3.jsonl" 2>&1) && pass "frozen groups, dp2 ZeRO-3 = single process: $r" ||
  fail "freeze: $r $(grep -m1 -i error "$TMP/freeze-z3.out")"
# the estimator knows the family: every rank allocates what `dtrain estimate` predicts, to
# the byte (ZeRO-3 over dp2; a pipeline's stages with the untied head on the last)
for lay in "z3:2:1:1:--set parallel.zero=3" "pp2:2:2:1:--set parallel.pp=2" "tp4:4:1:4:--set parallel.tp=4"; do
  name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; rest=${rest#*:}; pp=${rest%%:*}; rest=${rest#*:}; tp=${rest%%:*}
  args=${rest#*:}
  # shellcheck disable=SC2086
  "${MPI[@]}" -np "$np" "$DTRAIN" train "${DP_RUN[@]}" --steps 2 $args --metrics "$TMP/em_$name.jsonl" >"$TMP/em.out" 2>&1 ||
    { fail "memory run $name: $(tail -2 "$TMP/em.out")"; continue; }
  # shellcheck disable=SC2086
  "$DTRAIN" estimate "${DP_RUN[@]}" $args -n $((np / pp / tp)) --json >"$TMP/ee_$name.json" || fail "estimate $name"
  r=$(python3 - "$TMP/em_$name.jsonl" "$TMP/ee_$name.json" "$pp" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
stages, pp = json.load(open(sys.argv[2]))["stages"], int(sys.argv[3])
for m in summ["mem"]:
    total = m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"]
    if total != stages[m["rank"] % pp]["rank_bytes"]:
        print("rank %d allocates %d bytes, the estimate says %d" % (m["rank"], total, stages[m["rank"] % pp]["rank_bytes"]))
        sys.exit(1)
print("%d ranks, %d bytes on rank 0" % (len(summ["mem"]), stages[0]["rank_bytes"]))
PY
) && pass "estimate = allocation, $name: $r" || fail "estimate $name: $r"
done
# refused shapes
expect() { # expect LABEL PATTERN ARGS...: exit 2 with the pattern, one line
  local label=$1 pat=$2; shift 2
  "$DTRAIN" train "${DP_RUN[@]}" "$@" >"$TMP/bad.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && grep -q "$pat" "$TMP/bad.out" && pass "$label: refused (exit 2)" ||
    fail "$label: rc $rc: $(tail -1 "$TMP/bad.out")"
}
expect "kv heads not dividing heads" "n_kv_head" --set model.n_kv_head=3
# the planner proposes tp 4 over the 2 key/value heads (replicated), and no tp that
# neither divides nor is a multiple of them (tp 2 over 3 heads of 6) which train refuses
"$DTRAIN" plan "${DP_RUN[@]}" -n 4 --top 100 --json >"$TMP/plan.out" 2>&1 &&
  python3 -c "import json, sys; t = {json.loads(l)['tp'] for l in open(sys.argv[1]) if l.strip()}; sys.exit(4 not in t)" \
    "$TMP/plan.out" && pass "plan -n 4: tp 4 over 2 key/value heads" || fail "plan: $(tail -2 "$TMP/plan.out")"
KV3=(--set model.n_embd=36 --set model.n_head=6 --set model.n_kv_head=3)
"$DTRAIN" plan "${DP_RUN[@]}" "${KV3[@]}" -n 2 --top 100 --json >"$TMP/plan3.out" 2>&1 &&
  python3 -c "import json, sys; t = {json.loads(l)['tp'] for l in open(sys.argv[1]) if l.strip()}; sys.exit(t != {1})" \
    "$TMP/plan3.out" && pass "plan -n 2: tp 1 only over 3 key/value heads" || fail "plan 3 heads: $(tail -2 "$TMP/plan3.out")"
timeout 120 "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${KV3[@]}" --set parallel.tp=2 >"$TMP/tp2.out" 2>&1
[ $? -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/tp2.out")" -eq 1 ] && grep -q "n_kv_head 3 or be a multiple" "$TMP/tp2.out" &&
  pass "tp 2 over 3 key/value heads: refused (exit 2)" || fail "tp2 over 3: $(grep -m1 error "$TMP/tp2.out")"
expect "an odd head size" "even" --set model.n_embd=36 --set model.n_head=4 --set model.n_kv_head=4
expect "gpt2 with llama's keys" "llama" --set model.family=gpt2 --set model.tie_embeddings=true
finish
