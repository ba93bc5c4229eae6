/* Builds without CUDA: `backend: cuda` is an input error naming why. */
#include "../ops.h"

dt_status dt_ops_cuda(const dt_ops **out, int bf16) {
    (void)bf16;
    *out = 0;
    return dt_fail(DT_EINPUT, "backend cuda: this dtrain was built without CUDA (no nvcc at configure time; "
                   "install the CUDA toolkit and rebuild)");
}

const char *dt_gpu_name(void) { return "none"; }

size_t dt_gpu_peak_bytes(void) { return 0; }
void *dt_gpu_stream(void) { return 0; }
void dt_gpu_select(int local_rank) { (void)local_rank; }
double dt_gpu_bf16_peak(void) { return 0.0; }
void dt_gpu_fusion_counts(long *fused, long *fell_back) { *fused = *fell_back = 0; }
