#!/usr/bin/env python3
"""PyTorch baseline for dtrain's CUDA backend: GPT-2 training throughput on one GPU.

Trains the same architecture as dtrain's GPT-2 (wte [Vp, C] tied to the LM head, learned wpe,
pre-LN blocks with a fused c_attn and causal SDPA, GELU-tanh MLP 4C, final ln_f, no dropout)
on synthetic random tokens (generated once on the GPU with a fixed seed, a few batches reused
round-robin, so no files are needed). One training step = forward + backward under bf16
autocast (fp32 master weights, TF32 on), global-norm clip to 1.0, fused AdamW.

Measures: `warmup` untimed steps (torch.compile happens there), then `steps` timed steps with
a single synchronize at the end. Reports tokens/s, MFU (dtrain's FLOPs formula:
6*(L*12*C*C + V*C) + 6*L*C*T per token, V = real vocab), peak memory and the final loss.

usage: python3 bench/gpu/torch_gpt2.py --batch auto --json out.json
       (--batch auto picks the largest of 128,96,64,48,32,16,8 that trains without OOM)
"""
import argparse
import gc
import json
import math
import sys
import time

import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

AUTO_BATCHES = [128, 96, 64, 48, 32, 16, 8]


class Attention(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, n_head)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.vocab = a.vocab
        self.wte = nn.Embedding(a.padded_vocab, a.n_embd)
        self.wpe = nn.Embedding(a.seq_len, a.n_embd)
        self.h = nn.ModuleList([Block(a.n_embd, a.n_head) for _ in range(a.n_layer)])
        self.ln_f = nn.LayerNorm(a.n_embd, eps=1e-5)
        proj_std = 0.02 / math.sqrt(2 * a.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.startswith("ln") or ".ln_" in name:
                nn.init.ones_(p)  # LayerNorm weights
            else:
                nn.init.normal_(p, 0.0, proj_std if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head: [B, T, Vp]
        # Padded columns (>= vocab) are SLICED away before the loss, so they get no probability.
        logits = logits[..., : self.vocab]
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))


def peak_flops(name):
    if "H100" in name and ("SXM" in name or "HBM3" in name):
        return 989e12
    if "H100" in name and "PCIe" in name:
        return 756e12
    if "H200" in name:
        return 989e12
    if "A100" in name:
        return 312e12
    return None


def build(a, batch):
    """Model, optimizer, compiled step function and data for one batch size; runs one probe step."""
    torch.manual_seed(0)
    raw = GPT(a).cuda()
    decay = [p for p in raw.parameters() if p.dim() >= 2]
    no_decay = [p for p in raw.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    model = raw if a.no_compile else torch.compile(raw)
    g = torch.Generator(device="cuda").manual_seed(1234)
    data = torch.randint(0, a.vocab, (a.batches, batch, a.seq_len + 1), device="cuda", generator=g)

    def step(i):
        buf = data[i % a.batches]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(buf[:, :-1], buf[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step(0)
    torch.cuda.synchronize()
    return step


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--padded_vocab", type=int, default=50304)
    p.add_argument("--batch", default="64", help="batch size, or 'auto'")
    p.add_argument("--batches", type=int, default=4, help="distinct synthetic batches, reused round-robin")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--no-compile", dest="no_compile", action="store_true")
    p.add_argument("--json", default=None, help="append one JSON object per run to this file")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_gpt2.py: no CUDA device")

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")

    auto = a.batch == "auto"
    step, batch = None, None
    for b in (AUTO_BATCHES if auto else [int(a.batch)]):
        try:
            step, batch = build(a, b), b
            break
        except Exception as e:  # noqa: BLE001 - only OOM is retried
            if not (auto and is_oom(e)):
                raise
            print(f"batch {b}: out of memory, trying smaller", file=sys.stderr)
        # the exception (and the frames holding model/optimizer) is gone here
        if not a.no_compile:
            torch._dynamo.reset()  # drop compiled code/guards; next size compiles fresh, static-shape
        gc.collect()
        torch.cuda.empty_cache()
    if step is None:
        sys.exit("torch_gpt2.py: every batch size ran out of memory")

    torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup):
        step(i + 1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(i)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    final_loss = loss.item() if a.steps > 0 else float("nan")

    L, C, T = a.n_layer, a.n_embd, a.seq_len
    tokens_per_s = a.steps * batch * T / elapsed
    flops_per_token = 6 * (L * 12 * C * C + a.vocab * C) + 6 * L * C * T
    device = torch.cuda.get_device_name()
    peak = peak_flops(device)
    mfu = flops_per_token * tokens_per_s / peak if peak else None
    peak_mem = torch.cuda.max_memory_allocated() / 2**30
    compile_s = "off" if a.no_compile else "on"
    mfu_s = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
    print(f"torch  compile={compile_s}  batch={batch}  T={T}  tokens/s={tokens_per_s:.0f}  MFU={mfu_s}  "
          f"peak_mem={peak_mem:.1f}GiB  loss={final_loss:.4g}  device={device}  torch={torch.__version__}")
    if a.json:
        rec = dict(impl="torch", compile=not a.no_compile, batch=batch, seq_len=T,
                   tokens_per_s=tokens_per_s, mfu=mfu, peak_mem_gib=peak_mem, final_loss=final_loss,
                   device=device, torch=torch.__version__, steps=a.steps, warmup=a.warmup)
        with open(a.json, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
