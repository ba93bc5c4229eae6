# Several "hosts" on one machine, for multi-node tests and benchmarks (source it; root).
# Each host is a network namespace with its own veth link to a bridge, and each of its
# processes runs under its own hostname (unshare --uts): Open MPI tells nodes apart by
# hostname, and two "hosts" with one name would share their shared-memory files. mpirun
# stays in the root namespace and starts each host's daemon through an rsh agent that
# enters the namespace (`ip netns exec`), as ssh would enter a real node.
#
#   cluster_up N [RATE]   N hosts, IPs $CLUSTER_NET.1 .. .N; RATE (e.g. 1gbit) caps each
#                         host's outgoing link with tc tbf. Returns 77 when namespaces or
#                         bridges cannot be made here (not root, no CAP_NET_ADMIN).
#   cluster_down          removes everything cluster_up made
#   CLUSTER_MPI=(...)     mpirun options for the cluster; add --host "$(cluster_hosts K)"
#   cluster_hosts K       "ip1:K,ip2:K,...": K slots per host
CLUSTER_ID="dt$(( $$ % 100000 ))"
CLUSTER_NET="10.213.$(( $$ % 200 + 20 ))"
CLUSTER_N=0
cluster_down() {
  local i
  for ((i = 1; i <= CLUSTER_N; i++)); do ip netns del "${CLUSTER_ID}h$i" 2>/dev/null || true; done
  ip link del "${CLUSTER_ID}br" 2>/dev/null || true
  [ -n "${CLUSTER_AGENT:-}" ] && rm -f "$CLUSTER_AGENT"
  CLUSTER_N=0
}
cluster_up() {
  local n=$1 rate=${2:-} i
  command -v ip >/dev/null && command -v unshare >/dev/null || return 77
  ip link add "${CLUSTER_ID}br" type bridge 2>/dev/null || return 77
  ip addr add "$CLUSTER_NET.254/24" dev "${CLUSTER_ID}br" && ip link set "${CLUSTER_ID}br" up || return 77
  for ((i = 1; i <= n; i++)); do
    local ns="${CLUSTER_ID}h$i" v="${CLUSTER_ID}v$i"
    ip netns add "$ns" || { cluster_down; return 77; }
    CLUSTER_N=$i
    ip link add "$v" type veth peer name eth0 netns "$ns" &&
      ip link set "$v" master "${CLUSTER_ID}br" && ip link set "$v" up &&
      ip netns exec "$ns" ip addr add "$CLUSTER_NET.$i/24" dev eth0 &&
      ip netns exec "$ns" ip link set eth0 up && ip netns exec "$ns" ip link set lo up || { cluster_down; return 77; }
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms || { cluster_down; return 1; }
    fi
  done
  # the agent: "AGENT HOST COMMAND..." runs COMMAND (one shell string, as with ssh) on HOST
  CLUSTER_AGENT="$(mktemp /tmp/dtrain-agent.XXXXXX)"
  cat >"$CLUSTER_AGENT" <<EOF
#!/bin/sh
host=\$1; shift
n=\${host##*.}
exec ip netns exec ${CLUSTER_ID}h\$n unshare --uts sh -c "hostname emu\$n; \$*"
EOF
  chmod +x "$CLUSTER_AGENT"
  CLUSTER_MPI=(mpirun --mca plm_rsh_agent "$CLUSTER_AGENT" --mca plm_rsh_no_tree_spawn 1
               --mca oob_tcp_if_include "$CLUSTER_NET.0/24" --mca btl_tcp_if_include "$CLUSTER_NET.0/24"
               --mca btl self,vader,tcp --mca mpi_yield_when_idle 1 --oversubscribe
               -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -x OMP_NUM_THREADS -x LSAN_OPTIONS
               -x ASAN_OPTIONS)
}
cluster_hosts() {
  local k=$1 i out=""
  for ((i = 1; i <= CLUSTER_N; i++)); do out+="${out:+,}$CLUSTER_NET.$i:$k"; done
  echo "$out"
}
# cluster_tx: the bytes the hosts have sent on their (capped) links so far
cluster_tx() {
  local i s=0
  for ((i = 1; i <= CLUSTER_N; i++)); do
    s=$((s + $(ip netns exec "${CLUSTER_ID}h$i" cat /sys/class/net/eth0/statistics/tx_bytes)))
  done
  echo $s
}
