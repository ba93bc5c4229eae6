#!/usr/bin/python3
"""PyTorch side of bench/bench_llama.sh: Llama training throughput on CPU, fp32.

The Llama architecture as Hugging Face defines it (written here, not imported): token
embedding, pre-norm layers with RMSNorm, q/k/v projections without bias, rotary embeddings
(rotate_half), grouped-query attention (repeat_kv), causal softmax attention (Debian's
torch 1.13 has no scaled_dot_product_attention), o_proj, a SwiGLU MLP, a final
RMSNorm, the head tied to the embedding or its own; random tokens, and a full training step:
forward, backward, global-norm clip, AdamW (weight decay on 2-D weights). Prints one JSON
line: {"impl": "torch", "tokens_per_s": ..., "ms": [...], ...}.

usage: torch_llama_bench.py --n-layer 30 --n-embd 576 --n-head 9 --n-kv-head 3 --inter 1536 \
                            --vocab 49152 --seq 256 --batch 4 --threads 2 [--untied] [--warmup 2] [--steps 5]
"""
import argparse, json, math, os, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(C)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, C, H, KV, I):
        super().__init__()
        self.H, self.KV, self.hd = H, KV, C // H
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C, 1e-5), RMSNorm(C, 1e-5)
        self.q_proj = nn.Linear(C, C, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(C, I, bias=False), nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(self.H // self.KV, dim=1), v.repeat_interleave(self.H // self.KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, C, H, KV, I, V, tied):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([Layer(C, H, KV, I) for _ in range(L)])
        self.norm = RMSNorm(C, 1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        hd = C // H
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))

    def forward(self, idx, targets):
        T = idx.shape[1]
        ang = torch.outer(torch.arange(T).float(), self.inv_freq)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("n-layer", "n-embd", "n-head", "n-kv-head", "inter", "vocab", "seq", "batch", "threads"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    model = Llama(a.n_layer, a.n_embd, a.n_head, a.n_kv_head, a.inter, a.vocab, not a.untied)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7)
    ms, loss = [], float("nan")
    for s in range(a.warmup + a.steps):
        data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        lv = model(data[:, :-1].contiguous(), data[:, 1:].contiguous())
        lv.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = lv.item()
        if s >= a.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "params": sum(p.numel() for p in model.parameters()), "loss": loss,
                      "tokens_per_s": a.batch * a.seq * len(ms) / (sum(ms) / 1e3), "ms": [round(x, 1) for x in ms]}))


if __name__ == "__main__":
    sys.exit(main())
