#!/usr/bin/python3
"""PyTorch side of bench/bench_train.sh: GPT-2 training throughput on CPU, fp32.

The same architecture as dtrain (nanoGPT-style: token + position embeddings, pre-LN blocks,
causal attention with a fused c_attn, GELU tanh, MLP 4C, final LN, LM head tied to wte with
the vocabulary padded to a multiple of 64), random tokens, and a full training step: forward,
backward, global-norm clip, AdamW (weight decay on 2-D weights). Prints one JSON line:
  {"impl": "torch", "tokens_per_s": ..., "ms": [...], ...}
tokens_per_s is tokens of the timed steps / their total time (warm-up steps excluded).

usage: torch_gpt_bench.py --n-layer 4 --n-embd 256 --n-head 4 --seq 256 --batch 8 --vocab 50304 \
                          --threads 1 [--warmup 2] [--steps 8]
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, n_head, T):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        nh, hd = self.n_head, C // self.n_head
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, nh, hd).transpose(1, 2)
        k = k.view(B, T, nh, hd).transpose(1, 2)
        v = v.view(B, T, nh, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, C, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, n_head, T) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=50304, help="embedding rows (already padded)")
    ap.add_argument("--real-vocab", type=int, default=50257, help="tokens are drawn below this")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="timed steps")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    model = GPT(a.n_layer, a.n_head, a.n_embd, a.seq, a.vocab)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7)
    ntok = a.batch * a.seq
    ms = []
    loss = float("nan")
    for s in range(a.warmup + a.steps):
        data = torch.randint(0, a.real_vocab, (a.batch, a.seq + 1), generator=g)
        idx, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        lv = model(idx, tgt)
        lv.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = lv.item()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            ms.append(dt * 1e3)
    tps = ntok * len(ms) / (sum(ms) / 1e3)
    print(json.dumps({
        "impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", ""),
        "params": sum(p.numel() for p in model.parameters()), "loss": loss,
        "tokens_per_s": tps, "ms": [round(x, 1) for x in ms],
    }))


if __name__ == "__main__":
    sys.exit(main())
