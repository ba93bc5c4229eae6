#!/usr/bin/env bash
# Data-parallel throughput in one run (issue 3): for the tiny shape (4 layers, 256 wide,
# seq 256, global batch 8) and GPT-2 small at seq 64 (global batch 8):
#   dtrain dp=1 x 1 thread (base), dp=1 x 2 threads, dp=2 x 1 thread (DDP, overlap on
#   and off: exposed communication per step; ZeRO-1), and PyTorch DDP (gloo, 2 ranks x 1
#   thread).
# Every contender gets the same environment: OpenBLAS variables unset and the glibc
# malloc tunables that stop per-step page faults. The VM's speed drifts by 10-20% over
# minutes, so contenders run interleaved, ROUNDS times (default 3): each figure is the
# median over rounds of a run's median step, and each ratio the median of the ratios
# taken within a round. A CPU-share probe runs before each measurement (below ~1.6 the
# second core is shared; the table gives the lowest probe of the row).
# usage: bench/bench_ddp.sh [build/dtrain]     (prints a markdown table)
# knobs (environment): ROUNDS=3, STEPS=8, SHAPES="tiny small", TORCH=1 (0: dtrain contenders
#   only), RESULTS=FILE (copy the raw results there: rows "shape key round probe tokens/s comm-ms").
set -euo pipefail
source "$(dirname "$0")/common.sh" ddp "${1:-}"
random_tokens "$tmp/rand.bin" 50257 400000
STEPS=${STEPS:-8}
SHAPES=${SHAPES:-"tiny small"}
TORCH=${TORCH:-1}
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
ROUNDS=${ROUNDS:-3}
torch_tps() { # shape-args... -> tok/s
  "${ENV[@]}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$here/torch_ddp_bench.py" "$@" \
    --global-batch 8 --ranks 2 --steps $STEPS 2>"$tmp/torch.err" \
    | python3 -c "import json,sys; print('%.0f -' % json.loads(sys.stdin.readlines()[-1])['tokens_per_s'])"
}
# contenders: key|label|how (dtrain NP THREADS extra-args... | torch)
CONTENDERS=(
  "d11|dtrain dp=1 x 1 thread|dtrain 1 1 --set train.micro_batch=8"
  "d12|dtrain dp=1 x 2 threads|dtrain 1 2 --set train.micro_batch=8"
  "ddp|dtrain DDP dp=2 x 1 thread, overlap true|dtrain 2 1 --set train.micro_batch=4 --set parallel.overlap=true"
  "ddpno|dtrain DDP dp=2 x 1 thread, overlap false|dtrain 2 1 --set train.micro_batch=4 --set parallel.overlap=false"
  "z1|dtrain ZeRO-1 dp=2 x 1 thread|dtrain 2 1 --set train.micro_batch=4 --set parallel.zero=1"
  "torch|PyTorch DDP gloo 2 x 1 thread|torch"
)
for shape in $SHAPES; do
  if [ $shape = tiny ]; then
    S=(--set model.n_layer=4 --set model.n_head=4 --set model.n_embd=256 --set model.seq_len=256 --set model.vocab_size=50257)
    T=(--n-layer 4 --n-embd 256 --n-head 4 --seq 256)
  else
    S=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=64 --set model.vocab_size=50257)
    T=(--n-layer 12 --n-embd 768 --n-head 12 --seq 64)
  fi
  for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${CONTENDERS[@]}"; do
      IFS='|' read -r key label how <<<"$c"
      read -r -a h <<<"$how"
      [ "${h[0]}" = torch ] && [ "$TORCH" = 0 ] && continue
      p=$(probe)
      if [ "${h[0]}" = torch ]; then out=$(torch_tps "${T[@]}")
      else out=$(run_dtrain ${shape}_$key "${h[1]}" "${h[2]}" "${S[@]}" --set train.global_batch=8 "${h[@]:3}"); fi
      echo "$shape $key $r $p $out" >>"$tmp/results"
    done
  done
done
[ -z "${RESULTS:-}" ] || cp "$tmp/results" "$RESULTS"
python3 - "$tmp/results" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
labels = {"d11": "dtrain dp=1 x 1 thread", "d12": "dtrain dp=1 x 2 threads",
          "ddp": "dtrain DDP dp=2 x 1 thread, overlap true", "ddpno": "dtrain DDP dp=2 x 1 thread, overlap false",
          "z1": "dtrain ZeRO-1 dp=2 x 1 thread", "torch": "PyTorch DDP gloo 2 x 1 thread"}
print("| shape | contender | lowest probe | tokens/s (median; range) | exposed comm ms/step | vs dp=1x1 | vs dp=1x2 | dtrain DDP / this |")
print("|---|---|---|---|---|---|---|---|")
for shape in ("tiny", "small"):
    R = {}
    for s, key, r, p, tps, ex in rows:
        if s == shape: R.setdefault(key, {})[int(r)] = (float(p), float(tps), ex)
    if not R:
        continue
    rounds = sorted(R["d11"])
    def ratio(a, b): return st.median(R[a][r][1] / R[b][r][1] for r in rounds)
    for key in (k for k in labels if k in R):
        v = [R[key][r][1] for r in rounds]
        ex = [float(R[key][r][2]) for r in rounds if R[key][r][2] != "-"]
        print("| %s | %s | %.2f | %.0f (%.0f-%.0f) | %s | %.2f | %s | %s |" % (
            shape, labels[key], min(R[key][r][0] for r in rounds), st.median(v), min(v), max(v),
            "%.1f" % st.median(ex) if ex else "-", ratio(key, "d11"),
            "%.2f" % ratio(key, "d12") if key not in ("d11", "d12") else "-",
            "%.2f" % ratio("ddp", key) if key == "torch" else "-"))
PY
