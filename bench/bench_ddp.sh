#!/usr/bin/env bash
# Data-parallel throughput in one run (issue 3): for the tiny shape (4 layers, 256 wide,
# seq 256, global batch 8) and GPT-2 small at seq 64 (global batch 8):
#   dtrain dp=1 x 1 thread (base), dp=1 x 2 threads, dp=2 x 1 thread (DDP, overlap on
#   and off: exposed communication per step; ZeRO-1), and PyTorch DDP (gloo, 2 ranks x 1
#   thread).
# Every contender gets the same environment: OpenBLAS variables unset and the glibc
# malloc tunables that stop per-step page faults. A CPU-share probe runs before each
# measurement (below ~1.6 the second core is shared and the row is unreliable).
# usage: bench/bench_ddp.sh [build/dtrain]     (prints a markdown table)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dtrain="$(realpath "${1:-$here/../build/dtrain}")"
tmp="$(mktemp -d /tmp/dtrain-bench-ddp.XXXXXX)"; trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736)
gcc -O2 -o "$tmp/cpu_probe" "$here/cpu_probe.c" -lpthread
probe() { "$tmp/cpu_probe" | grep -oE '[0-9]+\.[0-9]+' | tail -1; }
/usr/bin/python3 - "$tmp/rand.bin" <<'PY'
import random, struct, sys
random.seed(0); n = 400000
toks = [random.randrange(50257) for _ in range(n)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack("<%dH" % n, *toks))
PY
STEPS=8
# dtrain tokens/s and exposed communication ms of the median step (as for PyTorch)
dt_tps() { python3 -c "
import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if '\"event\"' not in l]
med=lambda k: sorted(x[k] for x in r)[len(r)//2] if k in r[0] else None
c=med('comm_ms')
print('%.0f %s' % (med('tokens_per_s'), '-' if c is None else '%.1f' % c))" "$1"; }
run_dtrain() { # name np threads shape-args... -> prints tok/s [exposed ms]
  local name=$1 np=$2 th=$3; shift 3
  local cmd=("${ENV[@]}" "$dtrain" train "$@" --set data.train="$tmp/rand.bin" --set data.val= --steps $STEPS
             --threads "$th" --metrics "$tmp/$name.jsonl")
  if [ "$np" -gt 1 ]; then
    cmd=(mpirun --oversubscribe --bind-to none --mca btl self,vader -x GLIBC_TUNABLES -x OMP_NUM_THREADS=$th -np "$np" "${cmd[@]}")
  fi
  "${cmd[@]}" >"$tmp/$name.out" 2>&1 || { echo "failed: $name" >&2; tail -3 "$tmp/$name.out" >&2; return 1; }
  dt_tps "$tmp/$name.jsonl"
}
echo "| shape | contender | probe | tokens/s | exposed comm ms/step | vs dp=1x1 |"
echo "|---|---|---|---|---|---|"
for shape in tiny small; do
  if [ $shape = tiny ]; then
    S=(--set model.n_layer=4 --set model.n_head=4 --set model.n_embd=256 --set model.seq_len=256 --set model.vocab_size=50257)
    T=(--n-layer 4 --n-embd 256 --n-head 4 --seq 256); seq=256
  else
    S=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=64 --set model.vocab_size=50257)
    T=(--n-layer 12 --n-embd 768 --n-head 12 --seq 64); seq=64
  fi
  p=$(probe); read -r base _ < <(run_dtrain ${shape}_11 1 1 "${S[@]}" --set train.micro_batch=8)
  echo "| $shape | dtrain dp=1 x 1 thread | $p | $base | - | 1.00 |"
  p=$(probe); read -r v _ < <(run_dtrain ${shape}_12 1 2 "${S[@]}" --set train.micro_batch=8)
  echo "| $shape | dtrain dp=1 x 2 threads | $p | $v | - | $(python3 -c "print('%.2f' % ($v/$base))") |"
  two=$v
  for ov in true false; do
    p=$(probe); read -r v ex < <(run_dtrain ${shape}_21$ov 2 1 "${S[@]}" --set train.micro_batch=4 --set train.global_batch=8 --set parallel.overlap=$ov)
    echo "| $shape | dtrain DDP dp=2 x 1 thread, overlap $ov | $p | $v | $ex | $(python3 -c "print('%.2f' % ($v/$base))") (vs dp=1x2: $(python3 -c "print('%.2f' % ($v/$two))")) |"
    [ $ov = true ] && ddp=$v
  done
  # ZeRO-1: the same data parallelism with the optimizer step split over the ranks (DDP
  # repeats the memory-bound AdamW pass on every rank)
  p=$(probe); read -r v ex < <(run_dtrain ${shape}_21z1 2 1 "${S[@]}" --set train.micro_batch=4 --set train.global_batch=8 --set parallel.zero=1)
  echo "| $shape | dtrain ZeRO-1 dp=2 x 1 thread | $p | $v | $ex | $(python3 -c "print('%.2f' % ($v/$base))") (vs dp=1x2: $(python3 -c "print('%.2f' % ($v/$two))")) |"
  p=$(probe)
  tv=$("${ENV[@]}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$here/torch_ddp_bench.py" "${T[@]}" \
       --global-batch 8 --ranks 2 --steps 8 2>"$tmp/torch.err" \
       | python3 -c "import json,sys; print('%.0f' % json.loads(sys.stdin.readlines()[-1])['tokens_per_s'])")
  echo "| $shape | PyTorch DDP gloo 2 x 1 thread | $p | $tv | - | $(python3 -c "print('%.2f' % ($tv/$base))") (dtrain DDP / torch DDP: $(python3 -c "print('%.2f' % ($ddp/$tv))")) |"
done
