#!/usr/bin/env bash
# The planner against measurement (issue 10): `dtrain plan` predicts each layout's step time
# and memory per rank from figures measured here (a rank's compute rate per shard shape and
# the optimizer's time per parameter, by `dtrain plan` itself; the links' alpha-beta by
# `dtrain bench comm`'s fit of the ring all-reduce), then each layout trains STEPS steps and
# its median step time (steps 3 on) and largest per-rank allocation (params, grads, optimizer,
# activations, workspace: what the estimator models) are set next to the prediction.
#   one node:  8 ranks on this machine's cores (--cores: the ranks share them);
#   emulated:  2 hosts x 4 ranks (tests/emulated_cluster.sh), their link capped with tc tbf
#              at RATE (default 1gbit), so layouts that send gradients across hosts pay;
#              collectives on our ring (the planner's volumes), links fitted on it.
# Model: 8 blocks x 512 wide, 8 heads, seq 256, vocabulary 256, global batch 16, micro-batch 2.
# usage: bench/bench_plan.sh [build/dtrain] [node|emulated|both]   (prints markdown tables)
set -euo pipefail
source "$(dirname "$0")/common.sh" plan "${1:-}"
WHICH=${2:-both} STEPS=${STEPS:-8} RATE=${RATE:-1gbit}
random_tokens "$tmp/rand.bin" 256 400000
CORES=$(nproc)
S=(--set model.n_layer=8 --set model.n_head=8 --set model.n_embd=512 --set model.seq_len=256
   --set model.vocab_size=256 --set train.global_batch=16 --set train.micro_batch=2 --set log.sample_tokens=0)
# dp,pp,cp,tp,zero: every dimension alone, each ZeRO stage, and mixes of two and three
LAYOUTS=(8,1,1,1,0 8,1,1,1,1 8,1,1,1,2 8,1,1,1,3 4,2,1,1,0 2,4,1,1,1 1,8,1,1,0 4,1,1,2,0 2,1,1,4,1 1,1,1,8,0
         4,1,2,1,1 1,1,8,1,0 2,2,1,2,1 2,1,2,2,1 1,2,2,2,0 2,2,2,1,3 1,1,2,4,0 1,4,1,2,0)
fit() { # mpirun args... -> "alpha:GBPS" of the ring all-reduce (as the trainer runs: its environment)
  "${ENV[@]}" "$@" "$dtrain" bench comm --ops allreduce --algos ring --sizes 4K:4M | grep -oE '[0-9.e+-]+:[0-9.e+-]+\)$' | tr -d ')'
}
measure() { # out-prefix "extra --set args" mpirun-args... : one line per layout: key ms mem
  local pre=$1 extra=$2; shift 2
  for L in "${LAYOUTS[@]}"; do
    IFS=, read -r dp pp cp tp z <<<"$L"
    local key=d${dp}p${pp}c${cp}t${tp}z${z}
    if ! "$@" "$dtrain" train "${S[@]}" --set parallel.pp="$pp" --set parallel.cp="$cp" --set parallel.tp="$tp" \
         --set parallel.zero="$z" $extra --set data.train="$tmp/rand.bin" --set data.val= --steps "$STEPS" --threads 1 \
         --metrics "$tmp/$pre$key.jsonl" >"$tmp/$pre$key.out" 2>&1; then
      echo "failed: $key" >&2; tail -3 "$tmp/$pre$key.out" >&2; continue
    fi
    python3 - "$tmp/$pre$key.jsonl" "$key" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
ms = sorted(x["ms"] for x in r if "step" in x and "event" not in x and x["step"] >= 3)
s = [x for x in r if x.get("event") == "summary"][0]
mem = max(q["params"] + q["grads"] + q["optim"] + q["activations"] + q["workspace"] for q in s["mem"])
print(sys.argv[2], ms[len(ms) // 2], mem)
PY
  done
}
table() { # title plan.json measured.txt probe-before probe-after links
  python3 - "$@" <<'PY'
import json, sys
title, planf, measf, p0, p1, links = sys.argv[1:]
plan = {}
for l in open(planf):
    x = json.loads(l); plan["d%dp%dc%dt%dz%d" % (x["dp"], x["pp"], x["cp"], x["tp"], x["zero"])] = x
print("\n%s (cpu-share probe %s before, %s after; links %s)\n" % (title, p0, p1, links))
print("| layout | m | predicted ms (compute x share, optimizer, tp, cp, pp, dp) | measured ms | measured/predicted | predicted MB | measured MB | ratio |")
print("|---|---|---|---|---|---|---|---|")
ok = n = 0
for line in open(measf):
    key, ms, mem = line.split(); ms, mem = float(ms), float(mem)
    x = plan.get(key)
    if not x: print("| %s | not in the plan |" % key); continue
    c = x["compute_s"] * max(x["share"], (x["m"] + x["pp"] - 1) / x["m"])
    parts = "%.0f (%.0f, %.0f, %.0f, %.0f, %.0f, %.0f)" % (1e3 * x["step_s"], 1e3 * c, 1e3 * x["optim_s"] * x["share"],
            1e3 * x["tp_s"], 1e3 * x["cp_s"], 1e3 * x["pp_s"], 1e3 * x["dp_s"])
    r = ms / (1e3 * x["step_s"]); n += 1; ok += abs(r - 1) <= 0.15
    lay = "dp%d pp%d cp%d tp%d" % (x["dp"], x["pp"], x["cp"], x["tp"]) + (" z%d" % x["zero"] if x["zero"] else "")
    print("| %s | %d | %s | %.0f | %.2f | %.2f | %.2f | %.4f |" % (lay, x["m"], parts, ms, r, x["memory"] / 1e6, mem / 1e6,
          mem / x["memory"]))
print("\n%d of %d layouts within 15%% of the predicted step time." % (ok, n))
PY
}
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader -x GLIBC_TUNABLES -x OMP_NUM_THREADS=1)
if [ "$WHICH" != emulated ]; then
  p0=$(probe)
  intra=$(fit "${MPI[@]}" -np 8)
  "${ENV[@]}" "$dtrain" plan "${S[@]}" -n 8 --cores "$CORES" --threads 1 --intra "$intra" --top 100000 --json >"$tmp/plan.json"
  measure n "" "${ENV[@]}" "${MPI[@]}" -np 8 >"$tmp/node.txt"
  table "One node: 8 ranks on $CORES cores, $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p')" \
        "$tmp/plan.json" "$tmp/node.txt" "$p0" "$(probe)" "intra $intra"
fi
if [ "$WHICH" != node ]; then
  source "$here/../tests/emulated_cluster.sh"
  trap 'cluster_down; rm -rf "$tmp"' EXIT
  cluster_up 2 "$RATE" || { echo "emulated hosts unavailable here (needs root and network namespaces)" >&2; exit 0; }
  p0=$(probe)
  EMU=("${CLUSTER_MPI[@]}" -x GLIBC_TUNABLES -x OMP_NUM_THREADS=1 --bind-to none)
  intra=$(fit "${EMU[@]}" --host "$(cluster_hosts 4 | cut -d, -f1)" -np 4)
  inter=$(fit "${EMU[@]}" --host "$(cluster_hosts 1)" -np 2)
  "${ENV[@]}" "$dtrain" plan "${S[@]}" -n 8 --ranks-per-node 4 --cores $((CORES / 2 > 0 ? CORES / 2 : 1)) --threads 1 \
      --intra "$intra" --inter "$inter" --top 100000 --json >"$tmp/plan2.json"
  # the ring for every collective (across hosts `auto` takes Open MPI's, whose volumes are not the ring's)
  RING="--set comm.allreduce=ring --set comm.reduce_scatter=ring --set comm.allgather=ring"
  measure e "$RING" "${ENV[@]}" "${EMU[@]}" --host "$(cluster_hosts 4)" -np 8 >"$tmp/emu.txt"
  table "Emulated: 2 hosts x 4 ranks, link $RATE (tc tbf), the machine's $CORES cores shared, $(date -u +%F)" \
        "$tmp/plan2.json" "$tmp/emu.txt" "$p0" "$(probe)" "intra $intra, inter $inter"
fi
