#!/bin/bash
# Packs a CUDA build for a GPU machine that lacks this machine's libraries (the device
# machines here have CUDA but no OpenBLAS, cJSON or Open MPI): the binaries, and every
# shared library they load except the C runtime's and CUDA's own, into
# OUT/bundle.tar.xz. scripts/gpu_check.sh unpacks and runs it there.
# Usage: scripts/gpu_bundle.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
build=${1:-build}
out=${2:-.gpu}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$out"
for b in dtrain test_cuda_ops test_cuda_model attention_bench; do
  [ -x "$build/$b" ] || { echo "gpu_bundle: $build/$b is missing (make build with nvcc present)" >&2; exit 2; }
  cp "$build/$b" "$stage/bin/"
  strip --strip-debug "$stage/bin/$b" 2>/dev/null || true
done
for b in "$stage"/bin/*; do ldd "$b" | awk '$3 ~ /^\// {print $3}'; done | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so|/cuda' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
# Open MPI's launcher and components, relocatable with OPAL_PREFIX=<unpacked>/ompi (all
# of Debian's Open MPI paths derive from its /usr prefix), for multi-rank runs there
if command -v orterun > /dev/null; then
  mkdir -p "$stage/ompi/bin" "$stage/ompi/lib/x86_64-linux-gnu/openmpi/lib" "$stage/ompi/share"
  cp -L "$(command -v orterun)" "$stage/ompi/bin/mpirun"
  cp -L "$(command -v orted)" "$stage/ompi/bin/orted"
  cp -rL /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 "$stage/ompi/lib/x86_64-linux-gnu/openmpi/lib/"
  cp -rL /usr/share/openmpi "$stage/ompi/share/"
  for b in "$stage"/ompi/bin/* "$stage"/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
    ldd "$b" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so|/cuda' |
    while read -r l; do [ -e "$stage/lib/$(basename "$l")" ] || cp -L "$l" "$stage/lib/"; done
fi
tar -C "$stage" -cJf "$out/bundle.tar.xz" .
ls -la "$out/bundle.tar.xz"
