# Across nodes: two emulated hosts (tests/emulated_cluster.sh) x 2 ranks. The
# communicator tests run with the node split (shm refused on the world, used on each
# node's communicator), and data-parallel training over both hosts reproduces the
# single-process run: per-step curves within 1e-5 (fast) and the same digest (bitwise).
# Skipped (exit 77) where network namespaces cannot be made.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/emulated_cluster.sh"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export LSAN_OPTIONS="${LSAN_OPTIONS:-}" ASAN_OPTIONS="${ASAN_OPTIONS:-}"
trap 'cluster_down; rm -f "${CLUSTER_AGENT:-}"; rm -rf "$TMP"' EXIT
cluster_up 2 || { echo "skipped: cannot make network namespaces here"; exit 77; }
MPI=("${CLUSTER_MPI[@]}" --host "$(cluster_hosts 2)" -np 4)

# hostnames: two ranks on each emulated host
"${MPI[@]}" hostname >"$TMP/hosts" 2>&1
[ "$(sort "$TMP/hosts" | uniq -c | awk '{print $1 "x" $2}' | tr '\n' ' ')" = "2xemu1 2xemu2 " ] \
  && pass "4 ranks on 2 emulated hosts" || fail "placement: $(cat "$TMP/hosts")"

# collectives, every algorithm, with the world spanning two nodes
if timeout 300 "${MPI[@]}" -x DT_TEST_RANKS_PER_NODE=2 "$BUILD/mpi_test_comm" >"$TMP/comm.out" 2>&1; then
  pass "communicator across 2 nodes: $(grep passed "$TMP/comm.out")"
else
  fail "communicator across 2 nodes: $(grep -m3 FAIL "$TMP/comm.out") $(tail -2 "$TMP/comm.out")"
fi

prepare_tiny
"$DTRAIN" train "${DP_RUN[@]}" --metrics "$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 || fail "single-process run"
for mode in "ddp:" "zero3:--set parallel.zero=3"; do
  name=${mode%%:*}; args=${mode#*:}
  if timeout 300 "${MPI[@]}" "$DTRAIN" train "${DP_RUN[@]}" $args --metrics "$TMP/$name.jsonl" \
      >"$TMP/$name.out" 2>&1; then
    r=$(compare_curves "$TMP/ref.jsonl" "$TMP/$name.jsonl") && pass "2 hosts x 2 ranks $name matches single process ($r)" \
      || fail "2 hosts $name: $r"
  else
    fail "2 hosts $name run: $(tail -3 "$TMP/$name.out")"
  fi
done
BW=("${DP_RUN[@]}" --set parallel.determinism=bitwise --digest)
"$DTRAIN" train "${BW[@]}" >"$TMP/bw1.out" 2>&1 || fail "bitwise single process"
ref=$(digest_of "$TMP/bw1.out")
[ -n "$ref" ] || fail "no digest"
for mode in "ddp:" "zero2:--set parallel.zero=2"; do
  name=${mode%%:*}; args=${mode#*:}
  timeout 300 "${MPI[@]}" "$DTRAIN" train "${BW[@]}" $args >"$TMP/bw.out" 2>&1
  [ "$(digest_of "$TMP/bw.out")" = "$ref" ] && pass "bitwise 2 hosts x 2 ranks $name: same digest as single process" \
    || fail "bitwise 2 hosts $name: $(digest_of "$TMP/bw.out") $(tail -2 "$TMP/bw.out")"
done
finish
