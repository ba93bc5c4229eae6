#!/bin/bash
# The GPU comparison in one command (issue 11): GPT-2 124M (12 x 768, T 1024, vocab
# 50304 padded), bf16, one micro-batch per step, dtrain and then PyTorch (compiled,
# fused AdamW, SDPA) at the same batch in the same run, and their ratio.
# On a GPU machine: bench/gpu/run.sh DTRAIN OUT_DIR [BATCH]   (from the repository root;
# through the device tool: scripts/gpu_check.sh 'bench/gpu/run.sh $DTRAIN $OUTDIR 64')
set -uo pipefail
dtrain=$1 out=$2 B=${3:-64}
here=$(dirname "$0")
# attention alone first: dtrain's kernels (each path) and PyTorch's SDPA backends
ab="$(dirname "$dtrain")/attention_bench"
# (and packed documents of 128 tokens, T/8: the document-masked kernels' saving)
{ "$ab"; DT_CUDA_FA_ROWS=16 "$ab"; DT_CUDA_ATTENTION=wmma "$ab"; "$ab" 64 1024 12 64 128; } | tee "$out/attention.txt"
python3 "$here/torch_attention.py" | tee -a "$out/attention.txt"
bash "$here/bench_dtrain.sh" "$dtrain" "$out" bf16 "$B" | tee "$out/dtrain.txt"
bash "$here/bench_torch.sh" x "$out" "$B" | tee "$out/torch.txt"
python3 - "$out/dtrain.txt" "$out/torch.txt" <<'PY'
import re, sys
get = lambda p: float(re.search(r"tokens/s=(\d+)", open(p).read()).group(1))
d, t = get(sys.argv[1]), get(sys.argv[2])
print("dtrain / torch = %.0f / %.0f = %.2fx" % (d, t, d / t))
PY
