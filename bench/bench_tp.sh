#!/usr/bin/env bash
# Tensor parallelism against data parallelism on two cores (issue 8), GPT-2 small shape
# (12 layers, 768 wide, 12 heads, vocabulary 50257) at seq 64, global batch 8, random
# tokens: dtrain dp=1 x 2 threads, DDP dp=2 x 1 thread, tp=2 x 1 thread (each rank half
# of every block and of the vocabulary; all-reduces inside forward and backward, none
# overlapped), and tp=2 with sequence parallelism (reduce-scatters and all-gathers). Prints tokens/s (median over rounds of each run's median step) and the
# time tp spends in its collectives per step. Contenders run interleaved, ROUNDS times
# (default 3), each after a CPU-share probe (below ~1.6 the second core is shared).
# usage: bench/bench_tp.sh [build/dtrain]     (prints a markdown table)
set -euo pipefail
source "$(dirname "$0")/common.sh" tp "${1:-}"
random_tokens "$tmp/rand.bin" 50257 400000
STEPS=8 ROUNDS=${ROUNDS:-3}
S=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=64
   --set model.vocab_size=50257 --set train.global_batch=8 --set log.sample_tokens=0)
run() { # key np threads extra... -> "tok/s tp_ms"
  local key=$1 np=$2 th=$3; shift 3
  local cmd=("${ENV[@]}" "$dtrain" train "${S[@]}" "$@" --set data.train="$tmp/rand.bin" --set data.val= --steps $STEPS
             --threads "$th" --metrics "$tmp/$key.jsonl")
  [ "$np" -gt 1 ] && cmd=(mpirun --oversubscribe --bind-to none --mca btl self,vader -x GLIBC_TUNABLES
                           -x OMP_NUM_THREADS=$th -np "$np" "${cmd[@]}")
  "${cmd[@]}" >"$tmp/$key.out" 2>&1 || { echo "failed: $key" >&2; tail -3 "$tmp/$key.out" >&2; return 1; }
  python3 - "$tmp/$key.jsonl" "$tmp/$key.out" <<'PY'
import json, re, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"event"' not in l]
tps = sorted(x["tokens_per_s"] for x in r)[len(r) // 2]
m = re.search(r"tensor-parallel communication: ([0-9.]+) ms/step", open(sys.argv[2]).read())
print("%.0f %s" % (tps, m.group(1) if m else "-"))
PY
}
CONTENDERS=("d12|dtrain dp=1 x 2 threads|1 2 --set train.micro_batch=8"
            "ddp|dtrain DDP dp=2 x 1 thread|2 1 --set train.micro_batch=4"
            "tp2|dtrain tp=2 x 1 thread|2 1 --set train.micro_batch=8 --set parallel.tp=2"
            "tp2sp|dtrain tp=2 + sp x 1 thread|2 1 --set train.micro_batch=8 --set parallel.tp=2 --set parallel.sp=true")
for ((r = 1; r <= ROUNDS; r++)); do
  for c in "${CONTENDERS[@]}"; do
    IFS='|' read -r key label how <<<"$c"
    read -r -a h <<<"$how"
    p=$(probe)
    echo "$key $r $p $(run $key "${h[@]}")" >>"$tmp/results"
  done
done
python3 - "$tmp/results" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
labels = {"d12": "dtrain dp=1 x 2 threads", "ddp": "dtrain DDP dp=2 x 1 thread", "tp2": "dtrain tp=2 x 1 thread",
          "tp2sp": "dtrain tp=2 + sp x 1 thread"}
R = {}
for key, r, p, tps, ms in rows: R.setdefault(key, {})[int(r)] = (float(p), float(tps), ms)
rounds = sorted(R["d12"])
print("| contender | lowest probe | tokens/s (median; range) | tp collectives ms/step | vs dp=1x2 | vs DDP dp=2 |")
print("|---|---|---|---|---|---|")
for key, label in labels.items():
    v = [R[key][r][1] for r in rounds]
    ms = [float(R[key][r][2]) for r in rounds if R[key][r][2] != "-"]
    ratio = lambda b: st.median(R[key][r][1] / R[b][r][1] for r in rounds)
    print("| %s | %.2f | %.0f (%.0f-%.0f) | %s | %.2f | %.2f |" % (label, min(R[key][r][0] for r in rounds),
          st.median(v), min(v), max(v), "%.1f" % st.median(ms) if ms else "-", ratio("d12"), ratio("ddp")))
PY
