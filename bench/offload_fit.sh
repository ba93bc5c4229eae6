#!/usr/bin/env bash
# A model that does not fit (issue 26's acceptance): each rank runs in its own memory
# cgroup (v1 memory.limit_in_bytes, or v2 memory.max; the page cache counts against it,
# which is why the offload files are O_DIRECT) capped at CAP_MB, and the model's 16·Ψ bytes
# (fp32 parameters, gradients, AdamW moments) are at least 3x the cap. With ZeRO-3 over 2
# ranks and offload.optimizer=nvme offload.param=nvme it trains STEPS steps under the cap
# and lands on the digest of the same layout without cap and without offload. With RESUME=1
# (the default) a capped run also saves after step STOP and another capped run resumes it
# to STEPS: a checkpoint of a model larger than the memory is written and read a unit at a
# time (streamed), and the resumed run lands on the same digest.
#
# usage: bench/offload_fit.sh [DTRAIN] [DIR]   (root: it creates cgroups)
# knobs: LAYERS=24 EMBD=1024 SEQ=128 STEPS=3 STOP=2 RESUME=1 CAP_MB (default: 16·Ψ/3 / 1e6, rounded down)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dtrain="$(realpath "${1:-$here/../build/dtrain}")"
dir="$(realpath -m "${2:-$here/../build/offload-fit}")"
LAYERS=${LAYERS:-24}; EMBD=${EMBD:-1024}; SEQ=${SEQ:-128}; STEPS=${STEPS:-3}; STOP=${STOP:-2}; RESUME=${RESUME:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mkdir -p "$dir/nvme"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; for g in /sys/fs/cgroup/memory/dtrain-fit-* /sys/fs/cgroup/dtrain-fit-*; do rmdir "$g" 2>/dev/null || true; done' EXIT
python3 - "$tmp/data.bin" <<'PY'
import random, struct, sys
random.seed(0); n = 200000
toks = [random.randrange(256) for _ in range(n)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack("<%dH" % n, *toks))
PY
ARGS=(train --set model.n_layer=$LAYERS --set model.n_head=16 --set model.n_embd=$EMBD --set model.seq_len=$SEQ
      --set model.vocab_size=256 --set data.train="$tmp/data.bin" --set data.val= --set train.micro_batch=1
      --set train.global_batch=2 --set parallel.zero=3 --set train.val_every=0 --set train.check_memory=false
      --steps $STEPS --threads 1 --digest --set log.sample_tokens=0)
# GPT-2's parameter count: wte (V·C, V = 256 padded to 64), wpe (T·C), per block 12·C² + 13·C, ln_f 2·C
psi_n=$(python3 -c "C, L, T = $EMBD, $LAYERS, $SEQ; print(256 * C + T * C + L * (12 * C * C + 13 * C) + 2 * C)")
psi=$(python3 -c "print('%.1f' % ($psi_n / 1e6))")
CAP_MB=${CAP_MB:-$(python3 -c "print(int(16 * $psi_n / 3 / 1e6))")}
echo "model: $LAYERS layers, width $EMBD, Ψ = ${psi}M parameters, 16·Ψ = $(python3 -c "print('%.0f' % (16 * $psi_n / 1e6))") MB; cap per rank $CAP_MB MB"

# capped: a wrapper puts each rank in its own cgroup before exec
cat >"$tmp/capped.sh" <<EOF
#!/bin/bash
r=\${OMPI_COMM_WORLD_RANK:-0}
if [ -d /sys/fs/cgroup/memory ]; then
  g=/sys/fs/cgroup/memory/dtrain-fit-\$r; mkdir -p \$g
  echo $((CAP_MB * 1024 * 1024)) > \$g/memory.limit_in_bytes
  echo 0 > \$g/memory.swappiness 2>/dev/null || true
else
  g=/sys/fs/cgroup/dtrain-fit-\$r; mkdir -p \$g
  echo $((CAP_MB * 1024 * 1024)) > \$g/memory.max; echo 0 > \$g/memory.swap.max
fi
echo \$\$ > \$g/cgroup.procs
exec "$dtrain" "\$@"
EOF
chmod +x "$tmp/capped.sh"
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader -np 2)
t0=$(date +%s.%N)
"${MPI[@]}" "$tmp/capped.sh" "${ARGS[@]}" --set offload.optimizer=nvme --set offload.param=nvme \
  --set offload.nvme_path="$dir/nvme" --metrics "$tmp/off.jsonl" >"$tmp/off.out" 2>&1 &
job=$!
disk=0
while kill -0 $job 2>/dev/null; do # the files' allocated bytes while the run lasts
  b=$(du -sb --apparent-size "$dir/nvme" 2>/dev/null | cut -f1); [ "${b:-0}" -gt $disk ] && disk=$b; sleep 0.5
done
wait $job || { echo "capped run failed:"; tail -5 "$tmp/off.out"; exit 1; }
t1=$(date +%s.%N)
failcnt=$(cat /sys/fs/cgroup/memory/dtrain-fit-0/memory.failcnt 2>/dev/null || echo "?")
maxu=$(cat /sys/fs/cgroup/memory/dtrain-fit-0/memory.max_usage_in_bytes 2>/dev/null || echo 0)
"${MPI[@]}" "$dtrain" "${ARGS[@]}" --metrics "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1 || { tail -5 "$tmp/ref.out"; exit 1; }
python3 - "$tmp/off.jsonl" "$tmp/ref.jsonl" "$CAP_MB" "$disk" "$maxu" "$psi_n" <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p)]
    return [r for r in rows if "event" not in r], [r for r in rows if r.get("event") == "summary"][-1]
(so, mo), (sr, mr) = load(sys.argv[1]), load(sys.argv[2])
cap, disk, maxu, psi = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
ms = lambda s: sorted(r["ms"] for r in s)[len(s) // 2]
print("| | peak RSS per rank (MB) | cgroup peak, rank 0 (MB) | offload files (MB) | step time (s, median) |")
print("|---|---|---|---|---|")
print("| ZeRO-3 dp2, NVMe offload, capped at %d MB | %s | %.0f | %.0f | %.1f |" % (
    cap, " / ".join("%.0f" % (r["peak_rss"] / 1e6) for r in mo["mem"]), maxu / 1e6, disk / 1e6, ms(so) / 1e3))
print("| ZeRO-3 dp2, no offload, no cap | %s | - | - | %.1f |" % (
    " / ".join("%.0f" % (r["peak_rss"] / 1e6) for r in mr["mem"]), ms(sr) / 1e3))
print("16·Ψ = %.0f MB = %.1fx the cap" % (16 * psi / 1e6, 16 * psi / 1e6 / cap))
PY
d1=$(grep -o 'digest sha256:[0-9a-f]*' "$tmp/off.out"); d2=$(grep -o 'digest sha256:[0-9a-f]*' "$tmp/ref.out")
echo "capped with offload: $d1"
echo "uncapped, no offload: $d2"
echo "cgroup failcnt (rank 0): $failcnt; wall time of the capped run $(python3 -c "print('%.0f' % ($t1 - $t0))") s"
[ -n "$d1" ] && [ "$d1" = "$d2" ] && echo "same weights: yes" || { echo "same weights: NO"; exit 1; }
[ "$RESUME" = 1 ] || exit 0
OFF=(--set offload.optimizer=nvme --set offload.param=nvme --set offload.nvme_path="$dir/nvme")
rm -rf "$dir/ck"
t2=$(date +%s.%N)
"${MPI[@]}" "$tmp/capped.sh" "${ARGS[@]}" "${OFF[@]}" --set train.stop_after=$STOP --save "$dir/ck" >"$tmp/save.out" 2>&1 ||
  { echo "capped save failed:"; tail -5 "$tmp/save.out"; exit 1; }
t3=$(date +%s.%N)
ckmb=$(du -sm "$dir/ck" | cut -f1)
"${MPI[@]}" "$tmp/capped.sh" "${ARGS[@]}" "${OFF[@]}" --resume "$dir/ck" >"$tmp/resume.out" 2>&1 ||
  { echo "capped resume failed:"; tail -5 "$tmp/resume.out"; exit 1; }
t4=$(date +%s.%N)
d3=$(grep -o 'digest sha256:[0-9a-f]*' "$tmp/resume.out")
echo "saved after step $STOP under the cap ($ckmb MB, run $(python3 -c "print('%.0f' % ($t3 - $t2))") s), resumed under the cap to step $STEPS ($(python3 -c "print('%.0f' % ($t4 - $t3))") s): $d3"
rm -rf "$dir/ck"
[ -n "$d3" ] && [ "$d3" = "$d2" ] && echo "resumed: same weights: yes" || { echo "resumed: same weights: NO"; exit 1; }
