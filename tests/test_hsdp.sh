# Hybrid sharding (HSDP, parallel.dp_shard; issue 30): ZeRO-1/2/3 within shard groups of 2
# consecutive data-parallel ranks, 2 replicas of them, the groups' reduced gradient shards
# all-reduced across: the single process's curve within 1e-5, and in bitwise mode its
# digest (the canonical tree over the group, then over the replicas); every rank allocates what
# `dtrain estimate` says (ZeRO's 1/2 of the state, not 1/4); a checkpoint saved under HSDP
# (only the first shard group writes) resumes under plain ZeRO-3 and the reverse, landing
# on the straight run's weights; what is not carried is refused before any work.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
RUN=("${DP_RUN[@]}")
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "single-process run"
for z in 1 2 3; do
  if ! full && [ $z = 2 ]; then continue; fi
  parity "hsdp-zero$z-2x2" 4 "$TMP/ref.jsonl" --set parallel.zero=$z --set parallel.dp_shard=2
done

# memory: estimate = allocation, per rank, to the byte; ZeRO-3's state over 2, not 4
"${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --steps 2 --set parallel.zero=3 --set parallel.dp_shard=2 \
  --metrics "$TMP/em.jsonl" >"$TMP/em.out" 2>&1 || fail "memory run: $(tail -2 "$TMP/em.out")"
"$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.zero=3 --set parallel.dp_shard=2 -n 4 --json >"$TMP/ee.json" ||
  fail "estimate"
"$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.zero=3 -n 4 --json >"$TMP/ee4.json" || fail "estimate zero3 dp4"
r=$(python3 - "$TMP/em.jsonl" "$TMP/ee.json" "$TMP/ee4.json" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
est, full4 = json.load(open(sys.argv[2]))["stages"][0], json.load(open(sys.argv[3]))["stages"][0]
for m in summ["mem"]:
    total = m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"]
    assert total == est["rank_bytes"], (m["rank"], total, est["rank_bytes"])
assert est["rank_bytes"] > full4["rank_bytes"], (est, full4)  # sharded over 2, not 4
print("%d ranks x %d bytes (ZeRO-3 over all 4: %d)" % (len(summ["mem"]), est["rank_bytes"], full4["rank_bytes"]))
PY
) && pass "estimate = allocation under HSDP 2x2 ZeRO-3: $r" || fail "hsdp estimate: $r"
grep -q "^hsdp: ZeRO within groups of 2 data-parallel ranks" <("$DTRAIN" estimate "${DP_RUN[@]}" --set parallel.zero=3 \
  --set parallel.dp_shard=2 -n 4) && pass "estimate names the shard groups" || fail "estimate's hsdp line"

# bitwise mode: the single process's digest under HSDP, each stage
ref_bw=$(dp_run bw1 1 --set parallel.determinism=bitwise)
for z in 1 2 3; do
  if ! full && [ $z = 2 ]; then continue; fi
  got=$(dp_run "bw-hsdp-zero$z" 4 --set parallel.determinism=bitwise --set parallel.zero=$z --set parallel.dp_shard=2)
  [ -n "$ref_bw" ] && [ "$got" = "$ref_bw" ] && pass "bitwise hsdp-zero$z-2x2: the single process's digest" ||
    fail "bitwise hsdp-zero$z: $got against $ref_bw $(tail -2 "$TMP/bw-hsdp-zero$z.out")"
done

# checkpoints across: HSDP saves (the first shard group writes), plain ZeRO-3 resumes, and
# the reverse, the curves within 1e-5
"${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" --set parallel.zero=3 --set parallel.dp_shard=2 \
  --set train.stop_after=10 --save "$TMP/ck" >"$TMP/ck.out" 2>&1 || fail "hsdp save: $(tail -2 "$TMP/ck.out")"
# resumed NAME NP ARGS...: steps 11-20 of the resumed run = the straight single process's
resumed() {
  local name=$1 np=$2; shift 2
  "${MPI[@]}" -np "$np" "$DTRAIN" train "${DP_RUN[@]}" "$@" --metrics "$TMP/$name.jsonl" >"$TMP/$name.out" 2>&1 ||
    { fail "$name: $(grep -m1 error "$TMP/$name.out")"; return; }
  local r; r=$(compare_resumed "$TMP/ref.jsonl" "$TMP/$name.jsonl") && pass "$name: $r" || fail "$name: $r"
}
resumed hsdp-save-zero3-resume 2 --set parallel.zero=3 --resume "$TMP/ck"
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" --set parallel.zero=2 --set train.stop_after=10 --save "$TMP/ck2" \
  >"$TMP/ck2.out" 2>&1 || fail "zero2 save"
resumed zero2-save-hsdp-resume 4 --set parallel.zero=1 --set parallel.dp_shard=2 --resume "$TMP/ck2"

refused "dp_shard not dividing dp" "must divide the data-parallel size 4" 4 --set parallel.zero=3 --set parallel.dp_shard=3
refused "dp_shard without ZeRO" "set parallel.zero 1, 2" 4 --set parallel.dp_shard=2
refused "dp_shard in bitwise mode, 3 replicas" "power-of-two data-parallel size" 6 --set parallel.zero=2 \
  --set parallel.dp_shard=2 --set parallel.determinism=bitwise --set train.global_batch=12
finish
