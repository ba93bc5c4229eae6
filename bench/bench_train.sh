#!/usr/bin/env bash
# Training throughput: dtrain against PyTorch (same GPT-2 architecture and shapes, fp32, a full
# step with clipping and AdamW, random tokens), with 1 and 2 threads, plus the sgemm rate of
# the BLAS dtrain links (OpenBLAS, OpenMP build) on the same cores, and a CPU-share probe
# before every measurement. Ends with a markdown table for docs/benchmarks.md.
#
# usage: bash bench/bench_train.sh [path/to/dtrain]        (default: build/dtrain)
# knobs (environment): WARMUP=2 (untimed steps), STEPS_TINY=8, STEPS_SMALL=5 (timed steps),
#   THREADS_LIST="1 2", SHAPES="tiny small", RUN_TIMEOUT=300 (seconds per contender run),
#   SGEMM_N=2048, KEEP=DIR (keep logs and metrics there),
#   TORCH_OMP_WAIT_POLICY=PASSIVE (empty: libgomp's default, spinning),
#   TORCH=1 and SGEMM=1 (0: skip the PyTorch runs / the sgemm rates, for dtrain-only timings
#   such as bench/refactor_perf.sh's), RESULTS=FILE (copy the raw results there: TSV rows
#   "kind shape threads probe-before probe-after value extra").
# Needs gcc, /usr/bin/python3 with torch (Debian python3-torch), OpenBLAS (libopenblas0-openmp
# and libopenblas-pthread-dev headers). Takes about 10 minutes on 2 idle cores.
#
# Every contender runs under the same environment: OpenBLAS picks its kernel for this CPU
# (no OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE), and glibc malloc never returns memory to the
# kernel (no mmap for large blocks, no trimming), so no step pays for page faults again.
# PyTorch additionally runs with OMP_WAIT_POLICY=PASSIVE: Debian's torch has two thread pools
# (its OpenMP one and the pthread OpenBLAS one), which otherwise spin against each other when
# both want the same two cores; passive waiting made its 2-thread steps ~1.4x faster here, so
# it is the fairer baseline. dtrain (one OpenMP pool, OpenMP OpenBLAS) does not change with it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/.." && pwd)"
dtrain="$(realpath "${1:-$src/build/dtrain}")"
py=/usr/bin/python3
WARMUP=${WARMUP:-2}
STEPS_TINY=${STEPS_TINY:-8}
STEPS_SMALL=${STEPS_SMALL:-5}
THREADS_LIST=${THREADS_LIST:-"1 2"}
SHAPES=${SHAPES:-"tiny small"}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
SGEMM_N=${SGEMM_N:-2048}
TORCH_OMP_WAIT_POLICY=${TORCH_OMP_WAIT_POLICY-PASSIVE}
TORCH=${TORCH:-1}
SGEMM=${SGEMM:-1}
BLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_INC=/usr/include/x86_64-linux-gnu/openblas-pthread
ENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
     GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736)

[ -x "$dtrain" ] || { echo "bench: dtrain binary '$dtrain' not found (build first)" >&2; exit 2; }
[ -x "$py" ] || { echo "bench: $py not found" >&2; exit 2; }
[ "$TORCH" = 0 ] || "$py" -c "import torch" 2>/dev/null || { echo "bench: $py cannot import torch (apt install python3-torch)" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
results="$tmp/results.tsv" # kind shape threads probe value extra...
: >"$results"
t_start=$(date +%s)

gcc -O2 -o "$tmp/cpu_probe" "$here/cpu_probe.c" -lpthread
[ "$SGEMM" = 0 ] || gcc -O2 -fopenmp -I"$BLAS_INC" -o "$tmp/sgemm_bench" "$here/sgemm_bench.c" "$BLAS_DIR/libopenblas.so.0" \
    -Wl,-rpath,"$BLAS_DIR"

probe() { # prints the ratio and logs the line
    local line
    line="$("$tmp/cpu_probe")"
    echo "  $line" >&2
    sed -E 's/.*= ([0-9.]+).*/\1/' <<<"$line"
}

# random tokens (uint16 < 50257) in the token-file layout: 256 int32 header, then the tokens
"$py" - "$tmp/tokens.bin" <<'EOF'
import random, struct, sys
n = 300000
rng = random.Random(1234)
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, n
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *[rng.randrange(50257) for _ in range(n)]))
EOF

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "== dtrain: $dtrain ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?'))," \
     "torch $([ "$TORCH" = 0 ] && echo skipped || "$py" -c 'import torch; print(torch.__version__)')" >&2

# ---- sgemm rate of dtrain's BLAS ----
sgemm_row() { # threads reps: one sgemm measurement between two probes
    local p0 p1 line
    [ "$SGEMM" = 0 ] && return 0
    p0=$(probe)
    line="$("${ENV[@]}" "$tmp/sgemm_bench" "$SGEMM_N" "$1" "$2")"
    echo "  $line" >&2
    p1=$(probe)
    printf 'sgemm\t-\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$p0" "$p1" "$(sed -E 's/.*best ([0-9.]+).*/\1/' <<<"$line")" \
        "$(sed -E 's/.*median ([0-9.]+).*/\1/' <<<"$line")" "$(sed -E 's/.*core ([A-Za-z0-9_]+).*/\1/' <<<"$line")" \
        >>"$results"
}
for th in $THREADS_LIST; do
    echo "== sgemm ${SGEMM_N}^3, $th thread(s)" >&2
    sgemm_row "$th" 5
done

shape_args() { # name -> L C H T B
    case "$1" in
    tiny) echo "4 256 4 256 8" ;;
    small) echo "12 768 12 256 4" ;;
    *) echo "bench: unknown shape '$1'" >&2; exit 2 ;;
    esac
}

# step times (ms, one per line, timed steps only) -> "tokens/s (at the median step time) max/min"
rate() {
    "$py" -c 'import statistics, sys; ms = [float(x) for x in sys.stdin.read().split()]; tok = int(sys.argv[1])
print("%.1f %.2f" % (tok / (statistics.median(ms) / 1e3), max(ms) / min(ms)) if ms else "NA NA")
print("  timed steps (ms): " + " ".join("%.0f" % x for x in ms), file=sys.stderr)' "$1"
}

for shape in $SHAPES; do
    read -r L C H T B <<<"$(shape_args "$shape")"
    timed=$([ "$shape" = tiny ] && echo "$STEPS_TINY" || echo "$STEPS_SMALL")
    for th in $THREADS_LIST; do
        # ---- dtrain ----
        echo "== dtrain $shape (L$L C$C H$H T$T B$B), $th thread(s), $WARMUP + $timed steps" >&2
        sgemm_row "$th" 3 # the sgemm rate on these cores right now, next to the run it is compared with
        p0=$(probe)
        rm -f "$tmp/m.jsonl"
        rc=0
        "${ENV[@]}" timeout "$RUN_TIMEOUT" "$dtrain" train --set model.n_layer="$L" --set model.n_embd="$C" \
            --set model.n_head="$H" --set model.seq_len="$T" --set model.vocab_size=50257 \
            --set train.micro_batch="$B" --set train.global_batch="$B" --set data.train="$tmp/tokens.bin" \
            --set data.val= --set train.val_every=0 --set log.every=1000 --steps $((WARMUP + timed)) \
            --threads "$th" --metrics "$tmp/m.jsonl" >"$tmp/dtrain.log" 2>&1 || rc=$?
        p1=$(probe)
        if [ "$rc" -ne 0 ]; then
            echo "  dtrain failed (exit $rc):" >&2
            tail -3 "$tmp/dtrain.log" >&2
            r="NA NA"
        else
            grep '^summary' "$tmp/dtrain.log" | sed 's/^/  /' >&2
            r=$("$py" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l) if l.strip() else {}
    if "step" in r and "event" not in r and r["step"] > int(sys.argv[2]): print(r["ms"])' \
                "$tmp/m.jsonl" "$WARMUP" | rate $((B * T)))
        fi
        printf 'dtrain\t%s\t%s\t%s\t%s\t%s\t%s\n' "$shape" "$th" "$p0" "$p1" ${r% *} ${r#* } >>"$results"
        if [ -n "${KEEP:-}" ]; then
            mkdir -p "$KEEP"
            cp "$tmp/dtrain.log" "$KEEP/dtrain_${shape}_${th}t.log"
            [ -f "$tmp/m.jsonl" ] && cp "$tmp/m.jsonl" "$KEEP/dtrain_${shape}_${th}t.jsonl"
        fi
        # ---- torch ----
        [ "$TORCH" = 0 ] && continue
        echo "== torch $shape, $th thread(s), $WARMUP + $timed steps" >&2
        p0=$(probe)
        rc=0
        torch_env=(OMP_NUM_THREADS="$th" OPENBLAS_NUM_THREADS="$th")
        [ -n "$TORCH_OMP_WAIT_POLICY" ] && torch_env+=(OMP_WAIT_POLICY="$TORCH_OMP_WAIT_POLICY")
        "${ENV[@]}" "${torch_env[@]}" timeout "$RUN_TIMEOUT" "$py" \
            "$here/torch_gpt_bench.py" --n-layer "$L" --n-embd "$C" --n-head "$H" --seq "$T" --batch "$B" \
            --vocab 50304 --threads "$th" --warmup "$WARMUP" --steps "$timed" >"$tmp/torch.log" 2>&1 || rc=$?
        p1=$(probe)
        if [ "$rc" -ne 0 ]; then
            echo "  torch failed (exit $rc):" >&2
            tail -3 "$tmp/torch.log" >&2
            r="NA NA"
        else
            r=$("$py" -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("\n".join(str(x) for x in r["ms"]))' "$tmp/torch.log" | rate $((B * T)))
        fi
        printf 'torch\t%s\t%s\t%s\t%s\t%s\t%s\n' "$shape" "$th" "$p0" "$p1" ${r% *} ${r#* } >>"$results"
        if [ -n "${KEEP:-}" ]; then
            mkdir -p "$KEEP"
            cp "$tmp/torch.log" "$KEEP/torch_${shape}_${th}t.json"
        fi
    done
done

elapsed=$(($(date +%s) - t_start))
[ -z "${RESULTS:-}" ] || cp "$results" "$RESULTS"
echo "== done in ${elapsed} s" >&2
"$py" - "$results" "$SGEMM_N" "$elapsed" "$WARMUP" "$STEPS_TINY" "$STEPS_SMALL" "$TORCH_OMP_WAIT_POLICY" <<'EOF'
import datetime, sys
path, n, elapsed, warmup, st_tiny, st_small, torch_wait = sys.argv[1:8]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]

def num(x):
    try:
        return float(x)
    except ValueError:
        return None

# sgemm: th -> [(probe before, probe after, best, median, core), ...] in the order measured
sgemm = {}
for r in rows:
    if r[0] == "sgemm":
        sgemm.setdefault(r[2], []).append((num(r[3]), num(r[4]), num(r[5]), num(r[6]), r[7]))
peak = {th: max(m[2] for m in ms) for th, ms in sgemm.items()}  # contention only ever lowers it
# (impl, shape, th) -> (probe before, probe after, tokens/s, step max/min)
res = {(r[0], r[1], r[2]): (num(r[3]), num(r[4]), num(r[5]), num(r[6])) for r in rows if r[0] in ("dtrain", "torch")}
shapes = {"tiny": (4, 256, 4, 256, 8), "small": (12, 768, 12, 256, 4)}
V = 50257  # dtrain's FLOP count uses the real vocabulary (as gpt_flops_per_token does)
unreliable = False

def flops_per_token(L, C, T):
    return 6 * (12 * L * C * C + V * C) + 6 * L * C * T

def probes(p0, p1):
    global unreliable
    bad = min(p0, p1) < 1.6
    unreliable |= bad
    return "%.2f→%.2f%s" % (p0, p1, " ⚠" if bad else "")

cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t")
print()
print("### Training throughput, dtrain vs PyTorch (%s, %s, %d cores)" % (
    datetime.date.today().isoformat(), cpu, len([l for l in open("/proc/cpuinfo") if l.startswith("processor")])))
print()
print("fp32, full training step (forward, backward, clip, AdamW), random tokens, vocab 50257 (padded to 50304); "
      "%s warm-up steps excluded, then %s (tiny) / %s (GPT-2 small) timed steps; tokens/s = tokens per step / "
      "median step time (robust to a stray slow step on a shared machine). Model GFLOP/s counts "
      "6·(12·L·C² + V·C) + 6·L·C·T FLOPs per token; \"%% of sgemm\" compares it with the best %s³ sgemm rate of "
      "dtrain's OpenBLAS (OpenMP build) seen on the same thread count (measured at the start and again just before "
      "each dtrain run). Probes: throughput "
      "of two integer-chain threads over one, just before → just after each run (2.00 = two free cores; ⚠ = "
      "below 1.6, the machine was shared during the run). Spread: slowest / fastest timed step. Both run with "
      "OpenBLAS choosing its own kernel and glibc malloc never trimming; PyTorch (Debian 1.13, pthread OpenBLAS) "
      "with OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = threads%s." % (
          warmup, st_tiny, st_small, n, " and OMP_WAIT_POLICY=" + torch_wait if torch_wait else ""))
print()
print("| shape | threads | dtrain tokens/s | torch tokens/s | dtrain / torch | dtrain GFLOP/s | % of sgemm "
      "| probes dtrain | probes torch | spread dtrain / torch |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, (L, C, H, T, B) in shapes.items():
    for th in sorted({r[2] for r in rows if r[1] == name}, key=int):
        d = res.get(("dtrain", name, th), (None,) * 4)
        t = res.get(("torch", name, th), (None,) * 4)
        gf = d[2] * flops_per_token(L, C, T) / 1e9 if d[2] else None
        sg = peak.get(th)
        label = ("tiny" if name == "tiny" else "GPT-2 small") + " (L%d C%d H%d T%d B%d)" % (L, C, H, T, B)
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            label, th, "%.0f" % d[2] if d[2] else "failed", "%.0f" % t[2] if t[2] else ("failed" if t[0] is not None else "-"),
            "%.2f" % (d[2] / t[2]) if d[2] and t[2] else "-", "%.1f" % gf if gf else "-",
            "%.0f%%" % (100 * gf / sg) if gf and sg else "-",
            probes(d[0], d[1]) if d[0] is not None else "-", probes(t[0], t[1]) if t[0] is not None else "-",
            "%s / %s" % ("%.2f" % d[3] if d[3] else "-", "%.2f" % t[3] if t[3] else "-")))
print()
print("| sgemm %s³, dtrain's OpenBLAS | threads | GFLOP/s, best of all | each measurement (best of its reps) | OpenBLAS kernel | probes of the best |" % n)
print("|---|---|---|---|---|---|")
for th in sorted(sgemm, key=int):
    ms = sgemm[th]
    b = max(ms, key=lambda m: m[2])
    print("| | %s | %.1f | %s | %s | %s |" % (th, b[2], " ".join("%.0f" % m[2] for m in ms), b[4], probes(b[0], b[1])))
print()
if unreliable:
    print("⚠ rows ran while other work shared the two cores: their timings, and above all the 2-thread "
          "scaling, understate what an idle machine gives; rerun those on an idle machine.")
    print()
print("Script: `bash bench/bench_train.sh` (%s s in all)." % elapsed)
EOF
