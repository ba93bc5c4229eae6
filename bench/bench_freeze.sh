#!/usr/bin/env bash
# Half the blocks frozen against none (issue 30): the same model trained with nothing
# frozen and with the embeddings and the lower half of the blocks frozen (train.freeze),
# alternating in one run, ROUNDS times: the median ms per step (the first step not timed)
# and their ratio, the optimizer moments' bytes (the summary's "optim"), and with dp 2
# (DDP) the gradient bytes each rank puts into the all-reduce per step. A CPU-share probe
# runs before each round (about 2.0 when both cores are ours; the table gives the range).
# usage: bash bench/bench_freeze.sh [build/dtrain]   env: ROUNDS (3), STEPS (6)
set -euo pipefail
source "$(dirname "$0")/common.sh" freeze "${1:-}"
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-6}
random_tokens "$tmp/tok.bin" 4096 200000
L=8
HALF="wte.weight,wpe.weight$(for ((l = 0; l < L / 2; l++)); do printf ',h.%d.*' $l; done)"
SHAPE=(--set data.train="$tmp/tok.bin" --set data.val= --set model.vocab_size=4096 --set model.n_layer=$L
       --set model.n_embd=384 --set model.n_head=6 --set model.seq_len=256 --set train.seq_len=256
       --set train.micro_batch=4 --set train.global_batch=8 --set log.sample_tokens=0 --set train.val_every=0)
# run NP FREEZE: "median-ms optim-bytes grad-bytes-per-step"
run() {
  local np=$1 fz=$2 cmd=("${ENV[@]}" "$dtrain")
  [ "$np" -gt 1 ] && cmd=(mpirun --oversubscribe --mca btl self,vader -np "$np" "${ENV[@]}" "$dtrain")
  "${cmd[@]}" train "${SHAPE[@]}" --steps "$STEPS" --threads $((2 / np)) --set "train.freeze=$fz" \
    --metrics "$tmp/m.jsonl" >"$tmp/out" 2>&1 || { tail -2 "$tmp/out" >&2; echo "0 0 0"; return; }
  /usr/bin/python3 -c "
import json, statistics, sys
L = [json.loads(l) for l in open(sys.argv[1])]
r = [x for x in L if 'event' not in x][1:]
mem = [x for x in L if x.get('event') == 'summary'][-1]['mem'][0]
print(statistics.median(x['ms'] for x in r), mem['optim'], r[-1]['grad_comm_bytes'])" "$tmp/m.jsonl"
}
ta=() tb=() probes=()
for ((r = 0; r < ROUNDS; r++)); do
  probes+=("$(probe)")
  ta+=("$(run 1 "")")
  tb+=("$(run 1 "$HALF")")
done
da=$(run 2 "") db=$(run 2 "$HALF")
/usr/bin/python3 - "$L" "${probes[*]}" "$da" "$db" "${ta[@]}" "${tb[@]}" <<'PY'
import statistics, sys
L, probes, da, db = sys.argv[1], list(map(float, sys.argv[2].split())), sys.argv[3].split(), sys.argv[4].split()
runs = [list(map(float, x.split())) for x in sys.argv[5:]]
a, b = runs[:len(runs) // 2], runs[len(runs) // 2:]
ma, mb = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
print("| shape | none: ms/step | half frozen: ms/step | step time ratio | moments none -> half (MB) | dp2 gradient bytes/step none -> half (MB) | probes |")
print("|---|---|---|---|---|---|---|")
print("| L%s C384 H6 T256, 8 seqs/step | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | **%.2f** | %.2f -> %.2f (x%.3f) | %.2f -> %.2f (x%.3f) | %.2f-%.2f |" % (
    L, ma, min(x[0] for x in a), max(x[0] for x in a), mb, min(x[0] for x in b), max(x[0] for x in b), mb / ma,
    a[0][1] / 1e6, b[0][1] / 1e6, b[0][1] / a[0][1], float(da[2]) / 1e6, float(db[2]) / 1e6,
    float(db[2]) / float(da[2]) if float(da[2]) else 0, min(probes), max(probes)))
PY
