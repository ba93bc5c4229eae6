# Per-unit sharding (issue 30): parallel.unit_blocks (k blocks per wrap unit) and
# parallel.policy (GLOB:MODE rules per unit: ddp units replicated inside one ZeRO stage).
# Three mixed policies under HSDP (dp 4 = 2 replicas x shard groups of 2): the embeddings
# replicated + the rest ZeRO-3; one frozen block + the blocks ZeRO-2 (embeddings and ln_f
# ddp); ZeRO-3 with two blocks per unit; block 0 zero2 (kept whole between updates), the
# embeddings ddp and the rest zero3; ZeRO-3 with each block split into its attention
# and MLP halves (parallel.unit_split), and the same with the MLP halves replicated
# (a policy over the halves). Each: the single process's curve within 1e-5, in
# bitwise mode the single process's digest, every rank's bytes = `dtrain estimate`'s; a
# policy the engine cannot run is refused before any work, one line, exit 2.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
RUN=("${DP_RUN[@]}")
FZ=(--set 'train.freeze=h.1.*')
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "single-process run"
"$DTRAIN" train "${DP_RUN[@]}" "${FZ[@]}" --metrics "$TMP/reff.jsonl" >"$TMP/reff.out" 2>&1 ||
  fail "single-process run, h.1 frozen"
# NAME:REF:ARGS (REF: ref, or reff with h.1 frozen)
CASES=("emb-ddp-zero3:ref:--set parallel.zero=3 --set parallel.policy=wte.weight:ddp,wpe.weight:ddp"
       "frozen-h1-blocks-zero2:reff:--set train.freeze=h.1.* --set parallel.policy=h.*:zero2"
       "zero3-2blocks:ref:--set parallel.zero=3 --set parallel.unit_blocks=2"
       "zero3-split:ref:--set parallel.zero=3 --set parallel.unit_split=h.*.ln_2.weight"
       "blocks-zero2-rest-zero3:ref:--set parallel.zero=3 --set parallel.policy=h.0.*:zero2,w?e.weight:ddp")
full && CASES+=("split-mlp-ddp-zero2:ref:--set parallel.zero=2 --set parallel.unit_split=h.*.ln_2.weight --set parallel.policy=h.*.ln_2.*:ddp,h.*.mlp.*:ddp")
HS=(--set parallel.dp_shard=2)
for c in "${CASES[@]}"; do
  IFS=: read -r name ref args <<<"$c"
  # shellcheck disable=SC2086
  parity "$name-hsdp2x2" 4 "$TMP/$ref.jsonl" $args "${HS[@]}"
done
# plain ZeRO over all 4 ranks too (no replicas)
# shellcheck disable=SC2086
full && parity "emb-ddp-zero3-dp4" 4 "$TMP/ref.jsonl" --set parallel.zero=3 --set parallel.policy=w?e.weight:ddp

# split blocks with tensor and sequence parallelism (each half's norm summed over tp
# alone), and Llama's blocks split at post_attention_layernorm
SPLIT=(--set parallel.unit_split=h.*.ln_2.weight)
parity "zero3-split-dp2xtp2-sp" 4 "$TMP/ref.jsonl" --set parallel.zero=3 --set parallel.tp=2 --set parallel.sp=true "${SPLIT[@]}"
if full; then
  LL=(--set model.family=llama --set model.n_head=4 --set model.n_kv_head=2 --set model.intermediate_size=64
      --set model.tie_embeddings=false)
  "$DTRAIN" train "${DP_RUN[@]}" "${LL[@]}" --metrics "$TMP/refl.jsonl" >"$TMP/refl.out" 2>&1 || fail "Llama single process"
  parity "llama-zero3-split-dp4" 4 "$TMP/refl.jsonl" "${LL[@]}" --set parallel.zero=3 \
    --set parallel.unit_split=model.layers.*.post_attention_layernorm.weight
fi
# ZeRO-3's two block gather buffers hold the larger half, not a block: less memory
e_split=$("$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.zero=3 "${SPLIT[@]}" -n 4 --json)
e_block=$("$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.zero=3 -n 4 --json)
python3 - "$e_split" "$e_block" <<'PY' && pass "split blocks: ZeRO-3 gathers half a block at a time (less memory per rank)" ||
import json, sys
s, b = (json.loads(a)["stages"][0]["rank_bytes"] for a in sys.argv[1:3])
assert s < b, (s, b)
print(s, b)
PY
  fail "the split's estimate is not below a block's"

# bitwise mode: the single process's digest (the canonical tree over the shard group, then
# over the replicas, is the tree over every rank)
BW=(--set parallel.determinism=bitwise)
ref_bw=$(dp_run bw1 1 "${BW[@]}")
ref_bwf=$(dp_run bwf1 1 "${BW[@]}" "${FZ[@]}")
[ -n "$ref_bw" ] && [ -n "$ref_bwf" ] || fail "bitwise single process: $(tail -2 "$TMP/bw1.out")"
for c in "${CASES[@]}"; do
  IFS=: read -r name ref args <<<"$c"
  want=$ref_bw; [ "$ref" = reff ] && want=$ref_bwf
  # shellcheck disable=SC2086
  got=$(dp_run "bw-$name" 4 "${BW[@]}" $args "${HS[@]}")
  [ "$got" = "$want" ] && pass "bitwise $name under HSDP 2x2: the single process's digest" ||
    fail "bitwise $name: $got against $want $(tail -2 "$TMP/bw-$name.out")"
done
# split blocks in the flat layouts too (DDP: each half's leaf where its hook points it)
got=$(dp_run bw-split-ddp 2 "${BW[@]}" "${SPLIT[@]}")
[ "$got" = "$ref_bw" ] && pass "bitwise DDP with split blocks: the single process's digest" ||
  fail "bitwise DDP split: $got against $ref_bw $(tail -2 "$TMP/bw-split-ddp.out")"
# the blocks below the lowest trainable tensor skipped (their hooks still called, both halves')
if full; then
  FZB=(--set 'train.freeze=w?e.weight,h.0.*')
  "$DTRAIN" train "${DP_RUN[@]}" "${FZB[@]}" --metrics "$TMP/reffb.jsonl" >"$TMP/reffb.out" 2>&1 || fail "frozen-below single"
  parity "zero3-split-frozen-below" 4 "$TMP/reffb.jsonl" "${FZB[@]}" --set parallel.zero=3 "${SPLIT[@]}"
fi

# kept (zero2) units among zero3's are gathered once a step, whatever the micro-steps: with 4
# blocks (two gather buffers cycle) and the embeddings ddp, param_comm_bytes per step
pcb() { # NAME GLOBAL_BATCH POLICY: step 3's parameter bytes gathered
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --steps 3 --set model.n_layer=4 --set train.global_batch="$2" \
    --set parallel.zero=3 --set "parallel.policy=$3" --metrics "$TMP/pcb-$1.jsonl" >"$TMP/pcb-$1.out" 2>&1 &&
    python3 -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if '\"step\": 3,' in l][0]['param_comm_bytes'])" \
      "$TMP/pcb-$1.jsonl"
}
if full; then
  k1=$(pcb kept-m1 8 'h.*:zero2,w?e.weight:ddp'); k2=$(pcb kept-m2 16 'h.*:zero2,w?e.weight:ddp')
  z2=$(pcb z3-m2 16 'w?e.weight:ddp')
  [ -n "$k1" ] && [ "$k1" = "$k2" ] && [ "$z2" -gt "$k2" ] &&
    pass "zero2 units among zero3's: gathered once a step ($k1 bytes with 1 and 2 micro-steps, plain ZeRO-3 $z2)" ||
    fail "kept units' gathers: '$k1' '$k2' against '$z2' $(tail -2 "$TMP/pcb-kept-m2.out")"
fi

# memory: every rank's bytes = the estimate, to the byte, fast and bitwise
memcheck() {
  local name=$1; shift
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --steps 2 "$@" --metrics "$TMP/m-$name.jsonl" >"$TMP/m-$name.out" 2>&1 ||
    { fail "memory run $name: $(tail -2 "$TMP/m-$name.out")"; return; }
  "$DTRAIN" estimate "${DP_RUN[@]}" "$@" -n 4 --json >"$TMP/e-$name.json" || { fail "estimate $name"; return; }
  local r; r=$(python3 - "$TMP/m-$name.jsonl" "$TMP/e-$name.json" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
est = json.load(open(sys.argv[2]))["stages"][0]
for m in summ["mem"]:
    total = m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"]
    assert total == est["rank_bytes"], (m["rank"], total, est["rank_bytes"])
print("%d ranks x %d bytes" % (len(summ["mem"]), est["rank_bytes"]))
PY
) && pass "estimate = allocation, $name: $r" || fail "estimate $name: $r"
}
for c in "${CASES[@]}"; do
  IFS=: read -r name ref args <<<"$c"
  # shellcheck disable=SC2086
  memcheck "$name" $args "${HS[@]}"
  # shellcheck disable=SC2086
  full && memcheck "bw-$name" $args "${HS[@]}" "${BW[@]}"
done
# the policy changes the bytes: the embeddings replicated hold more than ZeRO-3's slice of them
z3=$("$DTRAIN" estimate "${DP_RUN[@]}" "${HS[@]}" --set parallel.zero=3 -n 4 --json)
python3 - "$TMP/e-emb-ddp-zero3.json" "$z3" <<'PY' && pass "the replicated embeddings cost more than their ZeRO-3 slice" ||
import json, sys
pol, z3 = json.load(open(sys.argv[1]))["stages"][0]["rank_bytes"], json.loads(sys.argv[2])["stages"][0]["rank_bytes"]
assert pol > z3, (pol, z3)
PY
  fail "the policy's estimate is not above plain ZeRO-3's"

# checkpoints across: saved under a policy (HSDP), resumed under plain ZeRO-2, landing on
# the straight run's curve (steps 11-20)
if full; then
  "${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" "${HS[@]}" --set parallel.zero=3 --set parallel.unit_blocks=2 \
    --set parallel.policy=w?e.weight:ddp --set train.stop_after=10 --save "$TMP/ck" >"$TMP/ck.out" 2>&1 ||
    fail "policy save: $(tail -2 "$TMP/ck.out")"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --set parallel.zero=2 --resume "$TMP/ck" --metrics "$TMP/res.jsonl" \
    >"$TMP/res.out" 2>&1 || fail "resume under zero2: $(tail -2 "$TMP/res.out")"
  r=$(compare_resumed "$TMP/ref.jsonl" "$TMP/res.jsonl") && pass "saved under the policy, resumed under zero2: $r" || fail "policy save/resume: $r"
fi

refused "a policy glob matching nothing" "'x\.\*' matches no tensor" 4 --set parallel.zero=3 --set 'parallel.policy=x.*:ddp'
refused "a rule splitting a unit" "splits a unit between modes" 4 --set parallel.zero=3 --set parallel.policy=wte.weight:ddp
refused "unit_blocks not dividing the blocks" "unit_blocks 3 must divide" 4 --set parallel.zero=3 --set parallel.unit_blocks=3
refused "dp_shard not dividing dp" "must divide the data-parallel size 4" 4 --set parallel.zero=3 --set parallel.dp_shard=3
refused "zero1 with zero3" "mixes zero1 and zero3" 4 --set parallel.zero=3 --set 'parallel.policy=h.0.*:zero1'
refused "an unknown mode" "is not ddp, zero1" 4 --set parallel.zero=3 --set 'parallel.policy=h.*:fsdp'
refused "a unit split that cuts the MLP half" "would cut h.0.ln_2.weight .. h.0.mlp.c_proj.bias" 4 \
  --set parallel.zero=3 --set 'parallel.unit_split=h.*.mlp.c_fc.bias'
refused "a unit split of one block of two" "splits 1 of the 2 blocks (not block 0)" 4 --set parallel.zero=3 \
  --set parallel.unit_split=h.1.ln_2.weight
refused "a unit split glob matching nothing" "'h.\*.ln_3' matches no tensor" 4 --set parallel.zero=3 \
  --set 'parallel.unit_split=h.*.ln_3'
refused "a unit split with recompute" "unit_split: a block in two units runs with" 4 --set parallel.zero=3 \
  --set parallel.unit_split=h.*.ln_2.weight --set train.recompute=full
refused "a unit split with pp" "unit_split: a block in two units runs with" 4 --set parallel.zero=1 \
  --set parallel.unit_split=h.*.ln_2.weight --set parallel.pp=2
refused "ddp units with pp" "and tp on the CPU in fp32 so far" 4 --set parallel.zero=1 \
  --set parallel.policy=w?e.weight:ddp --set parallel.pp=2

# with tensor parallelism: dp2 x tp2, the embeddings (vocabulary-parallel) replicated over
# dp among ZeRO-3's blocks; the gradient norm counts a replicated unit once, not once per
# dp rank (it did: 7e-4 apart by step 6); the single process's digest in bitwise mode; and
# every rank's bytes the estimate's (`-n 2`: the data-parallel ranks, tp from the config)
TPP=(--set parallel.tp=2 --set parallel.zero=3 --set parallel.policy=w?e.weight:ddp)
parity "emb-ddp-zero3-dp2xtp2" 4 "$TMP/ref.jsonl" "${TPP[@]}"
got=$(dp_run bw-tpp 4 "${BW[@]}" "${TPP[@]}")
[ "$got" = "$ref_bw" ] && pass "bitwise dp2 x tp2 with ddp embeddings: the single process's digest" ||
  fail "bitwise dp2 x tp2 policy: $got against $ref_bw $(tail -2 "$TMP/bw-tpp.out")"
"${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --steps 2 "${TPP[@]}" --metrics "$TMP/m-tpp.jsonl" >"$TMP/m-tpp.out" 2>&1 ||
  fail "memory run dp2 x tp2 policy: $(tail -2 "$TMP/m-tpp.out")"
"$DTRAIN" estimate "${DP_RUN[@]}" "${TPP[@]}" -n 2 --json >"$TMP/e-tpp.json" || fail "estimate dp2 x tp2 policy"
r=$(python3 - "$TMP/m-tpp.jsonl" "$TMP/e-tpp.json" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
want = json.load(open(sys.argv[2]))["stages"][0]["rank_bytes"]
got = [m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"] for m in summ["mem"]]
assert len(got) == 4 and all(g == want for g in got), (got, want)
print("4 ranks x %d bytes" % want)
PY
) && pass "estimate = allocation, dp2 x tp2 with ddp embeddings: $r" || fail "estimate dp2 x tp2 policy: $r"
finish
