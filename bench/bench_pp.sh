#!/usr/bin/env bash
# Pipeline bubble (issue 9): pp = 4 stages on 4 ranks x 1 thread, m in {4, 8, 16}
# micro-batches per step, schedules gpipe, 1f1b, interleaved (2 chunks of 1 block per
# rank) and zb-h1; prints, per run, the measured
# bubble (1 - compute / time in the schedule, averaged over stages; dtrain's summary line)
# next to the schedule's formula, and each stage's activation bytes. Model: 8 blocks (2 per
# stage), 256 wide, seq 128, micro-batch 4, vocabulary 512 (so the head does not dominate
# the last stage), random tokens, 6 steps.
# On a machine with fewer cores than ranks the stages share cores: a waiting rank sleeps
# in the MPI receive (mpi_yield_when_idle) so the computing ones get the cores, and the
# compute time of a stage is its own F/B/W time; stages computing at the same time still
# slow each other, which inflates every schedule's compute alike (say so with the figures).
# usage: bench/bench_pp.sh [build/dtrain]     (prints a markdown table)
set -euo pipefail
source "$(dirname "$0")/common.sh" pp "${1:-}"
random_tokens "$tmp/rand.bin" 512 300000
S=(--set model.n_layer=8 --set model.n_head=4 --set model.n_embd=256 --set model.seq_len=128 --set model.vocab_size=512
   --set train.micro_batch=4 --set log.sample_tokens=0 --set data.train="$tmp/rand.bin" --set data.val= --steps 6
   --threads 1 --set parallel.pp=4)
echo "| schedule | m | measured bubble | formula | step ms | stage activations (MB) |"
echo "|---|---|---|---|---|---|"
for m in 4 8 16; do
  for sched in gpipe 1f1b interleaved zb-h1; do
    v=1; [ $sched = interleaved ] && v=2
    mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --mca btl self,vader -x OMP_NUM_THREADS=1 -np 4 \
      "$dtrain" train "${S[@]}" --set train.global_batch=$((4 * m)) --set parallel.schedule=$sched \
      --set parallel.virtual_stages=$v \
      --metrics "$tmp/m.jsonl" >"$tmp/out" 2>&1 || { echo "failed: $sched m=$m" >&2; tail -3 "$tmp/out" >&2; exit 1; }
    python3 - "$tmp/out" "$tmp/m.jsonl" $sched $m <<'PY'
import json, re, sys
out = open(sys.argv[1]).read()
b = re.search(r"pipeline bubble: measured ([0-9.]+), formula .* = ([0-9.]+)", out)
acts = re.findall(r"; ([0-9.]+) MB", out.split("pipeline:")[1].splitlines()[0]) if "pipeline:" in out else []
r = [json.loads(l) for l in open(sys.argv[2]) if '"event"' not in l]
ms = sorted(x["ms"] for x in r[1:])[len(r[1:]) // 2] if len(r) > 1 else float("nan")
print("| %s | %s | %s | %s | %.0f | %s |" % (sys.argv[3], sys.argv[4], b.group(1), b.group(2), ms, " / ".join(acts)))
PY
  done
done
