#!/usr/bin/env bash
# Hybrid sharding across hosts (issue 30): 2 emulated hosts x 4 ranks (tests/emulated_cluster.sh:
# network namespaces, each host's outgoing link capped with tc tbf at RATE, default 1gbit),
# a model whose ZeRO-3 gathers dominate the step (8 blocks x 512, ~25M parameters, a short
# sequence and a small batch: little compute per byte). Contenders: DDP over the 8 ranks,
# ZeRO-3 over the 8 ranks (every gather and reduce-scatter crosses the link), and HSDP
# (ZeRO-3 within each host's 4 ranks, parallel.dp_shard 4: only each rank's quarter of the
# gradients crosses, once per step), with HSDP ZeRO-2 too, and HSDP ZeRO-3 with the
# embeddings replicated (parallel.policy w?e.weight:ddp, one of the policies the planner
# proposes). For each: the median step time
# (steps 3 on), the bytes the two hosts sent over their capped links per step (tx counters
# of the namespaces' eth0), the largest per-rank allocation, and `dtrain plan`'s prediction
# of each (step time and bytes across a node's link, from links fitted here by
# `dtrain bench comm` and the rate `dtrain plan` calibrates); the ring for every
# collective, as the planner models it. Both are measured under the run's load (8 ranks
# on this machine's cores): the rate by `plan --load 8`, the intra-host link by 8 ranks
# running 4-rank all-reduces inside each host at once (`bench comm --group 4`); the
# inter-host link by one pair (the link's cap, not the cores, sets it). LOADED=0 measures
# them alone instead (`plan --cores`: core sharing counted as ranks over cores). The loaded
# intra-host fit has each rank compute between the all-reduces (`bench comm --between`) as
# long as a ZeRO-3 step does between its collectives (BETWEEN=0: back to back).
# usage: bench/bench_hsdp.sh [build/dtrain]     (root; prints a markdown table)
# knobs: RATE=1gbit STEPS=8 LAYOUTS="ddp zero3 hsdp3 hsdp2 hsdp3emb" LOADED=1 BETWEEN=1
set -euo pipefail
source "$(dirname "$0")/common.sh" hsdp "${1:-}"
source "$here/../tests/emulated_cluster.sh"
trap 'cluster_down; rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 LSAN_OPTIONS= ASAN_OPTIONS=
RATE=${RATE:-1gbit} STEPS=${STEPS:-8} LAYOUTS=${LAYOUTS:-"ddp zero3 hsdp3 hsdp2 hsdp3emb"} LOADED=${LOADED:-1}
random_tokens "$tmp/rand.bin" 256 200000
S=(--set model.n_layer=8 --set model.n_head=8 --set model.n_embd=512 --set model.seq_len=32
   --set model.vocab_size=256 --set train.global_batch=8 --set train.micro_batch=1 --set log.sample_tokens=0)
RING=(--set comm.allreduce=ring --set comm.reduce_scatter=ring --set comm.allgather=ring)
# a contender's train arguments (LAY_ARGS) and the plan's key for it (zero, dp_shard, policy)
POLICY='w?e.weight:ddp' # hsdp3emb: HSDP ZeRO-3 with the embeddings replicated (a policy the planner proposes)
layout_of() {
  case $1 in
    ddp) LAY_ARGS=(--set parallel.zero=0); KEY=z0s0: ;;
    zero3) LAY_ARGS=(--set parallel.zero=3); KEY=z3s0: ;;
    hsdp3emb) LAY_ARGS=(--set parallel.zero=3 --set parallel.dp_shard=4 --set "parallel.policy=$POLICY"); KEY="z3s4:$POLICY" ;;
    hsdp*) LAY_ARGS=(--set "parallel.zero=${1#hsdp}" --set parallel.dp_shard=4); KEY="z${1#hsdp}s4:" ;;
  esac
}
fit() { # mpirun args... [-- bench comm args] -> "alpha:GBPS" of the ring all-reduce
  local run=() extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do run+=("$1"); shift; done
  [ $# -gt 0 ] && shift && extra=("$@")
  "${ENV[@]}" "${run[@]}" "$dtrain" bench comm --ops allreduce --algos ring --sizes 4K:4M "${extra[@]}" |
    grep -oE '[0-9.e+-]+:[0-9.e+-]+\)$' | tr -d ')'
}
cluster_up 2 "$RATE" || { echo "bench_hsdp: cannot make network namespaces here (root?)" >&2; exit 77; }
EMU=("${CLUSTER_MPI[@]}" -x GLIBC_TUNABLES -x OMP_NUM_THREADS=1 --bind-to none)
p0=$(probe)
inter=$(fit "${EMU[@]}" --host "$(cluster_hosts 1)" -np 2)
CORES=$(nproc)
if [ "$LOADED" = 1 ]; then
  SHARE=(--load 8)
  # the computation a ZeRO-3 step puts between two of its collectives (a gather before each
  # unit's forward, a gather and a reduce-scatter around its backward: 3 per unit and
  # micro-step), from the plan's loaded compute for HSDP ZeRO-3; bench comm runs that much
  # before each all-reduce, so that ranks reach it at different times as in a step
  "${ENV[@]}" "$dtrain" plan "${S[@]}" -n 8 --ranks-per-node 4 "${SHARE[@]}" --threads 1 --top 100000 --json \
    >"$tmp/plan0.json"
  between=$(python3 -c '
import json, sys
for l in open(sys.argv[1]):
    x = json.loads(l)
    if x.get("dp") == 8 and x.get("zero") == 3 and x.get("dp_shard") == 4 and not x.get("policy"):
        print(int(x["compute_s"] * 1e6 / x["m"] / (3 * (int(sys.argv[2]) + 2)))); break' "$tmp/plan0.json" 8)
  [ "${BETWEEN:-1}" = 0 ] && between=
  intra=$(fit "${EMU[@]}" --host "$(cluster_hosts 4)" -np 8 -- --group 4 --sizes 64K:16M ${between:+--between $between})
else
  intra=$(fit "${EMU[@]}" --host "$(cluster_hosts 4 | cut -d, -f1)" -np 4)
  SHARE=(--cores $((CORES / 2 > 0 ? CORES / 2 : 1)))
fi
"${ENV[@]}" "$dtrain" plan "${S[@]}" -n 8 --ranks-per-node 4 "${SHARE[@]}" --threads 1 \
  --intra "$intra" --inter "$inter" --top 100000 --json >"$tmp/plan.json"
: >"$tmp/rows.txt"
for lay in $LAYOUTS; do
  t0=$(cluster_tx)
  layout_of "$lay"
  "${ENV[@]}" "${EMU[@]}" --host "$(cluster_hosts 4)" -np 8 "$dtrain" train "${S[@]}" "${RING[@]}" "${LAY_ARGS[@]}" \
    --set data.train="$tmp/rand.bin" --set data.val= --steps "$STEPS" --threads 1 --metrics "$tmp/$lay.jsonl" \
    >"$tmp/$lay.out" 2>&1 || { echo "bench_hsdp: $lay failed: $(tail -2 "$tmp/$lay.out")" >&2; exit 1; }
  t1=$(cluster_tx)
  echo "$lay $KEY $((t1 - t0))" >>"$tmp/rows.txt"
done
[ -n "${between:-}" ] && echo "intra-host link fitted with ${between} us of computation before each all-reduce (bench comm --between)"
python3 - "$tmp" "$STEPS" "$p0" "$(probe)" "$intra" "$inter" "$RATE" "$LOADED" <<'PY'
import json, sys
tmp, steps, p0, p1, intra, inter, rate, loaded = sys.argv[1:]
steps = int(steps)
plan = {}
for l in open(tmp + "/plan.json"):
    x = json.loads(l)
    if x["dp"] == 8: plan["z%ds%d:%s" % (x["zero"], x["dp_shard"], x["policy"])] = x
rows = []
for line in open(tmp + "/rows.txt"):
    lay, key, tx = line.split()
    r = [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, lay))]
    ms = sorted(x["ms"] for x in r if "step" in x and "event" not in x and x["step"] >= 3)
    s = [x for x in r if x.get("event") == "summary"][0]
    mem = max(q["params"] + q["grads"] + q["optim"] + q["activations"] + q["workspace"] for q in s["mem"])
    rows.append((lay, plan.get(key), ms[len(ms) // 2], int(tx) / steps / 2, mem))
print("2 emulated hosts x 4 ranks, link %s (tc tbf), %s; cpu-share probe %s before, %s after; links intra %s, inter %s; "
      "rate and intra link %s\n" % (rate, __import__("time").strftime("%Y-%m-%d"), p0, p1, intra, inter,
                                    "under the run's load" if loaded == "1" else "measured alone"))
print("| layout | step ms | predicted | ratio | MB across a host's link / step | predicted | max MB per rank | estimate | throughput vs ZeRO-3 |")
print("|---|---|---|---|---|---|---|---|---|")
z3 = [r for r in rows if r[0] == "zero3"]
for lay, x, ms, cross, mem in rows:
    pms = 1e3 * x["step_s"] if x else float("nan")
    pcross = x["cross_bytes"] / 1e6 if x else float("nan")
    pmem = x["memory"] / 1e6 if x else float("nan")
    vs = "%.2fx" % (z3[0][2] / ms) if z3 else "-"
    print("| %s | %.0f | %.0f | %.2f | %.1f | %.1f | %.1f | %.1f | %s |" % (lay, ms, pms, ms / pms, cross / 1e6, pcross,
          mem / 1e6, pmem, vs))
PY
