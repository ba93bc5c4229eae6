#!/usr/bin/env bash
# ZeRO-Offload / ZeRO-Infinity benches (issue 26), three parts, each a markdown table on stdout
# (progress on stderr):
#  adamw  CPU AdamW (the library's dt_ops_cpu()->adamw) in GB/s against memory bandwidth measured
#         in the same process on the same arrays and threads (bench/adamw_bench.c); goal >= 0.8.
#  disk   sequential O_DIRECT write and read bandwidth of the disk holding DIR, with fio for the
#         ioengines io_uring, libaio and psync at several block sizes and queue depths (which async
#         library the offload store should use, picked by measurement), and dd as a cross-check.
#  step   `dtrain train` step time with offload.optimizer none / cpu / nvme at GPT-2 small and at a
#         shape whose compute is long enough to hide the I/O, and the NVMe rate during the step
#         against the disk part's sequential bandwidth. Needs the trainer's offload metrics (see
#         offload_metrics_ready): skipped, with the reason, by a dtrain that does not offload.
#
# usage: bash bench/bench_offload.sh [DIR [path/to/dtrain]]
#   DIR: where the test file and the offload files go (default build/offload-bench; created,
#   and the file removed at the end). dtrain's directory must hold libdtrain_lib.a (a CMake build).
# knobs (environment): PARTS="adamw disk step", THREADS_LIST="1 2",
#   ADAMW_N=67108864 (elements: p, g, m, v = 1 GiB), ADAMW_REPS=5, ADAMW_STEP=1000 (the step whose
#   bias corrections the update uses), SIZE_MB=4096 (test file), BS_MB="1 4 8", QD="1 4",
#   ENGINES="io_uring libaio psync", ROUNDS=2 (disk passes, interleaved; best kept),
#   FIO_RUNTIME=60 (seconds, cap per fio job), STEP_THREADS=2, STEP_BACKEND=cpu, WARMUP=1 and
#   STEPS=3 (untimed / timed steps), STEP_SHAPES="small hide" (tiny: a smoke test of the script),
#   NVME_BLOCKS="16 32" (more nvme rows, with offload.block_mb at those MiB; default none),
#   RUN_TIMEOUT=1800, RESULTS=FILE (copy the raw TSV rows there), KEEP=DIR (keep the training logs
#   and metrics there). The step part takes the disk's bandwidth from a disk part in the same run.
# Needs gcc, python3, OpenBLAS (as bench_train.sh) and fio (installed with apt-get when missing).
# Takes about 10 minutes for adamw and disk with the defaults on 2 cores and a ~1 GB/s disk; step
# adds ~15 minutes once it runs.
#
# O_DIRECT bypasses this machine's page cache, so a file larger than RAM is not needed; but a
# VM's disk may be cached by its host and an SSD has its own DRAM/SLC cache, either of which can
# serve a small file faster than the medium sustains: SIZE_MB should exceed those caches.
set -euo pipefail
source "$(dirname "$0")/common.sh" offload "${2:-}"
src="$(cd "$here/.." && pwd)"
DIR="${1:-$src/build/offload-bench}"
PARTS=${PARTS:-"adamw disk step"}
THREADS_LIST=${THREADS_LIST:-"1 2"}
ADAMW_N=${ADAMW_N:-67108864}
ADAMW_REPS=${ADAMW_REPS:-5}
ADAMW_STEP=${ADAMW_STEP:-1000}
SIZE_MB=$(( ${SIZE_MB:-4096} / 8 * 8 )) # whole 8 MiB blocks (dd's block size)
BS_MB=${BS_MB:-"1 4 8"}
QD=${QD:-"1 4"}
ENGINES=${ENGINES:-"io_uring libaio psync"}
ROUNDS=${ROUNDS:-2}
FIO_RUNTIME=${FIO_RUNTIME:-60}
STEP_THREADS=${STEP_THREADS:-2}
STEP_BACKEND=${STEP_BACKEND:-cpu}
WARMUP=${WARMUP:-1}
STEPS=${STEPS:-3}
STEP_SHAPES=${STEP_SHAPES:-"small hide"}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
BLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
results="$tmp/results.tsv" # part, then its fields; read by the report at the end
: >"$results"
testfile="$DIR/dtrain-offload-bench.bin"
trap 'rm -rf "$tmp"; rm -f "$testfile"' EXIT
t_start=$(date +%s)
say() { echo "$*" >&2; }

say "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
    "load average $(cut -d' ' -f1-3 /proc/loadavg); dtrain $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')"

# ---- adamw: the update's GB/s against a stream with its arrays, in one process ----
adamw_part() {
    local lib out p0 p1 th
    lib="$(dirname "$dtrain")/libdtrain_lib.a"
    [ -f "$lib" ] || { say "bench_offload: $lib not found (build dtrain with CMake first)"; exit 2; }
    # the library's own flags (CMakeLists.txt), so the bench's candidate kernel compiles as cpu_adamw does
    gcc -O3 -march=native -fopenmp -std=c11 -D_GNU_SOURCE -fno-math-errno -fno-trapping-math -I"$src/src" \
        -o "$tmp/adamw_bench" "$here/adamw_bench.c" "$lib" "$BLAS_DIR/libopenblas.so.0" -lm -Wl,-rpath,"$BLAS_DIR"
    for th in $THREADS_LIST; do
        say "== adamw: $ADAMW_N elements, $th thread(s), best of $ADAMW_REPS"
        p0=$(probe)
        out="$("${ENV[@]}" "$tmp/adamw_bench" "$ADAMW_N" "$th" "$ADAMW_REPS" "$ADAMW_STEP")"
        p1=$(probe)
        sed 's/^/  /' <<<"$out" >&2
        awk -v th="$th" -v p="$p0\t$p1" '{ print "adamw\t" th "\t" p "\t" $0 }' <<<"$out" >>"$results"
    done
}

# ---- disk: sequential O_DIRECT bandwidth, fio per engine / block size / queue depth, and dd ----
dd_rate() { # dd's summary line -> MB/s (1e6 B/s) from its byte count and seconds
    awk '/copied/ { printf "%.1f\n", $1 / $(NF - 3) / 1e6 }'
}
fio_rate() { # engine bs_mb qd read|write -> MB/s
    fio --name=seq --filename="$testfile" --size="${SIZE_MB}M" --rw="$4" --bs="${2}M" --iodepth="$3" \
        --ioengine="$1" --direct=1 --invalidate=1 --runtime="$FIO_RUNTIME" --output-format=json \
        --output="$tmp/fio.json" >/dev/null 2>"$tmp/fio.err" || { say "  fio $*: $(head -1 "$tmp/fio.err")"; echo NA; return; }
    python3 -c 'import json, sys; print("%.1f" % (json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]["bw_bytes"] / 1e6))' \
        "$tmp/fio.json" "$4"
}
disk_part() {
    local free r e bs qd rw w p0 p1
    if ! command -v fio >/dev/null; then # the bench's own dependency, not the build's (scripts/deps.sh)
        say "== installing fio"
        local sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
        { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fio >/dev/null; } \
            || { say "bench_offload: fio is missing and could not be installed (apt-get install fio)"; exit 2; }
    fi
    mkdir -p "$DIR"
    free=$(df --output=avail -BM "$DIR" | tail -1 | tr -dc 0-9)
    [ "$free" -gt $((SIZE_MB + 256)) ] \
        || { say "bench_offload: $DIR has ${free} MiB free, the test file needs ${SIZE_MB} MiB"; exit 2; }
    dd if=/dev/zero of="$testfile" bs=1M count=1 oflag=direct 2>/dev/null \
        || { say "bench_offload: $DIR refuses O_DIRECT: the offload files cannot go there"; exit 2; }
    p0=$(probe)
    for r in $(seq "$ROUNDS"); do
        say "== disk round $r/$ROUNDS: $DIR, ${SIZE_MB} MiB file"
        # dd first: its write also lays the file out in full (written extents, as the offload store's
        # file is after its first pass), so every fio write below overwrites allocated blocks.
        # dd writes zeros (fio writes random data: a disk that shortcuts zeros shows as dd >> fio).
        w=$(dd if=/dev/zero of="$testfile" bs=8M count=$((SIZE_MB / 8)) oflag=direct 2>&1 | dd_rate)
        printf 'dd\t%s\twrite\t%s\n' "$r" "$w" >>"$results"
        w=$(dd if="$testfile" of=/dev/null bs=8M iflag=direct 2>&1 | dd_rate)
        printf 'dd\t%s\tread\t%s\n' "$r" "$w" >>"$results"
        for e in $ENGINES; do
            for bs in $BS_MB; do
                for qd in $QD; do
                    [ "$e" = psync ] && [ "$qd" != 1 ] && continue # a synchronous engine has one I/O in flight
                    for rw in write read; do
                        w=$(fio_rate "$e" "$bs" "$qd" "$rw")
                        printf 'fio\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$e" "$bs" "$qd" "$rw" "$w" >>"$results"
                    done
                done
            done
        done
        awk -F'\t' -v r="$r" '($1 == "fio" || $1 == "dd") && $2 == r' "$results" | sed 's/^/  /' >&2
    done
    p1=$(probe)
    w=$(df --output=source,fstype "$DIR" | tail -1 | tr -s ' ')
    printf 'disk_probe\t%s\t%s\t%s\t%s\n' "$p0" "$p1" "$SIZE_MB" "$w" >>"$results"
    rm -f "$testfile"
}

# ---- step: training step time with the optimizer state offloaded ----
shape_args() { # name -> L C H T micro_batch global_batch
    case "$1" in
    small) echo "12 768 12 256 4 4" ;;   # bench_train.sh's GPT-2 small
    hide) echo "12 768 12 1024 4 8" ;;   # 8x the tokens per step (2 micro-steps), the same optimizer I/O
    tiny) echo "2 64 2 64 2 2" ;;        # STEP_SHAPES=tiny: a smoke test of the script, no figures
    *) say "bench_offload: unknown shape '$1'"; exit 2 ;;
    esac
}
train() { # name L C H T B G steps extra-args... -> runs dtrain, metrics in $tmp/NAME.jsonl; returns its exit code
    local name=$1 L=$2 C=$3 H=$4 T=$5 B=$6 G=$7 steps=$8
    shift 8
    rm -f "$tmp/$name.jsonl"
    "${ENV[@]}" timeout "$RUN_TIMEOUT" "$dtrain" train --set model.n_layer="$L" --set model.n_embd="$C" \
        --set model.n_head="$H" --set model.seq_len="$T" --set model.vocab_size=50257 \
        --set train.micro_batch="$B" --set train.global_batch="$G" --set data.train="$tmp/tokens.bin" \
        --set data.val= --set train.val_every=0 --set log.every=1000 --set backend="$STEP_BACKEND" \
        --steps "$steps" --threads "$STEP_THREADS" --metrics "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1
}
# The hook for the step part: it needs the trainer's offload metrics. True when this dtrain takes
# offload.optimizer=nvme, trains with it, and writes per step offload_read_mb, offload_write_mb
# and offload_wait_ms (MB moved to / from the offload file, ms the step waited for I/O) in its
# metrics lines; optional offload_ms (the streamed update's wall time, I/O included) lets the
# rate be taken over the update instead of the whole step. Until the engine offloads, the key
# is accepted and ignored, so a run's success alone proves nothing: the fields are the test.
offload_metrics_ready() {
    "$dtrain" config --set offload.optimizer=nvme --set offload.nvme_path="$DIR" >/dev/null 2>"$tmp/why" \
        || { why="dtrain config refuses offload.optimizer=nvme: $(head -1 "$tmp/why")"; return 1; }
    train probe_nvme 2 64 2 64 2 2 2 --set offload.optimizer=nvme --set offload.nvme_path="$DIR" \
        || { why="a 2-step run with offload.optimizer=nvme failed: $(grep -v '^step' "$tmp/probe_nvme.log" | tail -1)"
             return 1; }
    why="offload.optimizer=nvme runs, but its metrics have no offload_read_mb, offload_write_mb, offload_wait_ms:"
    why+=" the engine does not offload yet"
    python3 - "$tmp/probe_nvme.jsonl" <<'PY' || return 1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
need = ("offload_read_mb", "offload_write_mb", "offload_wait_ms")
sys.exit(0 if any(all(k in r for k in need) for r in rows if "event" not in r) else 1)
PY
    why=""
}
step_part() {
    local shape mode rc p0 p1 why=""
    [ -x "$dtrain" ] || { say "bench_offload: dtrain binary '$dtrain' not found (build first)"; exit 2; }
    mkdir -p "$DIR"
    random_tokens "$tmp/tokens.bin" 50257 300000
    if ! offload_metrics_ready; then
        say "== step: skipped: $why"
        printf 'step_skip\t%s\n' "$why" >>"$results"
        return 0
    fi
    for shape in $STEP_SHAPES; do
        read -r L C H T B G <<<"$(shape_args "$shape")"
        for mode in none cpu nvme $(for b in ${NVME_BLOCKS:-}; do echo "nvme-b$b"; done); do
            local how=(--set offload.optimizer="$mode")
            [[ $mode == nvme-b* ]] && how=(--set offload.optimizer=nvme --set offload.block_mb="${mode#nvme-b}")
            say "== step: $shape (L$L C$C H$H T$T B$B G$G), offload.optimizer=$mode, $WARMUP + $STEPS steps, $STEP_THREADS thread(s)"
            p0=$(probe)
            rc=0
            train "${shape}_$mode" "$L" "$C" "$H" "$T" "$B" "$G" $((WARMUP + STEPS)) \
                "${how[@]}" --set offload.nvme_path="$DIR" || rc=$?
            p1=$(probe)
            [ "$rc" = 0 ] || say "  failed (exit $rc): $(grep -v '^step' "$tmp/${shape}_$mode.log" | tail -1)"
            printf 'step\t%s\t%s\t%s\t%s\t%s\t%s\n' "$shape" "$mode" "$p0" "$p1" "$rc" "$tmp/${shape}_$mode.jsonl" >>"$results"
            if [ -n "${KEEP:-}" ]; then
                mkdir -p "$KEEP"
                cp "$tmp/${shape}_$mode".* "$KEEP/" 2>/dev/null || true
            fi
        done
    done
}

for part in $PARTS; do
    case "$part" in
    adamw) adamw_part ;;
    disk) disk_part ;;
    step) step_part ;;
    *) say "bench_offload: unknown part '$part' (adamw, disk, step)"; exit 2 ;;
    esac
done
elapsed=$(($(date +%s) - t_start))
[ -z "${RESULTS:-}" ] || cp "$results" "$RESULTS"
say "== done in ${elapsed} s"
python3 "$here/offload_report.py" "$results" "$elapsed" "$WARMUP" "$STEPS" "$STEP_THREADS" "$STEP_BACKEND" \
    "$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')"
