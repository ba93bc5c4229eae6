"""PyTorch's causal SDPA at the shape bench/gpu/attention_bench.c times (default GPT-2
124M: B 64, T 1024, 12 heads of 64), bf16, q/k/v strided views of one packed [B, T, 3C]
tensor as a GPT block makes them: forward and backward, the median of 20 after 3 warm-ups
(CUDA events), TFLOP/s counting the causal half (forward 2·B·NH·T²·HS, backward 2.5×),
for each SDPA backend that runs here (flash, cuDNN, efficient).
Usage: python3 torch_attention.py [B T NH HS]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, T, NH, HS = (int(x) for x in sys.argv[1:5]) if len(sys.argv) > 4 else (64, 1024, 12, 64)
C = NH * HS
torch.manual_seed(0)
qkv = (torch.rand(B, T, 3 * C, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
dout = torch.rand(B, NH, T, HS, device="cuda", dtype=torch.bfloat16) * 2 - 1
flops = 2.0 * B * NH * T * T * HS


def run():
    q, k, v = qkv.view(B, T, 3, NH, HS).permute(2, 0, 3, 1, 4).unbind(0)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                      ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
    try:
        with sdpa_kernel(backend):
            tf, tb = [], []
            for i in range(23):
                e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                e[0].record()
                y = run()
                e[1].record()
                y.backward(dout)
                e[2].record()
                torch.cuda.synchronize()
                qkv.grad = None
                if i >= 3:
                    tf.append(e[0].elapsed_time(e[1]))
                    tb.append(e[1].elapsed_time(e[2]))
        f, b = sorted(tf)[10], sorted(tb)[10]
        print("torch %s SDPA (%s) B=%d T=%d NH=%d HS=%d: forward %.3f ms %.1f TFLOP/s, backward %.3f ms %.1f TFLOP/s"
              % (torch.__version__, name, B, T, NH, HS, f, flops / f / 1e9, b, 2.5 * flops / b / 1e9))
    except RuntimeError as err:
        print("torch SDPA (%s): not available here (%s)" % (name, str(err).splitlines()[0]))
