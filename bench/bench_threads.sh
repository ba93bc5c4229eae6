#!/usr/bin/env bash
# Threads per rank (issue 23, item 1): `mpirun -np 4` with no thread setting against the
# explicit `--threads 1` run and a forced oversubscription (threads = all CPUs per rank),
# on the demo model (4 layers, 128 wide, seq 128, global batch 16), interleaved ROUNDS
# times (default 3); each figure is the median tokens/s of a run's steps 2..N, each ratio
# the median of the ratios within a round. The CPU-share probe runs before each round.
# usage: bench/bench_threads.sh [build/dtrain]     (prints a markdown table)
set -euo pipefail
source "$(dirname "$0")/common.sh" threads "${1:-}"
random_tokens "$tmp/rand.bin" 256 200000
STEPS=${STEPS:-12}
ROUNDS=${ROUNDS:-3}
ncpu=$(nproc)
run() { # name threads-setting -> median tokens/s
  local name=$1 th=$2
  env -u OMP_NUM_THREADS mpirun --oversubscribe --mca btl self,vader -x GLIBC_TUNABLES -np 4 "${ENV[@]}" "$dtrain" train \
    --set model.n_layer=4 --set model.n_embd=128 --set model.n_head=4 --set model.seq_len=128 \
    --set train.micro_batch=4 --set train.global_batch=16 --set data.train="$tmp/rand.bin" --set data.val= \
    --steps $STEPS --set threads=$th --metrics "$tmp/$name.jsonl" >"$tmp/$name.out" 2>&1 \
    || { echo "failed: $name" >&2; tail -3 "$tmp/$name.out" >&2; return 1; }
  python3 -c "
import json,sys
r=sorted(x['tokens_per_s'] for x in map(json.loads, open(sys.argv[1])) if 'event' not in x and x['step'] > 1)
print('%.0f' % r[len(r)//2])" "$tmp/$name.jsonl"
}
declare -a A O F P
for r in $(seq "$ROUNDS"); do
  P+=("$(probe)")
  A+=("$(run auto 0)"); O+=("$(run one 1)"); F+=("$(run forced "$ncpu")")
done
auto_threads=$(sed -n 's/^dtrain: threads \(.*\)$/\1/p' "$tmp/auto.out")
python3 - "$ncpu" "$auto_threads" "${P[*]}" "${A[*]}" "${O[*]}" "${F[*]}" <<'PY'
import statistics as st, sys
ncpu, auto = sys.argv[1], sys.argv[2]
p, a, o, f = ([float(x) for x in s.split()] for s in sys.argv[3:7])
med = lambda v: st.median(v)
print("| mpirun -np 4, demo model | tokens/s | vs --threads 1 |")
print("|---|---|---|")
print("| no thread setting (%s) | %.0f | %.2f |" % (auto, med(a), med([x / y for x, y in zip(a, o)])))
print("| --threads 1 | %.0f | 1.00 |" % med(o))
print("| --threads %s (forced, warned) | %.0f | %.3f |" % (ncpu, med(f), med([x / y for x, y in zip(f, o)])))
print("\n%s CPUs; CPU-share probe (lowest of %d rounds): %.2f" % (ncpu, len(p), min(p)))
PY
