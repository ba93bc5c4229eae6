#!/usr/bin/env bash
# Synchronisation modes over a slow link (issue 29): 2 emulated hosts x 2 ranks
# (tests/emulated_cluster.sh: network namespaces, each host's outgoing link capped with tc
# tbf), a GPT-2-shaped model of ~10.8M parameters (6 layers, 384 wide, seq 128) on the
# fortunes corpus (byte tokens), the same token budget for every contender: synchronous
# DDP against DiLoCo with H = 10 and 50 and the asynchronous parameter server with
# staleness 1 and 4, at each link rate; then, at the last rate, DDP, the synchronous
# central rank and ps-async s=4 with rank 1 computing 2x slower (DT_TEST_STRAGGLER=1:2):
# the throughput each keeps. For each run: the validation
# loss at the end, the training wall time (the steps' ms summed), and the bytes the two
# hosts sent over their capped links per step (tx counters of the namespaces' eth0).
# Runs one contender at a time (nothing else may run: 4 ranks share the machine's cores).
# usage: bench/bench_sync.sh [build/dtrain]      (root; prints a markdown table)
# knobs: RATES="100mbit 1gbit", STEPS=60, MODES="ddp diloco10 diloco50 ps-async1 ps-async4",
#   STRAGGLE_MODES="ddp ps ps-async4" (empty: none), RESULTS=FILE (raw rows), VAL_EVERY=STEPS,
#   KEEP=DIR (each run's metrics there as RATE-MODE.jsonl, for `dtrain report`)
set -euo pipefail
source "$(dirname "$0")/common.sh" sync "${1:-}"
source "$here/../tests/emulated_cluster.sh"
trap 'cluster_down; rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 LSAN_OPTIONS= ASAN_OPTIONS=
RATES=${RATES:-"100mbit 1gbit"}
STEPS=${STEPS:-60}
MODES=${MODES:-"ddp diloco10 diloco50 ps-async1 ps-async4"}
STRAGGLE_MODES=${STRAGGLE_MODES-"ddp ps ps-async4"}
corpus=/usr/share/games/fortunes
inputs=()
for f in "$corpus"/*; do case "$f" in *.dat | *.u8) continue ;; esac; [ -f "$f" ] && inputs+=(--input "$f"); done
[ ${#inputs[@]} -gt 0 ] || { echo "bench_sync: no corpus in $corpus (apt-get install fortunes)" >&2; exit 2; }
"$dtrain" prepare --fortune "${inputs[@]}" --out "$tmp/f" --val-fraction 0.02 >/dev/null
MODEL=(--set model.n_layer=6 --set model.n_embd=384 --set model.n_head=6 --set model.seq_len=128
       --set model.vocab_size=256 --set train.micro_batch=4 --set train.global_batch=16 --set train.lr=1e-3
       --set train.warmup_steps=10 --set train.val_every="${VAL_EVERY:-$STEPS}" --set train.val_batches=8 --steps "$STEPS"
       --set data.train="$tmp/f_train.bin" --set data.val="$tmp/f_val.bin" --set threads=1 --seed 1)
args_of() {
  case $1 in
    ddp) ;;
    diloco*h) local h=${1#diloco}; echo "--set parallel.sync=diloco --set parallel.sync_every=${h%h} --set parallel.dp_shard=2" ;;
    diloco*) echo "--set parallel.sync=diloco --set parallel.sync_every=${1#diloco}" ;;
    ps) echo "--set parallel.dp_mode=ps" ;;
    ps-async*) echo "--set parallel.dp_mode=ps-async --set parallel.staleness=${1#ps-async}" ;;
  esac
}
echo "| link | mode | val loss | vs DDP | wall s | vs DDP | MB over the links / step | DDP / this | probe |"
echo "|---|---|---|---|---|---|---|---|---|"
last_rate=${RATES##* }
for rate in $RATES; do
  cluster_up 2 "$rate" || { echo "bench_sync: cannot make network namespaces here (root?)" >&2; exit 77; }
  MPI=("${CLUSTER_MPI[@]}" -x DT_TEST_STRAGGLER --host "$(cluster_hosts 2)" -np 4)
  ref_loss= ref_s= ref_mb=
  runs="$MODES"
  [ "$rate" = "$last_rate" ] && for m in $STRAGGLE_MODES; do runs+=" $m+straggler"; done
  for mode in $runs; do
    export DT_TEST_STRAGGLER=
    case $mode in *+straggler) export DT_TEST_STRAGGLER=1:2 ;; esac
    [ "$mode" = ddp+straggler ] && ref_loss= ref_s= ref_mb= # the straggler rows against DDP straggled
    p=$(probe)
    t0=$(cluster_tx)
    # shellcheck disable=SC2046
    "${MPI[@]}" "${ENV[@]}" "$dtrain" train "${MODEL[@]}" $(args_of "${mode%+straggler}") --metrics "$tmp/$rate-$mode.jsonl" \
      >"$tmp/$rate-$mode.out" 2>&1 || { echo "bench_sync: $rate $mode failed: $(tail -2 "$tmp/$rate-$mode.out")" >&2; exit 1; }
    t1=$(cluster_tx)
    [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$tmp/$rate-$mode.jsonl" "$KEEP/"
    read -r loss secs <<<"$(python3 -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print(r[[i for i, x in enumerate(r) if x.get('event') == 'val'][-1]]['val_loss'], sum(x['ms'] for x in r if 'event' not in x) / 1e3)" \
      "$tmp/$rate-$mode.jsonl")"
    mb=$(python3 -c "print('%.2f' % (($t1 - $t0) / 1e6 / $STEPS))")
    [ "$mode" = ddp ] || [ "$mode" = ddp+straggler ] && ref_loss=$loss ref_s=$secs ref_mb=$mb
    row=$(python3 -c "
import sys
loss, secs, mb = float('$loss'), float('$secs'), float('$mb')
rl, rs, rm = (float(x) if x else None for x in ('$ref_loss', '$ref_s', '$ref_mb'))
f = lambda a, b, fmt: (fmt % (a / b)) if b else '-'
print('| %s | %s | %.4f | %s | %.1f | %s | %.2f | %s | %s |' % ('$rate', '$mode', loss, f(loss, rl, '%.4f'), secs,
      f(rs, secs, '%.2fx faster') if rs else '-', mb, f(rm, mb, '%.1fx') if rm else '-', '$p'))")
    echo "$row"
    [ -n "${RESULTS:-}" ] && echo "$rate $mode $loss $secs $mb $p" >>"$RESULTS"
  done
  cluster_down
done
