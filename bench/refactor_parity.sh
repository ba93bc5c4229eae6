#!/usr/bin/env bash
# Bitwise parity of a refactor: the same 20 layouts trained with two revisions' binaries must
# end on the same weights, bit for bit (issue 25's acceptance: "the final digest of a 20-step
# run is identical before and after the change").
#
# usage: bench/refactor_parity.sh BASE_REV [NEW_REV]      (NEW_REV default: HEAD)
#   Each revision is built in its own detached git worktree under the cache directory
#   ($DTRAIN_REV_CACHE, default /tmp: /tmp/dtrain-rev-<sha>, Release, DT_CUDA=OFF, only the
#   dtrain target); an existing build there is reused.
# knobs (environment): DTRAIN_BASE / DTRAIN_NEW (a binary to use instead of building that
#   revision), ONLY=REGEX (run the layouts whose name matches), KEEP=DIR (keep the logs),
#   RUN_TIMEOUT=300 (seconds per run: a hang fails the row instead of stalling the script),
#   JOBS=2 (build jobs).
# Prints one row per layout (name, ranks, base digest, new digest, same / DIFFERENT / FAILED)
# plus a row for the tokenizer's output (each binary prepares the tiny corpus itself); exit 1
# if anything differs or a run fails. About 2-3 minutes on 2 cores.
#
# Every run: the tiny test corpus, a 4-block model (4 heads of 8, sequence 32, vocabulary 300,
# so pp 2 x 2 virtual stages, tp 2 and cp 2 all fit), 20 steps of global batch 8 (micro-batch
# 2), seed 1, validation at steps 10 and 20, one thread per rank, at most 4 ranks; `--digest`
# hashes the full fp32 weights in name order, so it is comparable whatever the layout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/.." && pwd)"
[ $# -ge 1 ] && [ $# -le 2 ] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BASE_REV=$1; NEW_REV=${2:-HEAD}
CACHE=${DTRAIN_REV_CACHE:-/tmp}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
JOBS=${JOBS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
tmp="$(mktemp -d /tmp/dtrain-parity.XXXXXX)"; trap 'rm -rf "$tmp"' EXIT
logs=${KEEP:-$tmp/logs}; mkdir -p "$logs"

# binary REV: the dtrain of revision REV, built once into $CACHE/dtrain-rev-<sha>/build
binary() {
  local sha dir
  sha=$(git -C "$src" rev-parse --verify -q "$1^{commit}") || { echo "parity: no revision '$1'" >&2; exit 2; }
  dir="$CACHE/dtrain-rev-$sha"
  if [ ! -x "$dir/build/dtrain" ]; then
    if [ ! -e "$dir/.git" ]; then
      git -C "$src" worktree prune
      git -C "$src" worktree add -f --detach "$dir" "$sha" >&2
    fi
    echo "parity: building $1 ($sha) in $dir/build" >&2
    cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DDT_CUDA=OFF >"$dir/build.log" 2>&1 &&
      cmake --build "$dir/build" -j"$JOBS" --target dtrain >>"$dir/build.log" 2>&1 ||
      { echo "parity: build of $1 failed, see $dir/build.log" >&2; tail -5 "$dir/build.log" >&2; exit 2; }
  fi
  echo "$dir/build/dtrain"
}
base=${DTRAIN_BASE:-$(binary "$BASE_REV")}
new=${DTRAIN_NEW:-$(binary "$NEW_REV")}
base=$(realpath "$base"); new=$(realpath "$new")
for b in "$base" "$new"; do [ -x "$b" ] || { echo "parity: no binary '$b'" >&2; exit 2; }; done
echo "base: $BASE_REV = $base"
echo "new:  $NEW_REV = $new"

# The 20 layouts: NAME|RANKS|--set/flags (added to the common run). Each data-parallel mode,
# every pipeline schedule in schedule.c, tp (with and without sp), cp, recompute, bf16,
# ZeRO-3 with pp and with tp, bitwise mode with dp and with pp, gradient accumulation, and an
# asynchronous save resumed half-way (the row's digest is the resumed run's); then 36 more:
# bf16 in every mode, the emulated device and its NCCL path in every mode, bitwise ps/ddp/ZeRO,
# and saves resumed half-way in several layouts.
LAYOUTS=(
  "single|1|"
  "ps|2|--set parallel.dp_mode=ps"
  "ddp|2|"
  "ddp-accum4-no-overlap|2|--set train.global_batch=16 --set parallel.overlap=false"
  "zero1|2|--set parallel.zero=1"
  "zero2|2|--set parallel.zero=2"
  "zero3-async-save-resume|2|--set parallel.zero=3 --set checkpoint.async=true"
  "pp2-gpipe|2|--set parallel.pp=2 --set parallel.schedule=gpipe"
  "pp2-1f1b-dp2|4|--set parallel.pp=2 --set parallel.schedule=1f1b"
  "pp2-interleaved-v2|2|--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2"
  "pp2-zb-h1|2|--set parallel.pp=2 --set parallel.schedule=zb-h1"
  "tp2|2|--set parallel.tp=2"
  "tp2-sp-dp2|4|--set parallel.tp=2 --set parallel.sp=true"
  "cp2|2|--set parallel.cp=2"
  "recompute-dp2|2|--set train.recompute=full"
  "bf16-zero1|2|--set precision=bf16 --set parallel.zero=1"
  "zero3-pp2|4|--set parallel.zero=3 --set parallel.pp=2"
  "zero3-tp2|4|--set parallel.zero=3 --set parallel.tp=2"
  "bitwise-zero2|2|--set parallel.determinism=bitwise --set parallel.zero=2"
  "bitwise-pp2-dp2|4|--set parallel.determinism=bitwise --set parallel.pp=2 --set parallel.zero=1"
  "ps-dp4|4|--set parallel.dp_mode=ps"
  "zero3-dp4|4|--set parallel.zero=3"
  "zero1-no-overlap|2|--set parallel.zero=1 --set parallel.overlap=false"
  "bf16-ddp|2|--set precision=bf16"
  "bf16-ps|2|--set precision=bf16 --set parallel.dp_mode=ps"
  "bf16-zero2|2|--set precision=bf16 --set parallel.zero=2"
  "bf16-zero3|2|--set precision=bf16 --set parallel.zero=3"
  "bf16-single|1|--set precision=bf16"
  "bf16-pp2|2|--set precision=bf16 --set parallel.pp=2"
  "bf16-tp2-dp2|4|--set precision=bf16 --set parallel.tp=2"
  "emu-ddp|2|--set backend=emulated"
  "emu-ps|2|--set backend=emulated --set parallel.dp_mode=ps"
  "emu-zero1|2|--set backend=emulated --set parallel.zero=1"
  "emu-zero2|2|--set backend=emulated --set parallel.zero=2"
  "emu-zero3|2|--set backend=emulated --set parallel.zero=3"
  "emu-pp2-dp2|4|--set backend=emulated --set parallel.pp=2"
  "emu-tp2-zero3|4|--set backend=emulated --set parallel.tp=2 --set parallel.zero=3"
  "emu-bf16-zero3-async|2|--set backend=emulated --set precision=bf16 --set parallel.zero=3 --set checkpoint.async=true"
  "nccl-ddp|2|--set backend=emulated --set comm.backend=nccl"
  "nccl-zero1|2|--set backend=emulated --set comm.backend=nccl --set parallel.zero=1"
  "nccl-zero2|2|--set backend=emulated --set comm.backend=nccl --set parallel.zero=2"
  "nccl-zero3|2|--set backend=emulated --set comm.backend=nccl --set parallel.zero=3"
  "nccl-bf16-zero2|2|--set backend=emulated --set comm.backend=nccl --set precision=bf16 --set parallel.zero=2"
  "nccl-bf16-ddp|2|--set backend=emulated --set comm.backend=nccl --set precision=bf16"
  "bitwise-ps-dp2|2|--set parallel.determinism=bitwise --set parallel.dp_mode=ps"
  "bitwise-ddp-dp4|4|--set parallel.determinism=bitwise"
  "bitwise-zero3-dp4|4|--set parallel.determinism=bitwise --set parallel.zero=3"
  "bitwise-zero1-save-resume|2|--set parallel.determinism=bitwise --set parallel.zero=1"
  "ddp-save-resume|2|"
  "zero2-save-resume|2|--set parallel.zero=2"
  "pp2-zero1-save-resume|4|--set parallel.pp=2 --set parallel.zero=1"
  "tp2-save-resume|2|--set parallel.tp=2"
  "emu-ddp-save-resume|2|--set backend=emulated"
  "emu-zero2-save-resume|2|--set backend=emulated --set parallel.zero=2"
  "bitwise-pp2-zero3|4|--set parallel.determinism=bitwise --set parallel.pp=2 --set parallel.zero=3"
  "bitwise-pp2-ddp|4|--set parallel.determinism=bitwise --set parallel.pp=2"
)

# prepare BIN DIR: the tiny corpus's token files, by that binary's tokenizer
prepare() {
  mkdir -p "$2"
  "$1" prepare --fortune --input "$src/tests/data/tiny_corpus.txt" --out "$2/c" --val-fraction 0.1 >"$2/prepare.log" 2>&1
}
prepare "$base" "$tmp/base" && prepare "$new" "$tmp/new" || { echo "parity: prepare failed" >&2; exit 1; }

# train BIN DATA NP LOG ARGS...: one run under a timeout; prints the final digest (empty on failure)
train() {
  local bin=$1 data=$2 np=$3 log=$4; shift 4
  local cmd=("$bin" train --config "$src/tests/data/tiny.json" --set "data.train=$data/c_train.bin"
             --set "data.val=$data/c_val.bin" --set model.n_layer=4 --set model.n_head=4 --set model.n_embd=32
             --steps 20 --seed 1 --set train.micro_batch=2 --set train.global_batch=8 --set train.val_every=10
             --set log.sample_tokens=0 --set threads=1 --digest "$@")
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  local rc=0
  timeout -k 10 "$RUN_TIMEOUT" "${cmd[@]}" >"$log.run" 2>&1 || rc=$?
  cat "$log.run" >>"$log"; [ $rc -eq 0 ] || { echo "exit $rc" >>"$log"; return 0; }
  grep -o 'digest sha256:[0-9a-f]*' "$log.run" | tail -1 | cut -d: -f2
}
# run_layout BIN DATA NAME NP ARGS...: the layout's digest; the save-resume row stops after
# step 10 with a save, then resumes to 20 (the digest of the second half)
run_layout() {
  local bin=$1 data=$2 name=$3 np=$4 log; shift 4
  log="$logs/$name.$(basename "$data").log"; : >"$log"
  if [[ $name == *save-resume* ]]; then
    local ck="$data/$name.ckpt"; rm -rf "$ck"
    [ -n "$(train "$bin" "$data" "$np" "$log" "$@" --set train.stop_after=10 --save "$ck")" ] || return 0
    train "$bin" "$data" "$np" "$log" "$@" --resume "$ck"
  else
    train "$bin" "$data" "$np" "$log" "$@"
  fi
}

bad=0
row() { printf '%-26s %-5s %-14s %-14s %s\n' "$@"; }
row layout ranks base new result
tb=$(cat "$tmp/base/c_train.bin" "$tmp/base/c_val.bin" | sha256sum | cut -c1-64)
tn=$(cat "$tmp/new/c_train.bin" "$tmp/new/c_val.bin" | sha256sum | cut -c1-64)
[ "$tb" = "$tn" ] && r=same || { r=DIFFERENT; bad=1; }
row "prepare (token files)" - "${tb:0:12}" "${tn:0:12}" "$r"
n=0
for l in "${LAYOUTS[@]}"; do
  IFS='|' read -r name np args <<<"$l"
  [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]] && continue
  read -r -a a <<<"$args"
  db=$(run_layout "$base" "$tmp/base" "$name" "$np" "${a[@]}")
  dn=$(run_layout "$new" "$tmp/new" "$name" "$np" "${a[@]}")
  if [ -z "$db" ] || [ -z "$dn" ]; then
    r="FAILED ($([ -z "$db" ] && echo "base: $(tail -1 "$logs/$name.base.log")") $([ -z "$dn" ] && echo "new: $(tail -1 "$logs/$name.new.log")"))"
    bad=1
  elif [ "$db" = "$dn" ]; then r=same
  else r=DIFFERENT; bad=1; fi
  row "$name" "$np" "${db:0:12}" "${dn:0:12}" "$r"
  n=$((n + 1))
done
[ $bad -eq 0 ] && echo "all $n layouts: the same final weights" || echo "some layouts differ or failed (logs: ${KEEP:-rerun with KEEP=DIR})"
exit $bad
