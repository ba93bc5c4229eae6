#!/bin/bash
# PyTorch baseline on the same GPT-2 124M (bench/gpu/torch_gpt2.py): compiled, bf16.
# Usage: bench/gpu/bench_torch.sh DTRAIN(unused) OUT_DIR [BATCH]
out=$2 batch=${3:-64}
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/torch_gpt2.py" --batch $batch --steps 20 --warmup 8 \
  --json $out/torch.jsonl 2>&1 | tail -5
