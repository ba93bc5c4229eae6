#!/usr/bin/env bash
# ZeRO-Offload's delayed parameter update (offload.delayed_update, issue 26 item 7), two parts:
#  curve  the demo's model and data (make demo's fortunes corpus), STEPS_CURVE steps, exact
#         (offload.optimizer=cpu) against delayed (warmup WARMUP): the loss and validation loss
#         side by side every REPORT steps, the largest relative difference of the training loss
#         after the warmup, both final validation losses; an HTML page of both curves
#         (dtrain report) at OUT/dpu-curve.html.
#  step   step time at GPT-2 small (seq 64, global batch 8), one process on THREADS thread(s):
#         no offload, offload cpu, offload cpu + delay, offload nvme, offload nvme + delay; the
#         median step time of each and its ratio to no offload. The delay takes the update off
#         the critical path only where a core is free for its thread: run it with THREADS below
#         the cores (1 on a 2-core machine).
# usage: bash bench/offload_dpu.sh [OUT [path/to/dtrain]]   (OUT default build/dpu-bench)
# knobs (environment): PARTS="curve step", STEPS_CURVE=1000 (the demo's run), WARMUP=40, REPORT=50,
#   LR (curve: train.lr, and min_lr a tenth of it; default the demo's 2e-3), STEPS=8 (step
#   part, the first 2 untimed), THREADS=1, NVME_DIR=OUT (the offload files).
# Takes about 15 minutes on 2 cores with the defaults.
set -euo pipefail
source "$(dirname "$0")/common.sh" dpu "${2:-}"
src="$(cd "$here/.." && pwd)"
OUT="$(realpath -m "${1:-$src/build/dpu-bench}")"
mkdir -p "$OUT"
PARTS=${PARTS:-"curve step"}
STEPS_CURVE=${STEPS_CURVE:-1000}
WARMUP=${WARMUP:-40}
REPORT=${REPORT:-50}
STEPS=${STEPS:-8}
THREADS=${THREADS:-1}
NVME_DIR=${NVME_DIR:-$OUT}
LR=${LR:-}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, probe $(probe)," \
     "$(date -u +%Y-%m-%d)" >&2

if [[ " $PARTS " == *" curve "* ]]; then
  corpus=/usr/share/games/fortunes
  inputs=()
  for f in "$corpus"/*; do case "$f" in *.dat|*.u8) continue ;; esac; [ -f "$f" ] && inputs+=(--input "$f"); done
  [ ${#inputs[@]} -gt 0 ] || { echo "offload_dpu: no corpus in $corpus (apt-get install fortunes)" >&2; exit 2; }
  "$dtrain" prepare --fortune "${inputs[@]}" --out "$tmp/demo" --val-fraction 0.05 >/dev/null
  base=(train --set data.train="$tmp/demo_train.bin" --set data.val="$tmp/demo_val.bin" --steps "$STEPS_CURVE"
        --set train.val_every="$REPORT" --threads "$THREADS" --set offload.optimizer=cpu)
  [ -n "$LR" ] && base+=(--set train.lr="$LR" --set train.min_lr="$(python3 -c "print($LR / 10)")")
  echo "curve: exact, $STEPS_CURVE steps" >&2
  "${ENV[@]}" "$dtrain" "${base[@]}" --metrics "$OUT/exact.jsonl" >"$OUT/exact.out" 2>&1
  echo "curve: delayed (warmup $WARMUP), $STEPS_CURVE steps" >&2
  "${ENV[@]}" "$dtrain" "${base[@]}" --set offload.delayed_update=true --set offload.delayed_update_warmup="$WARMUP" \
    --metrics "$OUT/delayed.jsonl" >"$OUT/delayed.out" 2>&1
  "$dtrain" report "$OUT/exact.jsonl" "$OUT/delayed.jsonl" --out "$OUT/dpu-curve.html" >/dev/null
  python3 - "$OUT/exact.jsonl" "$OUT/delayed.jsonl" "$WARMUP" "$REPORT" <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p)]
    return ({r["step"]: r["loss"] for r in rows if "event" not in r and "loss" in r},
            {r["step"]: r["val_loss"] for r in rows if r.get("event") == "val"})
(el, ev), (dl, dv) = load(sys.argv[1]), load(sys.argv[2])
warm, every = int(sys.argv[3]), int(sys.argv[4])
print("| step | train loss, exact | train loss, delayed | val loss, exact | val loss, delayed |")
print("|---|---|---|---|---|")
for s in sorted(ev):
    print("| %d | %.4f | %.4f | %.4f | %.4f |" % (s, el[s], dl[s], ev[s], dv.get(s, float("nan"))))
after = [s for s in el if s > warm + 1]
worst = max(abs(dl[s] - el[s]) / el[s] for s in after)
first = min(s for s in el if dl[s] != el[s])
print()
print("first step whose loss differs: %d (warmup %d); largest relative difference of the training loss after it: %.3f;"
      " final val loss exact %.4f, delayed %.4f (%+.2f%%)" % (first, warm, worst, ev[max(ev)], dv[max(dv)],
      100 * (dv[max(dv)] - ev[max(ev)]) / ev[max(ev)]))
PY
fi

if [[ " $PARTS " == *" step "* ]]; then
  random_tokens "$tmp/rand.bin" 50257 400000
  S=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.seq_len=64
     --set model.vocab_size=50257 --set train.global_batch=8 --set train.micro_batch=8)
  NV=(--set offload.nvme_path="$NVME_DIR")
  D=(--set offload.delayed_update=true --set offload.delayed_update_warmup=1)
  declare -A ARGS=(
    [none]=""
    [cpu]="--set offload.optimizer=cpu"
    [cpu+delay]="--set offload.optimizer=cpu ${D[*]}"
    [nvme]="--set offload.optimizer=nvme ${NV[*]}"
    [nvme+delay]="--set offload.optimizer=nvme ${NV[*]} ${D[*]}"
  )
  echo "| offload | probe | step ms (median of steps 3..$STEPS) | update ms (median) | vs none |"
  echo "|---|---|---|---|---|"
  ref=""
  for k in none cpu cpu+delay nvme nvme+delay; do
    read -r -a extra <<<"${ARGS[$k]}"
    p=$(probe)
    echo "step: $k" >&2
    "${ENV[@]}" "$dtrain" train "${S[@]}" "${extra[@]}" --set data.train="$tmp/rand.bin" --set data.val= \
      --steps "$STEPS" --threads "$THREADS" --metrics "$tmp/$k.jsonl" >"$tmp/$k.out" 2>&1 ||
      { echo "| $k | $p | failed: $(grep -m1 error "$tmp/$k.out") | | |"; continue; }
    read -r ms up < <(python3 -c "
import json, statistics as st, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '\"event\"' not in l][2:]
print('%.0f %s' % (st.median(x['ms'] for x in r), ('%.0f' % st.median(x['offload_ms'] for x in r)) if 'offload_ms' in r[0] else '-'))" "$tmp/$k.jsonl")
    [ -z "$ref" ] && ref=$ms
    echo "| $k | $p | $ms | $up | $(python3 -c "print('%.2fx' % ($ms / $ref))") |"
  done
fi
