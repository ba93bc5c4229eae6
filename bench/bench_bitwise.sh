#!/usr/bin/env bash
# What bitwise mode's thread-invariant kernels cost (issue 31, item 1): tokens/s of
# parallel.determinism=bitwise against fast, single process, at the tiny shape (4 layers,
# 256 wide, seq 256, batch 8) and at GPT-2 small (124M: 12 layers, 768 wide, seq 256,
# batch 4, fewer steps), random tokens. Fast and bitwise alternate within each round, the
# CPU-share probe (common.sh) before each pair; each figure is the tokens/s at the median
# step time of a run's timed steps, each ratio bitwise / fast within a round. Also the CPU
# seconds per timed step (user + sys of the run less those of a run of the warm-up steps
# alone, under OMP_WAIT_POLICY=passive so idle threads do not spin): the work each mode
# does, which other load on the machine stretches less than the wall clock.
# usage: bench/bench_bitwise.sh [build/dtrain]       (prints a markdown table)
# knobs: THREADS=2, ROUNDS=1, WARMUP=2, STEPS_TINY=8, STEPS_SMALL=4, SHAPES="tiny small",
# BITWISE_SET="--set parallel.cp_chunks=4" (extra settings of the bitwise runs: what
# context parallelism's canonical chunks cost a single process)
set -euo pipefail
source "$(dirname "$0")/common.sh" bitwise "${1:-}"
THREADS=${THREADS:-2}; ROUNDS=${ROUNDS:-1}; WARMUP=${WARMUP:-2}
STEPS_TINY=${STEPS_TINY:-8}; STEPS_SMALL=${STEPS_SMALL:-4}; SHAPES=${SHAPES:-"tiny small"}
random_tokens "$tmp/rand.bin" 50257 300000
shape_args() { # name -> L C H T B
  case "$1" in tiny) echo "4 256 4 256 8" ;; small) echo "12 768 12 256 4" ;; *) echo "unknown shape $1" >&2; exit 2 ;; esac
}
run() { # shape mode steps -> tokens/s at the median timed step, CPU seconds of the whole run
  local L C H T B
  read -r L C H T B <<<"$(shape_args "$1")"
  env -u OMP_NUM_THREADS OMP_WAIT_POLICY=passive "${ENV[@]}" /usr/bin/time -f "%U %S" -o "$tmp/cpu" "$dtrain" train \
    --set model.n_layer="$L" --set model.n_embd="$C" --set model.n_head="$H" --set model.seq_len="$T" \
    --set model.vocab_size=50257 --set train.micro_batch="$B" --set train.global_batch="$B" \
    --set data.train="$tmp/rand.bin" --set data.val= --set train.val_every=0 --set log.every=1000 --steps "$3" \
    --threads "$THREADS" --set parallel.determinism="$2" $([ "$2" = bitwise ] && echo "${BITWISE_SET:-}") --metrics "$tmp/$1_$2.jsonl" >"$tmp/$1_$2.out" 2>&1 ||
    { echo "failed: $1 $2" >&2; tail -3 "$tmp/$1_$2.out" >&2; return 1; }
  python3 -c "
import json, statistics, sys
ms = [r['ms'] for r in map(json.loads, open(sys.argv[1])) if 'event' not in r and r['step'] > int(sys.argv[2])]
u, s = map(float, open(sys.argv[4]).read().split()[-2:])
print('%.1f %.2f' % (int(sys.argv[3]) / (statistics.median(ms) / 1e3) if ms else 0, u + s))" \
    "$tmp/$1_$2.jsonl" "$WARMUP" $((B * T)) "$tmp/cpu"
}
per_step() { python3 -c 'import sys; a, b, n = map(float, sys.argv[1:]); print("%.3f" % ((a - b) / n))' "$@"; }
steps_of() { [ "$1" = tiny ] && echo "$STEPS_TINY" || echo "$STEPS_SMALL"; }
declare -A base # CPU seconds of a warm-up-only run, per shape and mode
for shape in $SHAPES; do
  for mode in fast bitwise; do base[$shape$mode]=$(run "$shape" "$mode" "$WARMUP" | cut -d' ' -f2); done
done
rows=()
for r in $(seq "$ROUNDS"); do
  for shape in $SHAPES; do
    n=$(steps_of "$shape")
    p=$(probe); f=($(run "$shape" fast $((WARMUP + n)))); b=($(run "$shape" bitwise $((WARMUP + n))))
    fc=$(per_step "${f[1]}" "${base[${shape}fast]}" "$n"); bc=$(per_step "${b[1]}" "${base[${shape}bitwise]}" "$n")
    echo "round $r $shape: probe $p, fast ${f[0]} tokens/s $fc CPU s/step, bitwise ${b[0]} tokens/s $bc CPU s/step" >&2
    rows+=("$shape $p ${f[0]} ${b[0]} $fc $bc")
  done
done
python3 - "$THREADS" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(nproc)" "${rows[@]}" <<'PY'
import statistics as st, sys
th, cpu, n = sys.argv[1:4]
rows = [r.split() for r in sys.argv[4:]]
names = {"tiny": "tiny (4 x 256, seq 256, batch 8)", "small": "GPT-2 small (124M, seq 256, batch 4)"}
print("| shape, %s thread(s) | fast tokens/s | bitwise tokens/s | bitwise / fast | CPU s/step fast | bitwise | "
      "bitwise / fast | CPU-share probe |" % th)
print("|---|---|---|---|---|---|---|---|")
for shape in dict.fromkeys(r[0] for r in rows):
    mine = [[r[0], r[1]] + [float(x) for x in r[2:]] for r in rows if r[0] == shape]
    med = lambda k: st.median(r[k] for r in mine)
    print("| %s | %.0f | %.0f | %.3f | %.2f | %.2f | %.3f | %s |" % (
        names[shape], med(2), med(3), st.median(r[3] / r[2] for r in mine), med(4), med(5),
        st.median(r[5] / r[4] for r in mine), " ".join(r[1] for r in mine)))
print("\n%s, %s CPUs; %d round(s)" % (cpu, n, len(rows) // len(set(r[0] for r in rows))))
PY
