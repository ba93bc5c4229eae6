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
# DiLoCo's replicas as separate jobs, one per host (`launch --replicas 2 --hostfile`): the
# one-job run's weights; replica 1's host loses its job after step 6 and the other goes on
# (replica 0 slowed, so that replica 1 is back before the end: it trains its last steps)
DL=(--set parallel.sync=diloco --set parallel.sync_every=4)
one=$(timeout 300 "${MPI[@]}" "$DTRAIN" train "${DP_RUN[@]}" "${DL[@]}" --set parallel.dp_shard=2 --digest 2>&1 |
  grep -o 'digest sha256:[0-9a-f]*')
printf '%s slots=2\n%s slots=2\n' "$CLUSTER_NET.1" "$CLUSTER_NET.2" >"$TMP/hosts.txt"
LAUNCH=("$DTRAIN" launch --mpirun "${CLUSTER_MPI[0]}" --hostfile "$TMP/hosts.txt" --outer-addr "$CLUSTER_NET.254")
for a in "${CLUSTER_MPI[@]:1}"; do LAUNCH+=(--mpi-arg "$a"); done
timeout 300 "${LAUNCH[@]}" -n 4 --replicas 2 -- train "${DP_RUN[@]}" "${DL[@]}" --digest >"$TMP/rj.out" 2>&1
rc=$?
got=$(digest_of "$TMP/rj.out" | sort -u)
[ $rc = 0 ] && [ -n "$one" ] && [ "$got" = "$one" ] && grep -q "replica 1 on $CLUSTER_NET.2:2" "$TMP/rj.out" &&
  pass "2 replica jobs, one per emulated host, meeting at the launcher: the one-job run's weights ($got)" ||
  fail "replica jobs across hosts: rc $rc '$got' vs '$one': $(grep 'launch\|error' "$TMP/rj.out" | tail -4)"
rm -f "$TMP/once"
DT_TEST_FAULT=exit:6:2 DT_TEST_FAULT_ONCE="$TMP/once" DT_TEST_STRAGGLER=0:300 \
  timeout 300 "${LAUNCH[@]}" --mpi-arg -x --mpi-arg DT_TEST_FAULT --mpi-arg -x --mpi-arg DT_TEST_FAULT_ONCE \
  --mpi-arg -x --mpi-arg DT_TEST_STRAGGLER --restart-delay 0 -n 4 --replicas 2 -- train "${DP_RUN[@]}" "${DL[@]}" \
  --steps 80 --set train.val_every=0 --digest --metrics "$TMP/rjk.jsonl" >"$TMP/rjk.out" 2>&1
rc=$?
got=$(digest_of "$TMP/rjk.out" | sort -u)
joined=$(grep -o 'replica 1 joins the others at step [0-9]*' "$TMP/rjk.out" | head -1 | grep -o '[0-9]*$')
[ $rc = 0 ] && [ "$(echo "$got" | wc -l)" = 1 ] && [ -n "$joined" ] && [ "$joined" -lt 80 ] &&
  ! grep -q "replica 0 failed" "$TMP/rjk.out" && [ "$(grep -vc event "$TMP/rjk.jsonl")" = 80 ] &&
  pass "replica 1's host lost its job after step 6: replica 0 went on, replica 1 rejoined ($(grep -o 'joins the others at step [0-9]*' "$TMP/rjk.out" | head -1)), one model" ||
  fail "replica killed across hosts: rc $rc '$got': $(grep 'launch\|error' "$TMP/rjk.out" | tail -4)"
finish
