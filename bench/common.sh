# Shared by the multi-rank bench scripts: the dtrain binary ($dtrain), a scratch directory
# removed on exit ($tmp), the environment every run gets (${ENV[@]}: glibc keeps freed memory,
# OpenBLAS picks its own kernels), the CPU-share probe (probe: about 2.0 when both cores are
# ours, below ~1.6 when another load takes one), and token files of random ids.
# usage, after `set -euo pipefail`: source "$(dirname "$0")/common.sh" NAME "${1:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dtrain="$(realpath "${2:-$here/../build/dtrain}")"
tmp="$(mktemp -d "/tmp/dtrain-bench-$1.XXXXXX")"; trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736)
probe() {
  [ -x "$tmp/cpu_probe" ] || gcc -O2 -o "$tmp/cpu_probe" "$here/cpu_probe.c" -lpthread
  "$tmp/cpu_probe" | sed -nE 's/.*= ([0-9]+\.[0-9]+).*/\1/p' # the ratio, not the "< 1.6" of its warning
}
random_tokens() { # FILE VOCAB COUNT: a dtrain token file of COUNT ids drawn uniformly below VOCAB (seed 0)
  /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import random, struct, sys
random.seed(0); v, n = int(sys.argv[2]), int(sys.argv[3])
toks = [random.randrange(v) for _ in range(n)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack("<%dH" % n, *toks))
PY
}
