#!/usr/bin/python3
"""PyTorch DDP side of bench/bench_ddp.sh: the model of torch_gpt_bench.py trained with
torch.nn.parallel.DistributedDataParallel over gloo, N processes x 1 thread, each with
global_batch / N sequences per step. Prints one JSON line (rank 0):
  {"impl": "torch-ddp", "tokens_per_s": ..., "ms": [...]}   (global tokens per second)

usage: torch_ddp_bench.py --n-layer 4 --n-embd 256 --n-head 4 --seq 256 --global-batch 8 --ranks 2
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_bench import GPT  # noqa: E402


def worker(rank, a, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(1337)
    model = GPT(a.n_layer, a.n_head, a.n_embd, a.seq, a.vocab)
    for blk in model.h:  # gloo cannot broadcast the bool causal-mask buffer: keep it a plain attribute
        mask = blk._buffers.pop("mask")
        blk.mask = mask
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7 + rank)
    b = a.global_batch // a.ranks
    ms = []
    for s in range(a.warmup + a.steps):
        data = torch.randint(0, 50257, (b, a.seq + 1), generator=g)
        idx, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ddp(idx, tgt).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            ms.append(dt * 1e3)
    if rank == 0:
        med = sorted(ms)[len(ms) // 2]  # gloo step times vary a lot; the median is the fair figure
        tps = a.global_batch * a.seq / (med / 1e3)
        print(json.dumps({"impl": "torch-ddp", "torch": torch.__version__, "ranks": a.ranks,
                          "tokens_per_s": tps, "ms": [round(x, 1) for x in ms]}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("n-layer", "n-embd", "n-head", "seq", "global-batch"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--port", type=int, default=29533)
    a = ap.parse_args()
    mp.spawn(worker, args=(a, a.port), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
