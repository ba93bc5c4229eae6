#!/bin/bash
# dtrain on the GPU: GPT-2 124M (12 x 768, T 1024, vocab 50257 padded to 50304) on
# random tokens, one micro-batch per step (no accumulation). Prints tokens/s (median
# over the steps after the first three) and MFU against the H100 SXM's dense bf16
# peak (989 TFLOP/s), then a per-kernel profile of a few steps.
# Usage: bench/gpu/bench_dtrain.sh DTRAIN OUT_DIR [PRECISION] [BATCH...]
set -uo pipefail
dtrain=$1 out=$2 precision=${3:-fp32}
shift 3 2>/dev/null || shift $#
batches=${*:-8 16}
data=/tmp/dt_bench_tokens.bin
[ -f $data ] || python3 - $data <<'PY'
import sys, struct, random
n = 8 * 1024 * 1024
rnd = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *(rnd.randrange(50257) for _ in range(n))))
PY
common=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=1024
        --set model.vocab_size=50257 --set data.train=$data --set data.val= --set train.val_every=0 --set log.sample_tokens=0 --set backend=cuda
        --set precision=$precision --set train.lr=6e-4 --set train.warmup_steps=10 --set log.every=5)
for B in $batches; do
  m=$out/dtrain_${precision}_b$B.jsonl
  rm -f $m
  "$dtrain" train "${common[@]}" --set train.micro_batch=$B --set train.global_batch=$B --steps 20 \
    --metrics $m > $out/dtrain_${precision}_b$B.log 2>&1 || { tail -3 $out/dtrain_${precision}_b$B.log; continue; }
  python3 - $m $B $precision <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"event"' not in l]
tps = statistics.median(r["tokens_per_s"] for r in rows[3:])
C, L, V, T = 768, 12, 50257, 1024
flops = 6 * (L * 12 * C * C + V * C) + 6 * L * C * T
print("dtrain precision=%s batch=%s T=1024 tokens/s=%.0f MFU=%.1f%% loss=%.4f" % (
    sys.argv[3], sys.argv[2], tps, 100 * tps * flops / 989e12, rows[-1]["loss"]))
PY
  grep "^gpu:" $out/dtrain_${precision}_b$B.log
  "$dtrain" estimate "${common[@]}" --set train.micro_batch=$B 2>&1 | grep -E "^zero 0|^activations"
done
B=${batches%% *}
"$dtrain" train "${common[@]}" --set train.micro_batch=$B --set train.global_batch=$B --steps 4 \
  --set log.profile=true > $out/dtrain_${precision}_profile.log 2>&1
grep "profile:" $out/dtrain_${precision}_profile.log
