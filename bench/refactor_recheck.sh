#!/usr/bin/env bash
# A closer look at configurations of bench/refactor_perf.sh outside its ±3%: the same
# command lines as bench_train.sh / bench_ddp.sh build for them, old and new binary
# alternating (old-new, then new-old) for PAIRS pairs, 10 steps each, tokens/s the median
# of steps 3..10; per configuration the median of the pair ratios new/old and their range.
# More pairs of fewer configurations than refactor_perf.sh gives in the same time, for
# telling a real difference from the noise of a 2-core machine.
#
# usage: bench/refactor_recheck.sh OLD_DTRAIN NEW_DTRAIN
# knobs: PAIRS=10, CONFIGS="tiny_ddp tiny_ddpno tiny_d12 small_ddpno" (shape_key: tiny or small;
#   d11, d12 = one process on 1 or 2 threads, micro-batch 8; ddp, ddpno = DDP dp=2 with and
#   without overlap, z1 = ZeRO-1 dp=2, micro-batch 4; global batch 8), KEEP=DIR.
# Takes about PAIRS x 2.3 minutes with the default configurations on 2 cores.
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
old="$(realpath "$1")"; new="$(realpath "$2")"
for b in "$old" "$new"; do [ -x "$b" ] || { echo "refactor_recheck: no binary '$b'" >&2; exit 2; }; done
source "$here/common.sh" recheck "$new"
PAIRS=${PAIRS:-10}
CONFIGS=${CONFIGS:-"tiny_ddp tiny_ddpno tiny_d12 small_ddpno"}
out=${KEEP:-$tmp/runs}; mkdir -p "$out"
random_tokens "$tmp/rand.bin" 50257 2000000
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M')"
run() { # TAG BINARY CONFIG
  local tag=$1 b=$2 shape=${3%%_*} key=${3#*_} np=1 th=1 S X
  if [ "$shape" = tiny ]; then
    S=(--set model.n_layer=4 --set model.n_head=4 --set model.n_embd=256 --set model.seq_len=256)
  else
    S=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=64)
  fi
  case $key in
    d11) X=(--set train.micro_batch=8) ;;
    d12) th=2; X=(--set train.micro_batch=8) ;;
    ddp) np=2; X=(--set train.micro_batch=4 --set parallel.overlap=true) ;;
    ddpno) np=2; X=(--set train.micro_batch=4 --set parallel.overlap=false) ;;
    z1) np=2; X=(--set train.micro_batch=4 --set parallel.zero=1) ;;
    *) echo "refactor_recheck: unknown configuration '$3'" >&2; exit 2 ;;
  esac
  local cmd=("${ENV[@]}" "$b" train "${S[@]}" --set model.vocab_size=50257 --set train.global_batch=8 "${X[@]}"
             --set data.train="$tmp/rand.bin" --set data.val= --steps 10 --threads $th --metrics "$out/$tag.jsonl")
  [ $np -gt 1 ] && cmd=(mpirun --oversubscribe --bind-to none --mca btl self,vader -x GLIBC_TUNABLES
                        -x OMP_NUM_THREADS=$th -np $np "${cmd[@]}")
  "${cmd[@]}" >"$out/$tag.out" 2>&1 || echo "  failed: $tag"
}
for ((i = 1; i <= PAIRS; i++)); do
  order="old new"; [ $((i % 2)) -eq 0 ] && order="new old"
  for c in $CONFIGS; do
    for w in $order; do
      b=$new; [ $w = old ] && b=$old
      echo "pair $i/$PAIRS: $c, $w binary (probe $(probe)) $(date -u +%H:%M:%S)"
      run "$c.$w.$i" "$b" "$c"
    done
  done
done
python3 - "$out" "$PAIRS" $CONFIGS <<'PY'
import json, statistics as st, sys
out, n, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def tps(path):
    r = [json.loads(l) for l in open(path) if '"event"' not in l][2:]
    return st.median(x["tokens_per_s"] for x in r)
print()
print("| configuration | pairs | old tokens/s (median) | new tokens/s (median) | new / old (median of pairs; range) |")
print("|---|---|---|---|---|")
for c in configs:
    o, w, q = [], [], []
    for i in range(1, n + 1):
        try:
            a, b = tps("%s/%s.old.%d.jsonl" % (out, c, i)), tps("%s/%s.new.%d.jsonl" % (out, c, i))
        except (OSError, ValueError, KeyError):
            continue
        o.append(a); w.append(b); q.append(b / a)
    if q:
        print("| %s | %d | %.0f | %.0f | %.3f (%.3f-%.3f) |" % (c, len(q), st.median(o), st.median(w), st.median(q), min(q), max(q)))
PY
