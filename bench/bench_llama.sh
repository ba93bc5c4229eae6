#!/usr/bin/env bash
# Llama training throughput: dtrain against PyTorch (bench/torch_llama_bench.py: the same
# architecture, fp32, a full step with clipping and AdamW, random tokens) at SmolLM-135M's
# shape (30 layers, 576 wide, 9 heads with 3 key/value heads, SwiGLU 1536, vocabulary
# 49152, tied head: 135M parameters), T 256, batch 4, with 1 and 2 threads; a CPU-share
# probe around every run; tokens/s at the median step time. Ends with a markdown table
# for docs/benchmarks.md. Needs /usr/bin/python3 with torch (Debian python3-torch).
# usage: bash bench/bench_llama.sh [path/to/dtrain]; knobs: WARMUP=2 STEPS=5 THREADS_LIST="1 2"
#   SHAPE="30 576 9 3 1536 49152 256 4" (L C H KV I V T B)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/.." && pwd)"
dtrain="$(realpath "${1:-$src/build/dtrain}")"
py=/usr/bin/python3
WARMUP=${WARMUP:-2} STEPS=${STEPS:-5} THREADS_LIST=${THREADS_LIST:-"1 2"}
read -r L C H KV I V T B <<<"${SHAPE:-30 576 9 3 1536 49152 256 4}"
ENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
     GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -o "$tmp/cpu_probe" "$here/cpu_probe.c" -lpthread
probe() { "$tmp/cpu_probe" | sed -E 's/.*= ([0-9.]+).*/\1/'; }
"$py" - "$tmp/tokens.bin" "$V" <<'PY'
import random, struct, sys
n, V = 200000, int(sys.argv[2])
rng = random.Random(1234)
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, n
open(sys.argv[1], "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % n, *[rng.randrange(V) for _ in range(n)]))
PY
median_tps() { "$py" -c 'import statistics, sys; ms = [float(x) for x in sys.stdin.read().split()]
print("%.0f" % (int(sys.argv[1]) / (statistics.median(ms) / 1e3)))' $((B * T)); }
rows=()
for th in $THREADS_LIST; do
  p0=$(probe)
  "${ENV[@]}" "$dtrain" train --set model.family=llama --set model.n_layer="$L" --set model.n_embd="$C" \
    --set model.n_head="$H" --set model.n_kv_head="$KV" --set model.intermediate_size="$I" --set model.seq_len="$T" \
    --set model.vocab_size="$V" --set train.micro_batch="$B" --set train.global_batch="$B" \
    --set data.train="$tmp/tokens.bin" --set data.val= --set log.every=1000 --steps $((WARMUP + STEPS)) \
    --threads "$th" --metrics "$tmp/m.jsonl" >"$tmp/d.log" 2>&1 || { tail -3 "$tmp/d.log"; exit 1; }
  d=$("$py" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "event" not in r and r["step"] > int(sys.argv[2]): print(r["ms"])' "$tmp/m.jsonl" "$WARMUP" | median_tps)
  p1=$(probe)
  "${ENV[@]}" OMP_NUM_THREADS="$th" OPENBLAS_NUM_THREADS="$th" OMP_WAIT_POLICY=PASSIVE "$py" "$here/torch_llama_bench.py" \
    --n-layer "$L" --n-embd "$C" --n-head "$H" --n-kv-head "$KV" --inter "$I" --vocab "$V" --seq "$T" --batch "$B" \
    --threads "$th" --warmup "$WARMUP" --steps "$STEPS" >"$tmp/t.log" 2>&1 || { tail -3 "$tmp/t.log"; exit 1; }
  t=$("$py" -c 'import json, sys; print("\n".join(str(x) for x in json.loads(open(sys.argv[1]).read().splitlines()[-1])["ms"]))' \
      "$tmp/t.log" | median_tps)
  p2=$(probe)
  params=$(grep -o '[0-9.]*M parameters' "$tmp/d.log" | head -1)
  rows+=("| $th | $d | $t | **$("$py" -c "print('%.2f' % ($d / $t))")** | $p0 / $p1 / $p2 |")
  echo "threads $th: dtrain $d tok/s, torch $t tok/s ($params; probes $p0 $p1 $p2)" >&2
done
echo
echo "### Llama (SmolLM-135M shape: L$L C$C H$H KV$KV I$I V$V, T $T, B $B), $(date -I), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo
echo "| threads | dtrain tok/s | PyTorch $("$py" -c 'import torch; print(torch.__version__)') tok/s | ratio | CPU-share probes |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
