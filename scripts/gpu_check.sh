#!/bin/bash
# On a GPU machine, from the repository root: unpacks .gpu/bundle.tar.xz (made by
# scripts/gpu_bundle.sh), finds CUDA's libraries, runs the GPU tests, then each
# argument as a shell command with $DTRAIN and $OUTDIR set, e.g.
#   scripts/gpu_check.sh 'bench/gpu/bench_dtrain.sh $DTRAIN $OUTDIR bf16 16 32'
# Logs go to $OUT when set (the device tool's folder), else /tmp/gpu_out.
set -uo pipefail
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out" /tmp/dt
tar -C /tmp/dt -xJf .gpu/bundle.tar.xz || exit 2
libdirs=/tmp/dt/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, n, "lib") for p in nvidia.__path__ for n in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && ls "$d" | grep -q -E 'libcublasLt\.so|libnccl\.so|libcudnn\.so' && libdirs="$libdirs:$d"
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DT_BIN=/tmp/dt/bin
if [ -x /tmp/dt/ompi/bin/mpirun ]; then # the bundle's Open MPI, matching the libmpi it carries
  export OPAL_PREFIX=/tmp/dt/ompi PATH=/tmp/dt/ompi/bin:$PATH OMPI_MCA_mca_base_component_show_load_errors=0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "libraries: $LD_LIBRARY_PATH"
rc=0
# registers and spills (LOCAL bytes) of the mma attention kernels as built: the forward
# with 32 rows per warp sits at 254 of 255 registers, so another nvcc may spill
if command -v cuobjdump > /dev/null; then
  echo "== attention kernels' resources"
  cuobjdump -res-usage "$DT_BIN/dtrain" 2>/dev/null | grep -A1 "dt_fa" |
    grep -o "Function [^:]*\|REG:[0-9]*\|LOCAL:[0-9]*" | paste - - - | sed 's/Function _ZN5dt_fa//'
fi
for t in test_cuda_ops test_cuda_model; do
  echo "== $t"; "$DT_BIN/$t" > "$out/$t.log" 2>&1; r=$?
  grep -E "^(FAIL|GPU)|passed|FAILED|skip" "$out/$t.log"; [ $r -eq 0 ] || rc=1
done
# the other attention kernels too (the mma ones, 32 rows per warp in the forward, are
# the bf16 default where the head size allows)
for v in DT_CUDA_FA_ROWS=16 DT_CUDA_ATTENTION=wmma; do
  echo "== test_cuda_ops ($v)"
  env "$v" "$DT_BIN/test_cuda_ops" > "$out/test_cuda_ops_${v#*=}.log" 2>&1 || rc=1
  grep -E "^FAIL|passed|FAILED" "$out/test_cuda_ops_${v#*=}.log"
done
echo "== test_cuda_train"
bash tests/test_cuda_train.sh "$DT_BIN/dtrain" "$PWD" /tmp > "$out/test_cuda_train.log" 2>&1 || rc=1
grep -E "^(ok|FAIL)|passed" "$out/test_cuda_train.log"
for cmd in "$@"; do echo "== $cmd"; DTRAIN="$DT_BIN/dtrain" OUTDIR="$out" bash -c "$cmd" || rc=1; done
exit $rc
