# Bitwise mode's weights do not depend on the thread count: the digest after 20 steps is
# the same with 1, 2 and 3 threads in a single process and with 1 and 2 threads per rank
# at dp 2 (an elastic restart on a machine with other cores keeps the bits), in fp32 and bf16. The shape
# makes the weight-gradient GEMMs sum K = 9 x 40 = 360 rows: past OpenBLAS's K block
# (320 here), where its threaded driver splits K otherwise than its serial one, so
# without the fixed tiles (src/backend/cpu/gemm_tiles.c) 1 and 2 threads differ.
source "$(dirname "$0")/lib.sh"
need_mpi
prepare_tiny
BW=("${TINY[@]}" --steps 20 --seed 1 --set model.seq_len=40 --set train.micro_batch=9 --set train.global_batch=18
    --set train.val_every=0 --set parallel.determinism=bitwise --digest)
# OMP_NUM_THREADS (need_mpi sets 1) overrides --threads: each run sets it; passive waiting
# keeps oversubscribed threads (3 on 2 CPUs, 2 x 2 ranks) from spinning against each other
run_threads() { # NP THREADS OUT
  local cmd=("$DTRAIN" train "${BW[@]}" --threads "$2")
  [ "$1" -gt 1 ] && cmd=("${MPI[@]}" -np "$1" -x OMP_NUM_THREADS="$2" -x OMP_WAIT_POLICY=passive "${cmd[@]}")
  OMP_NUM_THREADS=$2 OMP_WAIT_POLICY=passive "${cmd[@]}" >"$3" 2>&1 || echo "(run failed: $(tail -2 "$3"))" >&2
  # a run on other threads than asked tests nothing: no digest then
  grep -q "^dtrain: threads $2 per rank" "$3" && digest_of "$3" || echo "(not $2 threads: $(grep -m1 threads "$3"))" >&2
}
ref=$(run_threads 1 1 "$TMP/t1.out"); echo "single process, 1 thread: $ref"
[ -n "$ref" ] || fail "no digest: $(tail -2 "$TMP/t1.out")"
for case in "1 2" "1 3" "2 1" "2 2"; do
  set -- $case
  d=$(run_threads "$1" "$2" "$TMP/np$1_t$2.out")
  [ -n "$ref" ] && [ "$d" = "$ref" ] && pass "np $1, $2 threads per rank: the 1-thread digest" ||
    fail "np $1, $2 threads per rank: $d vs $ref"
done
# bf16 storage runs the same fixed kernels on widened copies: 1 thread against 2 per rank at dp 2
BW+=(--set precision=bf16)
ref16=$(run_threads 1 1 "$TMP/b1.out"); echo "bf16 single process, 1 thread: $ref16"
d=$(run_threads 2 2 "$TMP/b22.out")
[ -n "$ref16" ] && [ "$ref16" != "$ref" ] && [ "$d" = "$ref16" ] && pass "bf16: np 2, 2 threads per rank: the 1-thread digest" ||
  fail "bf16: np 2, 2 threads per rank: $d vs $ref16 (fp32 $ref)"
# fast mode keeps OpenBLAS's own threading (not asserted: its bits may differ, by design)
finish
