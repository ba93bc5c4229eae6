# The GPU paths' host side, on the CPU: `backend: emulated` runs the CPU kernels on memory
# the host code cannot touch (ops_emulated.c), so everything the CUDA backend's runs do
# around the kernels runs here: DDP's gradient staging, tensor and pipeline parallelism's
# messages through host buffers, the tied embedding's sum, checkpoints, the digest and
# resume through host copies. Host code that handed device memory to MPI, or read it,
# would crash. The kernels are the CPU's, so each layout must give the CPU layout's
# weights bit for bit, and checkpoints must cross between the two.
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
# the boundary faults on x86-64's non-canonical addresses only (ops_emulated.c)
[ "$(uname -m)" = x86_64 ] || { echo "skipped: the emulated device's boundary needs x86-64"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
prepare_tiny
RUN=("${DP_RUN[@]}" --set log.sample_tokens=0 --digest)
EMU=(--set backend=emulated)
IL=(--set parallel.schedule=interleaved --set parallel.virtual_stages=2 --set model.n_layer=4)

# same NAME NP ARGS...: the layout on the emulated device ends on its CPU run's weights
# (EMU_EXTRA: arguments for the emulated run only)
EMU_EXTRA=()
same() {
  local name=$1 np=$2; shift 2
  local launch=("${MPI[@]}" -np "$np")
  [ "$np" = 1 ] && launch=()
  "${launch[@]}" "$DTRAIN" train "${RUN[@]}" "$@" >"$TMP/cpu_$name.out" 2>&1 || fail "$name on the CPU"
  "${launch[@]}" "$DTRAIN" train "${RUN[@]}" "$@" "${EMU[@]}" "${EMU_EXTRA[@]}" --metrics "$TMP/$name.jsonl" \
    >"$TMP/emu_$name.out" 2>&1
  local rc=$? a b
  a=$(digest_of "$TMP/cpu_$name.out"); b=$(digest_of "$TMP/emu_$name.out")
  [ $rc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && pass "$name emulated = CPU ($b)" ||
    fail "$name emulated: rc $rc, $b vs $a: $(grep -v '^\[' "$TMP/emu_$name.out" | tail -2)"
}
same one 1
grep -q "^dtrain: global batch .*fp32" "$TMP/emu_one.out" && ! grep -q "^gpu:" "$TMP/emu_one.out" &&
  pass "an emulated run reports no GPU" || fail "emulated header: $(head -3 "$TMP/emu_one.out")"
same bf16 1 --set precision=bf16
same dp2 2
same dp2_ps 2 --set parallel.dp_mode=ps
same tp2 2 --set parallel.tp=2
same pp2_1f1b 2 --set parallel.pp=2
same dp2_z1 2 --set parallel.zero=1
same bf16_dp2_z3 2 --set precision=bf16 --set parallel.zero=3
if full; then # the ASan pass: each staging path once above; here their combinations
  same bf16_dp2_pp2 4 --set precision=bf16 --set parallel.pp=2
  same dp2_pp2_tp2 8 --set parallel.pp=2 --set parallel.tp=2
  same tp2_sp 2 --set parallel.tp=2 --set parallel.sp=true
  same pp2_gpipe 2 --set parallel.pp=2 --set parallel.schedule=gpipe
  same pp2_zbh1 2 --set parallel.pp=2 --set parallel.schedule=zb-h1
  same pp2_interleaved 2 --set parallel.pp=2 "${IL[@]}"
  same dp2_pp2 4 --set parallel.pp=2
  same dp2_pp2_ps 4 --set parallel.pp=2 --set parallel.dp_mode=ps
  same pp2_tp2 4 --set parallel.pp=2 --set parallel.tp=2
  same bf16_dp2 2 --set precision=bf16
  same bf16_dp2_ps 2 --set precision=bf16 --set parallel.dp_mode=ps
  same bf16_tp2_sp 2 --set precision=bf16 --set parallel.tp=2 --set parallel.sp=true
  same dp2_z2 2 --set parallel.zero=2
  same dp2_z3 2 --set parallel.zero=3
  same bf16_dp2_z1 2 --set precision=bf16 --set parallel.zero=1
  same dp2_pp2_z3 4 --set parallel.pp=2 --set parallel.zero=3
  same dp2_tp2_z2 4 --set parallel.tp=2 --set parallel.zero=2
  same bf16_dp2_pp2_z1 4 --set precision=bf16 --set parallel.pp=2 --set parallel.zero=1
fi

# checkpoints through host copies: an emulated pp2 x tp2 save resumes in one CPU process,
# a CPU save resumes on the emulated pp2, each continuing the single-process curve
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/ref.jsonl" >/dev/null 2>&1 || fail "single-process reference"
"${MPI[@]}" -np 4 "$DTRAIN" train "${DP_RUN[@]}" "${EMU[@]}" --set parallel.pp=2 --set parallel.tp=2 \
  --set train.stop_after=10 --save "$TMP/c1" --metrics "$TMP/c1.jsonl" >"$TMP/c1.out" 2>&1 ||
  fail "emulated pp2 tp2 first half: $(tail -2 "$TMP/c1.out")"
"$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/c1" --metrics "$TMP/c1.jsonl" >"$TMP/c1r.out" 2>&1 ||
  fail "CPU resume: $(tail -2 "$TMP/c1r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c1.jsonl") && pass "emulated pp2 tp2 save + CPU resume = single process ($r)" ||
  fail "emulated -> CPU: $r"
"$DTRAIN" train "${DP_RUN[@]}" --set train.stop_after=10 --save "$TMP/c2" --metrics "$TMP/c2.jsonl" >/dev/null 2>&1 ||
  fail "CPU first half"
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${EMU[@]}" --set parallel.pp=2 --resume "$TMP/c2" \
  --metrics "$TMP/c2.jsonl" >"$TMP/c2r.out" 2>&1 || fail "emulated pp2 resume: $(tail -2 "$TMP/c2r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c2.jsonl") && pass "CPU save + emulated pp2 resume = single process ($r)" ||
  fail "CPU -> emulated: $r"

# device collectives (comm.backend nccl; here the emulated device communicator runs the
# host's algorithms on the memory behind the device addresses): DDP's buckets and ZeRO's
# unit collectives on device memory, bf16 through fp32 device copies, give the CPU's
# weights bit for bit, and what each rank allocates is the estimate to the byte
EMU_EXTRA=(--set comm.backend=nccl)
same nccl_bf16_z2 2 --set precision=bf16 --set parallel.zero=2
# the host only queues device collectives: their exposed time is not claimed as measured
grep -q "^communication: .*device communicator.*not measured" "$TMP/emu_nccl_bf16_z2.out" &&
  ! grep -q "ms/step exposed" "$TMP/emu_nccl_bf16_z2.out" && pass "nccl: communication time reported as not measured" ||
  fail "nccl communication line: $(grep '^communication' "$TMP/emu_nccl_bf16_z2.out")"
if full; then
  same nccl_dp2 2
  same nccl_z1 2 --set parallel.zero=1
  same nccl_z3 2 --set parallel.zero=3
  same nccl_bf16_dp2 2 --set precision=bf16 --set parallel.bucket_mb=0.01
  same nccl_bf16_z1 2 --set precision=bf16 --set parallel.zero=1
  same nccl_bf16_z3 2 --set precision=bf16 --set parallel.zero=3
fi
EMU_EXTRA=()
MEM=(--set model.n_embd=64 --set train.micro_batch=2 --set train.global_batch=8 --steps 2 "${EMU[@]}" --set comm.backend=nccl)
for lay in "bf16_z0:--set precision=bf16" "bf16_z3:--set precision=bf16 --set parallel.zero=3" "z2:--set parallel.zero=2"; do
  name=${lay%%:*}; args=${lay#*:}
  [ $name = bf16_z3 ] || full || continue
  "${MPI[@]}" -np 2 "$DTRAIN" train "${TINY[@]}" "${MEM[@]}" $args --metrics "$TMP/m_$name.jsonl" >"$TMP/m.out" 2>&1 ||
    { fail "nccl memory run $name: $(tail -2 "$TMP/m.out")"; continue; }
  "$DTRAIN" estimate "${TINY[@]}" "${MEM[@]}" $args -n 2 --json >"$TMP/e_$name.json" || fail "estimate $name"
  r=$(python3 - "$TMP/m_$name.jsonl" "$TMP/e_$name.json" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
want = json.load(open(sys.argv[2]))["stages"][0]["rank_bytes"]
for m in summ["mem"]:
    total = m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"]
    if total != want:
        print("rank %d allocates %d (workspace %d), the estimate says %d" % (m["rank"], total, m["workspace"], want))
        sys.exit(1)
print("%d bytes per rank, workspace %d" % (want, summ["mem"][0]["workspace"]))
PY
) && pass "nccl $name: allocation = estimate ($r)" || fail "nccl $name memory: $r"
done

# a ZeRO-3 save (shards gathered to host memory) resumes in one CPU process; a bf16
# ZeRO-3 run resumes on the emulated device bitwise (its checkpoint holds the fp32 masters)
"${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${EMU[@]}" --set parallel.zero=3 --set train.stop_after=10 \
  --save "$TMP/c3" --metrics "$TMP/c3.jsonl" >"$TMP/c3.out" 2>&1 || fail "emulated zero3 first half: $(tail -2 "$TMP/c3.out")"
"$DTRAIN" train "${DP_RUN[@]}" --resume "$TMP/c3" --metrics "$TMP/c3.jsonl" >"$TMP/c3r.out" 2>&1 ||
  fail "CPU resume of zero3: $(tail -2 "$TMP/c3r.out")"
r=$(compare_curves "$TMP/ref.jsonl" "$TMP/c3.jsonl") && pass "emulated ZeRO-3 save + CPU resume = single process ($r)" ||
  fail "emulated zero3 -> CPU: $r"
Z16=("${EMU[@]}" --set precision=bf16 --set parallel.zero=3 --set log.sample_tokens=0 --digest)
if full; then
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${Z16[@]}" --set train.stop_after=10 --save "$TMP/c4" >/dev/null 2>&1 &&
    "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${Z16[@]}" --resume "$TMP/c4" >"$TMP/c4r.out" 2>&1 ||
    fail "emulated bf16 zero3 halves: $(tail -2 "$TMP/c4r.out")"
  a=$(digest_of "$TMP/emu_bf16_dp2_z3.out"); b=$(digest_of "$TMP/c4r.out")
  [ -n "$a" ] && [ "$a" = "$b" ] && pass "emulated bf16 ZeRO-3 resume = straight run ($b)" || fail "bf16 zero3 resume: $b vs $a"
fi

# the final sample through the pipeline's host staging, and from ZeRO-3's gathered
# device copy: the CPU's text
for lay in "pp2:--set parallel.pp=2" "z3:--set parallel.zero=3"; do
  name=${lay%%:*}; SAMPLE=(--set log.sample_tokens=30 ${lay#*:})
  [ $name = pp2 ] || full || continue
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${SAMPLE[@]}" 2>&1 | sed -n '/^--- sample/,/^---$/p' >"$TMP/s1.txt"
  "${MPI[@]}" -np 2 "$DTRAIN" train "${DP_RUN[@]}" "${SAMPLE[@]}" "${EMU[@]}" 2>&1 | sed -n '/^--- sample/,/^---$/p' >"$TMP/s2.txt"
  [ "$(wc -l <"$TMP/s1.txt")" -ge 3 ] && cmp -s "$TMP/s1.txt" "$TMP/s2.txt" && pass "$name sample: emulated = CPU" ||
    fail "$name sample: $(cat "$TMP/s2.txt") vs $(cat "$TMP/s1.txt")"
done

# bitwise mode on the device: the leaves are the device gradients copied to the host, the
# root copied back: the CPU's bitwise weights for DDP, ZeRO-1/2/3 and a pipeline, fp32 and bf16
for prec in fp32 bf16; do
  BWR=("${RUN[@]}" --set precision=$prec --set parallel.determinism=bitwise)
  "$DTRAIN" train "${BWR[@]}" >"$TMP/bwc.out" 2>&1 || fail "CPU bitwise $prec: $(tail -2 "$TMP/bwc.out")"
  ref=$(digest_of "$TMP/bwc.out")
  for lay in "single:1:" "ddp:2:" "z1:2:--set parallel.zero=1" "z2:2:--set parallel.zero=2" "z3:4:--set parallel.zero=3" \
             "pp2:2:--set parallel.pp=2"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    case $prec:$name in fp32:z3|bf16:pp2) ;; *) full || continue ;; esac
    "${MPI[@]}" -np "$np" "$DTRAIN" train "${BWR[@]}" "${EMU[@]}" $args >"$TMP/bwe.out" 2>&1
    [ -n "$ref" ] && [ "$(digest_of "$TMP/bwe.out")" = "$ref" ] && pass "bitwise $prec $name on the device: the CPU's digest" ||
      fail "bitwise $prec $name on the device: $(digest_of "$TMP/bwe.out") vs $ref $(grep -m1 error "$TMP/bwe.out")"
  done
done

# what the GPU paths do not run yet is refused as on a GPU: one line, exit 2
RUN=("${DP_RUN[@]}" "${EMU[@]}")
refused "device collectives with tp" "data parallelism only" 2 --set comm.backend=nccl --set parallel.tp=2
refused "device collectives with the central rank" "not dp_mode ps" 2 --set comm.backend=nccl --set parallel.dp_mode=ps
refused "context parallelism on a device" "backend other than cpu" 2 --set parallel.cp=2
RUN=("${DP_RUN[@]}")
refused "device collectives on the CPU backend" "needs a device backend" 2 --set comm.backend=nccl
finish
