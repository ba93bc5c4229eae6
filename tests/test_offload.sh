# ZeRO-Offload / ZeRO-Infinity (docs/offload.md): the optimizer state (offload.optimizer)
# and ZeRO-3's parameter shard (offload.param) in host memory or in files on disk give the
# run without offload bit for bit (fp32 and bf16 on the CPU and the emulated device: the
# host's update is the same AdamW kernel), in every layout: single process, DDP, ZeRO-1/2/3
# on 2 ranks, dp2 x pp2, tp2. The state really leaves the model's memory (the summary's
# per-rank bytes), the files exist while the run lasts and are gone after it; checkpoints
# saved under offload resume without it and the reverse (bitwise mode: the straight run's
# weights); a second job given the same files is refused while the first runs.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
NV="$BUILD/offload-test.$$" # the build directory's disk (O_DIRECT; /tmp may be tmpfs)
mkdir -p "$NV"
trap 'rm -rf "$TMP" "$NV"' EXIT
CPU=(--set offload.optimizer=cpu)
NVME=(--set offload.optimizer=nvme --set offload.nvme_path="$NV" --set offload.block_mb=0.0625)
CPU3=(--set offload.optimizer=cpu --set offload.param=cpu)
NVME3=("${NVME[@]}" --set offload.param=nvme)
BW=(--set parallel.determinism=bitwise)

run() { dp_run "$@"; }
# summary NAME FIELD: the field of every rank's memory summary, space-separated
summary() {
  python3 -c "
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '\"summary\"' in l][-1]
print(' '.join(str(r[sys.argv[2]]) for r in s['mem']))" "$TMP/$1.jsonl" "$2"
}

# parity LABEL NP ARGS...: none, cpu and nvme offload of the optimizer (and, with ZeRO-3, of
# the parameters) give the same digest; the state is off the model's memory
parity() {
  local label=$1 np=$2; shift 2
  local zero3=0; [[ " $* " == *" parallel.zero=3 "* ]] && zero3=1
  local ref; ref=$(run "$label-none" "$np" "$@")
  local kinds="cpu nvme"; full || kinds="nvme"
  for k in $kinds; do
    local extra=("${CPU[@]}"); [ $k = nvme ] && extra=("${NVME[@]}")
    if [ $zero3 = 1 ]; then extra=("${CPU3[@]}"); [ $k = nvme ] && extra=("${NVME3[@]}"); fi
    local got; got=$(run "$label-$k" "$np" "$@" "${extra[@]}")
    local optim file host; optim=$(summary "$label-$k" optim); file=$(summary "$label-$k" offload_file)
    host=$(summary "$label-$k" offload_host)
    local where=$([ $k = nvme ] && echo "$file" || echo "$host")
    # nvme: every step's metrics give the I/O it did (the update writes the state back)
    # bf16's and a device's gradients reach the host as they become final (the update reads them there)
    local early=0; [[ "$label" == bf16* || "$label" == emulated* ]] && early=1
    local io=ok; [ $k = nvme ] && io=$(python3 -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '\"event\"' not in l]
ok = r and all(x.get('offload_write_mb', 0) > 0 and 'offload_read_mb' in x and 'offload_wait_ms' in x and x.get('offload_ms', 0) > 0 for x in r)
early = all((x.get('offload_grads_early_mb', 0) > 0) == (sys.argv[2] == '1') for x in r)
# of them, those handed over during backward: all, some (a tied unit after its sum, a
# pending reduce-scatter), none (after an all-reduce)
e, b = [x.get('offload_grads_early_mb', 0) for x in r], [x.get('offload_grads_backward_mb', -1) for x in r]
want = sys.argv[3]
back = all(0 <= y <= x for x, y in zip(e, b)) and all(
    want == '-' or (want == 'all' and y == x) or (want == 'none' and y == 0) or (want == 'some' and 0 < y < x)
    for x, y in zip(e, b))
print('ok' if ok and early and back else 'no I/O metrics' if not ok else
      'offload_grads_early_mb %s, expected %s' % (e[:3], '> 0' if sys.argv[2] == '1' else '0') if not early else
      'offload_grads_backward_mb %s of %s, expected %s' % (b[:3], e[:3], want))" "$TMP/$label-$k.jsonl" $early "${BACK[$label]:--}")
    if [ -n "$ref" ] && [ "$got" = "$ref" ] && [[ "$optim" =~ ^(0 ?)+$ ]] && ! [[ "$where" =~ (^| )0( |$) ]] && [ "$io" = ok ]; then
      pass "$label, offload $k$([ $zero3 = 1 ] && echo ' (optimizer and parameters)'): the digest without offload; per rank optim $optim B in the model's memory, offloaded $where B"
    else
      fail "$label offload $k: digest '$got' vs '$ref', optim '$optim', offloaded '$where', $io: $(grep -m2 error "$TMP/$label-$k.out")"
    fi
  done
}

# where the gradients are handed over (bf16 and the emulated device): during backward
# (all), except a tied unit after its sum over the end stages or a reduce-scatter still
# pending when backward ends (some), or after the reduction (none)
declare -A BACK=([bf16-single]=all [bf16-ddp2]=none [bf16-zero1-dp2]=none [bf16-zero3-dp2]=all
  [bf16-pp2]=some [bf16-zero2-dp2xpp2]=some [emulated-single]=all [emulated-pp2]=some [emulated-zero2-dp2]=all
  [emulated-bf16-ddp2]=none [emulated-nccl-ddp2]=none [emulated-nccl-zero1-dp2]=none [emulated-nccl-zero2-dp2]=some)
parity single 1
parity single-zero3 1 --set parallel.zero=3
parity ddp2 2
parity zero1-dp2 2 --set parallel.zero=1
parity zero2-dp2 2 --set parallel.zero=2
parity zero3-dp2 2 --set parallel.zero=3
parity dp2xpp2 4 --set parallel.pp=2
parity zero3-dp2xpp2 4 --set parallel.pp=2 --set parallel.zero=3
parity tp2 2 --set parallel.tp=2
parity bf16-single 1 --set precision=bf16
parity bf16-zero3-dp2 2 --set precision=bf16 --set parallel.zero=3
parity bf16-ddp2 2 --set precision=bf16
parity bf16-zero1-dp2 2 --set precision=bf16 --set parallel.zero=1
full && parity bf16-pp2 2 --set precision=bf16 --set parallel.pp=2
parity bf16-zero2-dp2xpp2 4 --set precision=bf16 --set parallel.zero=2 --set parallel.pp=2
if full; then
  parity emulated-single 1 --set backend=emulated
  parity emulated-pp2 2 --set backend=emulated --set parallel.pp=2
  parity emulated-zero2-dp2 2 --set backend=emulated --set parallel.zero=2
  parity emulated-bf16-zero3-dp2 2 --set backend=emulated --set precision=bf16 --set parallel.zero=3
  parity emulated-bf16-ddp2 2 --set backend=emulated --set precision=bf16
  # device collectives (comm.backend nccl: the emulated device communicator), the
  # gradients handed over after the collectives queued on its stream
  NC=(--set backend=emulated --set comm.backend=nccl)
  parity emulated-nccl-ddp2 2 "${NC[@]}"
  parity emulated-nccl-zero1-dp2 2 "${NC[@]}" --set parallel.zero=1
  parity emulated-nccl-zero2-dp2 2 "${NC[@]}" --set parallel.zero=2
  parity emulated-nccl-zero3-dp2 2 "${NC[@]}" --set parallel.zero=3
  parity emulated-nccl-bf16-zero3-dp2 2 "${NC[@]}" --set precision=bf16 --set parallel.zero=3
fi

# `dtrain estimate`'s host and NVMe bytes per rank are what the run holds, to the byte
est() {
  local label=$1 np=$2; shift 2
  local want; want=$("$DTRAIN" estimate "${DP_RUN[@]}" "$@" -n "$np" --json | python3 -c "
import json, sys; o = json.load(sys.stdin)['offload']; print('%.0f %.0f' % (o['host'], o['nvme']))")
  run "est-$label" "$np" "$@" >/dev/null
  local got; got="$(summary "est-$label" offload_host | cut -d' ' -f1) $(summary "est-$label" offload_file | cut -d' ' -f1)"
  [ -n "$want" ] && [ "$want" = "$got" ] && pass "estimate of $label: host and NVMe bytes $want, as measured" ||
    fail "estimate of $label: '$want' estimated, '$got' measured"
}
est zero2-nvme 2 --set parallel.zero=2 "${NVME[@]}"
est zero3-nvme-both 2 --set parallel.zero=3 "${NVME3[@]}"
est ddp-cpu 2 "${CPU[@]}"
est bf16-zero3-param-cpu 2 --set parallel.zero=3 --set precision=bf16 --set offload.param=cpu
est emulated-nvme 2 --set backend=emulated "${NVME[@]}"
est emulated-nccl-zero3-nvme 2 --set backend=emulated --set comm.backend=nccl --set parallel.zero=3 "${NVME3[@]}"

# the files: one per rank and kind while the run lasts, none after it
left=$(find "$NV" -name 'dtrain-offload-*' | wc -l)
[ "$left" -eq 0 ] && pass "no offload file left after the runs" || fail "$left offload files left in $NV"

# checkpoints: saved under NVMe offload at step 10, resumed without it (and the reverse),
# in bitwise mode: the straight run's weights
straight=$(run straight 1 "${BW[@]}")
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${BW[@]}" --set parallel.zero=3 "${NVME3[@]}" --set train.stop_after=10 \
  --save "$TMP/ck1" >"$TMP/ck1.out" 2>&1 || fail "save under ZeRO-3 with NVMe offload: $(tail -2 "$TMP/ck1.out")"
got=$(run resume-plain 2 "${BW[@]}" --set offload.optimizer=none --set offload.param=none --set parallel.zero=0 \
  --resume "$TMP/ck1")
[ -n "$straight" ] && [ "$got" = "$straight" ] &&
  pass "saved at step 10 under ZeRO-3 + NVMe offload (optimizer and parameters), resumed as DDP without offload: the straight run's weights" ||
  fail "nvme save -> plain resume: '$got' vs '$straight': $(tail -2 "$TMP/resume-plain.out")"
"$DTRAIN" train "${DP_RUN[@]}" "${BW[@]}" --set train.stop_after=10 --save "$TMP/ck2" >"$TMP/ck2.out" 2>&1 ||
  fail "plain save: $(tail -2 "$TMP/ck2.out")"
got=$(run resume-nvme 2 "${BW[@]}" --set parallel.zero=2 "${NVME[@]}" --resume "$TMP/ck2")
[ "$got" = "$straight" ] && pass "saved at step 10 by one process without offload, resumed as ZeRO-2 with NVMe offload: the straight run's weights" ||
  fail "plain save -> nvme resume: '$got' vs '$straight': $(tail -2 "$TMP/resume-nvme.out")"
got=$(run resume-cpu 1 "${BW[@]}" "${CPU[@]}" --resume "$TMP/ck1")
[ "$got" = "$straight" ] && pass "the ZeRO-3 + NVMe checkpoint resumed by one process with CPU offload: the straight run's weights" ||
  fail "nvme save -> cpu resume: '$got' vs '$straight'"

# DDP under offload saves a tensor at a time from the rank's own store (no host copy of
# the whole state); resumed without offload: the straight run's weights
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${BW[@]}" "${NVME[@]}" --set train.stop_after=10 \
  --save "$TMP/ck4" >"$TMP/ck4.out" 2>&1 || fail "save under DDP with NVMe offload: $(tail -2 "$TMP/ck4.out")"
got=$(run resume-ddp-plain 1 "${BW[@]}" --resume "$TMP/ck4")
[ "$got" = "$straight" ] && pass "saved at step 10 under DDP dp2 + NVMe offload (streamed from the store), resumed by one process without offload: the straight run's weights" ||
  fail "ddp nvme save -> plain resume: '$got' vs '$straight': $(tail -2 "$TMP/resume-ddp-plain.out")"

# checkpoint.async under offload: saved synchronously (a note), and the save resumes
"$DTRAIN" train "${DP_RUN[@]}" "${BW[@]}" "${NVME[@]}" --set checkpoint.async=true --set train.stop_after=10 \
  --save "$TMP/ck3" >"$TMP/ck3.out" 2>&1 || fail "async save under offload: $(tail -2 "$TMP/ck3.out")"
got=$(run resume-async 1 "${BW[@]}" --resume "$TMP/ck3")
grep -q "checkpoint.async with offload.*: saving synchronously" "$TMP/ck3.out" && [ "$got" = "$straight" ] &&
  pass "checkpoint.async under offload: saved synchronously, resumed to the straight run's weights" ||
  fail "async under offload: '$got' vs '$straight': $(grep -m1 note "$TMP/ck3.out")"

# bad offload paths, from the command line: one line naming the path and the cause, exit 2
# (the store's own test, test_offload_store, also mounts a read-only, a full and a
# no-O_DIRECT filesystem)
bad() {
  local label=$1 pat=$2; shift 2
  timeout 60 "$DTRAIN" train "${DP_RUN[@]}" "$@" >"$TMP/bad.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/bad.out")" -eq 1 ] && grep -q "$pat" "$TMP/bad.out" &&
    pass "$label: $(grep '^dtrain: error' "$TMP/bad.out")" || fail "$label: rc $rc: $(tail -2 "$TMP/bad.out")"
}
bad "no such directory" "no such directory" --set offload.optimizer=nvme --set offload.nvme_path="$TMP/nowhere"
touch "$TMP/afile"
bad "a file as the directory" "not a directory" --set offload.optimizer=nvme --set offload.nvme_path="$TMP/afile"
bad "ZeRO-3 parameters to a missing directory" "no such directory" --set parallel.zero=3 \
  --set offload.param=nvme --set offload.nvme_path="$TMP/nowhere"

# a second job on the same files is refused (one line, exit 2) while the first runs, and
# the first goes on unharmed
if full; then
  mkdir -p "$TMP/beat"
  DTRAIN_HEARTBEAT="$TMP/beat" timeout 120 "$DTRAIN" train "${DP_RUN[@]}" "${NVME[@]}" --steps 1000000 \
    --set train.val_every=0 >"$TMP/first.out" 2>&1 &
  first=$!
  for i in $(seq 200); do [ -s "$TMP/beat/rank.0" ] && break; sleep 0.05; done
  timeout 60 "$DTRAIN" train "${DP_RUN[@]}" "${NVME[@]}" >"$TMP/second.out" 2>&1; rc=$?
  alive=$(kill -0 $first 2>/dev/null && echo yes)
  kill $first 2>/dev/null; wait $first 2>/dev/null
  [ $rc -eq 2 ] && [ "$(grep -c '^dtrain: error' "$TMP/second.out")" -eq 1 ] && grep -q "in use" "$TMP/second.out" &&
    [ "$alive" = yes ] && pass "a second job on the same offload files: $(grep '^dtrain: error' "$TMP/second.out")" ||
    fail "second job: rc $rc, first alive '$alive': $(tail -3 "$TMP/second.out")"
fi
finish
