#!/usr/bin/env bash
# Throughput of a refactor: two dtrain binaries through bench/bench_train.sh (one process,
# tiny and GPT-2 small, 1 and 2 threads) and bench/bench_ddp.sh (dp = 1 and 2, DDP with and
# without overlap, ZeRO-1; tiny and GPT-2 small), dtrain contenders only, the two binaries
# interleaved run by run (issue 25's acceptance: "within noise, ±3% median").
#
# usage: bench/refactor_perf.sh OLD_DTRAIN NEW_DTRAIN
# knobs (environment): PAIRS=5 (runs of each binary per bench script), BENCHES="train ddp",
#   KEEP=DIR (keep every run's log and raw results), and the bench scripts' own knobs, which
#   pass through: SHAPES, THREADS_LIST, WARMUP, STEPS_TINY, STEPS_SMALL (bench_train.sh),
#   STEPS (bench_ddp.sh). A smoke test of the script itself:
#   PAIRS=1 SHAPES=tiny THREADS_LIST=1 WARMUP=1 STEPS_TINY=2 STEPS=2 bench/refactor_perf.sh A B
#
# Pairing: run i of the old binary and run i of the new one follow each other (order
# alternating, old-new then new-old, so a drift of the machine's speed during the sitting
# favours neither); each row gives the median tokens/s of each binary over its runs and the
# median of the pair-wise ratios new/old, with their range. Probes: the CPU-share probe of
# bench/common.sh before every run (about 2.0 when both cores are ours; the row shows the
# lowest of its runs, ⚠ below 1.6: the machine was shared and the timings are suspect).
# Takes about PAIRS x 2 x (4 + 6) minutes with the defaults on 2 cores; run it on an idle machine.
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
old="$(realpath "$1")"; new="$(realpath "$2")"
for b in "$old" "$new"; do [ -x "$b" ] || { echo "refactor_perf: no binary '$b'" >&2; exit 2; }; done
source "$here/common.sh" perf "$new" # $tmp, probe
PAIRS=${PAIRS:-5}
BENCHES=${BENCHES:-"train ddp"}
out=${KEEP:-$tmp/runs}; mkdir -p "$out"
echo "old: $old"
echo "new: $new"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$out/index.tsv" # bench pair which probe results-file
for ((i = 1; i <= PAIRS; i++)); do
  order="old new"; [ $((i % 2)) -eq 0 ] && order="new old"
  for bench in $BENCHES; do
    for which in $order; do
      bin=$old; [ "$which" = new ] && bin=$new
      p=$(probe)
      res="$out/$bench.$i.$which.tsv"; log="$out/$bench.$i.$which.log"
      echo "pair $i/$PAIRS: bench_$bench.sh, $which binary (probe $p) $(date -u +%H:%M:%S)"
      # one round each: the pairing here does what bench_ddp.sh's rounds do
      if TORCH=0 SGEMM=0 ROUNDS=1 RESULTS="$res" bash "$here/bench_$bench.sh" "$bin" >"$log" 2>&1; then
        printf '%s\t%s\t%s\t%s\t%s\n' "$bench" "$i" "$which" "$p" "$res" >>"$out/index.tsv"
      else
        echo "  bench_$bench.sh failed with the $which binary:"; tail -3 "$log" | sed 's/^/  /'
      fi
    done
  done
done
python3 - "$out/index.tsv" <<'PY'
import statistics as st, sys
ddp_labels = {"d11": "dp=1 x 1 thread", "d12": "dp=1 x 2 threads", "ddp": "DDP dp=2, overlap",
              "ddpno": "DDP dp=2, no overlap", "z1": "ZeRO-1 dp=2"}
runs = {}  # (bench, config) -> {pair: {which: tokens/s}}
probes = {}  # (bench, config) -> [probe, ...]
for line in open(sys.argv[1]):
    bench, pair, which, p, res = line.rstrip("\n").split("\t")
    for r in (l.split() for l in open(res) if l.strip()):
        if bench == "train" and r[0] == "dtrain":  # kind shape threads p0 p1 tokens/s spread
            key, tps, ps = "%s, %s thread(s)" % (r[1], r[2]), r[5], [r[3], r[4]]
        elif bench == "ddp":  # shape key round probe tokens/s comm-ms
            key, tps, ps = "%s, %s" % (r[0], ddp_labels.get(r[1], r[1])), r[4], [r[3]]
        else:
            continue
        try:
            v = float(tps)
        except ValueError:
            continue  # a failed run (NA)
        runs.setdefault((bench, key), {}).setdefault(int(pair), {})[which] = v
        probes.setdefault((bench, key), []).extend(float(x) for x in ps + [p] if x not in ("NA", ""))
print()
print("| bench | configuration | pairs | old tokens/s (median) | new tokens/s (median) | new / old (median of pairs; range) | lowest probe |")
print("|---|---|---|---|---|---|---|")
worst = 0.0
for (bench, key), pairs in runs.items():
    both = [p for p in pairs.values() if "old" in p and "new" in p]
    if not both:
        print("| bench_%s | %s | 0 | - | - | - | - |" % (bench, key)); continue
    ratios = [p["new"] / p["old"] for p in both]
    r = st.median(ratios)
    worst = max(worst, abs(r - 1))
    lp = min(probes[(bench, key)])
    print("| bench_%s | %s | %d | %.0f | %.0f | %.3f (%.3f-%.3f) | %.2f%s |" % (
        bench, key, len(both), st.median(p["old"] for p in both), st.median(p["new"] for p in both),
        r, min(ratios), max(ratios), lp, " ⚠" if lp < 1.6 else ""))
print()
print("largest median deviation of new / old from 1: %.1f%%" % (100 * worst))
PY
