#!/usr/bin/python3
"""Independent PyTorch reference for dtrain's training step (GPT-2, AdamW).

Written from the model's definition, not from dtrain's code: token + learned position
embeddings, pre-LayerNorm blocks with causal multi-head attention (fused c_attn in the
Hugging Face Conv1D layout, weight[in, out]), GELU (tanh approximation), an MLP of width
4C, a final LayerNorm (eps 1e-5) and an LM head tied to wte. The loss is the mean cross
entropy over every token of the global batch.

It reads the initial weights from a safetensors file written by dtrain (parsed with
struct/json; F32 tensors with Hugging Face names, wte.weight [vocab_size, C] unpadded),
the token file (256 int32 header: magic 20240520, version 1, count; then uint16 tokens),
reproduces dtrain's unshuffled batches (data.shuffle=false), gradient accumulation,
global-norm clipping, the warmup + cosine schedule and torch.optim.AdamW with weight decay
on 2-D weights only, and writes per-step loss and pre-clip gradient norm as JSON:

  {"config": {...}, "steps": [{"step": 1, "loss": ..., "grad_norm": ..., "lr": ...}, ...]}

Runs in float64 by default so it is a true reference for dtrain's fp32 numbers.

usage: gpt2_reference.py --config tiny_config.json --init tiny_init.safetensors \
                         --tokens c_train.bin [--steps N] [--dtype float64|float32] [--out F]
"""
import argparse
import hashlib
import json
import math
import struct
import sys

import torch

# dtrain's defaults for the keys the reference uses (src/core/config.c), so a config file
# that leaves a key out means the same thing here as there.
DEFAULTS = {
    "model.n_layer": 4, "model.n_head": 4, "model.n_embd": 256, "model.seq_len": 128, "model.vocab_size": 256,
    "data.shuffle": True,
    "train.steps": 600, "train.seq_len": 0, "train.micro_batch": 16, "train.global_batch": 0,
    "train.lr": 1e-3, "train.min_lr": 1e-4, "train.warmup_steps": 30, "train.weight_decay": 0.1,
    "train.beta1": 0.9, "train.beta2": 0.95, "train.eps": 1e-8, "train.grad_clip": 1.0,
    "parallel.sync": "every_step", "parallel.sync_every": 1, "parallel.outer_lr": 0.7, "parallel.outer_momentum": 0.9,
    "parallel.staleness": 0, "parallel.dp_mode": "ddp", "parallel.dp_shard": 0,
    "parallel.staleness_lr": "constant",
}


def flatten(node, prefix=""):
    out = {}
    for k, v in node.items():
        path = prefix + "." + k if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, path))
        else:
            out[path] = v
    return out


def load_config(path, overrides):
    with open(path) as f:
        flat = flatten(json.load(f))
    cfg = dict(DEFAULTS)
    for k in DEFAULTS:
        if k in flat:
            cfg[k] = flat[k]
    for k, v in overrides.items():
        cfg[k] = v
    if cfg["data.shuffle"]:
        sys.exit("gpt2_reference: the reference reproduces data.shuffle=false only; set it in the config")
    return cfg


# ---- files ----

def read_safetensors(path):
    """{name: float64 numpy-free torch tensor} from a safetensors file (F32 only)."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = memoryview(blob)[8 + hlen:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit("gpt2_reference: %s: tensor %s has dtype %s, expected F32" % (path, name, info["dtype"]))
        b, e = info["data_offsets"]
        shape = info["shape"]
        n = 1
        for d in shape:
            n *= d
        if e - b != 4 * n:
            sys.exit("gpt2_reference: %s: tensor %s has %d bytes for shape %s" % (path, name, e - b, shape))
        vals = struct.unpack_from("<%df" % n, data, b)
        tensors[name] = torch.tensor(vals, dtype=torch.float64).reshape(shape)
    return tensors


def read_tokens(path):
    with open(path, "rb") as f:
        blob = f.read()
    header = struct.unpack_from("<256i", blob, 0)
    if header[0] != 20240520 or header[1] not in (1, 3):
        sys.exit("gpt2_reference: %s: bad token file header (magic %d, version %d)" % (path, header[0], header[1]))
    count = header[2]
    width = 2 if header[1] == 1 else header[6]  # version 3: documents, their starts and mask after the ids
    tail = 0 if header[1] == 1 else 8 * (header[7] + 1) + (count if header[8] & 1 else 0)
    if len(blob) != 1024 + width * count + tail:
        sys.exit("gpt2_reference: %s: size %d does not match count %d" % (path, len(blob), count))
    return list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), blob, 1024))


# ---- model ----

def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward_loss_sum(p, idx, targets, n_layer, n_head):
    """Sum over all B*T positions of the cross-entropy loss."""
    B, T = idx.shape
    C = p["wte.weight"].shape[1]
    hd = C // n_head
    x = p["wte.weight"][idx] + p["wpe.weight"][:T].unsqueeze(0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(n_layer):
        pre = "h.%d." % l
        h = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
        qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]  # Conv1D: weight[in, out]
        q, k, v = qkv.split(C, dim=-1)
        q = q.reshape(B, T, n_head, hd).transpose(1, 2)
        k = k.reshape(B, T, n_head, hd).transpose(1, 2)
        v = v.reshape(B, T, n_head, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"])
        h = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
        f = gelu_tanh(h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"])
        x = x + (f @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"])
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ p["wte.weight"].t()  # tied head, [B, T, vocab_size]
    logits = logits.reshape(B * T, -1)
    tgt = targets.reshape(B * T)
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, tgt.unsqueeze(1)).squeeze(1)
    return (lse - picked).sum()


def is_decayed(name, tensor):
    """Weight decay on 2-D weights only (wte, wpe, c_attn/c_proj/c_fc weights)."""
    return tensor.dim() == 2


def lr_at(cfg, s):
    lr, min_lr, warmup, steps = cfg["train.lr"], cfg["train.min_lr"], cfg["train.warmup_steps"], cfg["train.steps"]
    if s < warmup:
        return lr * (s + 1) / warmup
    if steps - warmup <= 0:
        return lr
    progress = min(1.0, (s - warmup) / (steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def run(cfg, init_path, tokens_path, nsteps, dtype, replicas=1):
    n_layer, n_head = cfg["model.n_layer"], cfg["model.n_head"]
    C, V = cfg["model.n_embd"], cfg["model.vocab_size"]
    assert C % n_head == 0

    raw = read_safetensors(init_path)
    expect = {"wte.weight": [V, C], "wpe.weight": [cfg["model.seq_len"], C],
              "ln_f.weight": [C], "ln_f.bias": [C]}
    for l in range(n_layer):
        pre = "h.%d." % l
        expect.update({pre + "ln_1.weight": [C], pre + "ln_1.bias": [C],
                       pre + "attn.c_attn.weight": [C, 3 * C], pre + "attn.c_attn.bias": [3 * C],
                       pre + "attn.c_proj.weight": [C, C], pre + "attn.c_proj.bias": [C],
                       pre + "ln_2.weight": [C], pre + "ln_2.bias": [C],
                       pre + "mlp.c_fc.weight": [C, 4 * C], pre + "mlp.c_fc.bias": [4 * C],
                       pre + "mlp.c_proj.weight": [4 * C, C], pre + "mlp.c_proj.bias": [C]})
    if set(raw) != set(expect):
        sys.exit("gpt2_reference: %s: tensor names differ from the config's model (missing %s, extra %s)"
                 % (init_path, sorted(set(expect) - set(raw))[:5], sorted(set(raw) - set(expect))[:5]))
    for name, shape in expect.items():
        if list(raw[name].shape) != shape:
            sys.exit("gpt2_reference: %s: %s has shape %s, expected %s" % (init_path, name, list(raw[name].shape), shape))
    params = {name: t.to(dtype).clone().requires_grad_(True) for name, t in sorted(raw.items())}
    tokens = read_tokens(tokens_path)
    if max(tokens) >= V:
        sys.exit("gpt2_reference: token %d >= vocab_size %d" % (max(tokens), V))
    loss_sum = lambda p, idx, tgt: forward_loss_sum(p, idx, tgt, n_layer, n_head)
    return train(cfg, params, tokens, nsteps, loss_sum, dtype, replicas), len(tokens)


def train(cfg, params, tokens, nsteps, loss_sum_fn, dtype, replicas=1):
    """The training loop both references share: dtrain's unshuffled batches (whole
    windows of T + 1 tokens, a new epoch when a global batch no longer fits), gradient
    accumulation over micro-batches, the pre-clip global norm, clipping, the schedule and
    AdamW with weight decay on 2-D weights. loss_sum_fn(params, idx, targets) is the
    model: the sum of the micro-batch's per-token losses. Returns the per-step records.

    With replicas R > 1 and parallel.sync local_sgd or diloco (sync_every H > 1 for
    local_sgd): local SGD / DiLoCo as the literature states it. Each replica r trains
    alone with its own AdamW on its share of every global batch (micro-batch k of the
    step: sequences (k R + r) micro ...), its gradient the mean over its own tokens,
    clipped by its own norm; after every H steps and the last one the replicas' change
    delta = theta_sync - theta_r is averaged and the outer step (local_sgd: theta_sync -=
    mean; diloco: Nesterov, m = mu m + mean, theta_sync -= lr (mean + mu m)) gives every
    replica theta_sync. The record's loss is over the whole global batch, its grad_norm
    replica 0's.

    With parallel.staleness s > 0 (one replica): delayed SGD. Step t's gradients are
    computed at the current weights and queued; the update at step t applies step t - s's
    (clipped by their own norm, the lr of step t; AdamW counts the updates it applies),
    and the first s steps update nothing. The record's grad_norm is step t's."""
    if cfg["parallel.dp_mode"] == "ps-async" and cfg["parallel.staleness"] > 0:
        return train_ps_async(cfg, params, tokens, nsteps, loss_sum_fn, dtype, replicas)
    T = cfg["train.seq_len"] or cfg["model.seq_len"]
    micro = cfg["train.micro_batch"]
    gb = cfg["train.global_batch"] or micro
    assert gb % micro == 0, "global_batch must be a multiple of micro_batch"
    tok = torch.tensor(tokens, dtype=torch.long)
    nseq = (len(tokens) - 1) // T
    if nseq < gb:
        sys.exit("reference: %d sequences < global batch %d" % (nseq, gb))
    sync, H = cfg["parallel.sync"], cfg["parallel.sync_every"]
    local = replicas > 1 and (sync == "diloco" or (sync == "local_sgd" and H > 1))
    # replicas: dtrain's dp ranks; under local SGD, groups of parallel.dp_shard of them
    # (default 1) are one replica each, training on their ranks' rows together (DDP)
    D = replicas if local else 1
    K = (cfg["parallel.dp_shard"] or 1) if local else 1
    assert D % K == 0, "dp_shard must divide the ranks"
    R = D // K  # synchronous: one replica's view of the whole batch (DDP's average)
    assert gb % (micro * D) == 0, "global_batch must split into the ranks' micro-batches"

    names = sorted(params)
    reps = [params] if R == 1 else [{n: params[n].detach().clone().requires_grad_(True) for n in names}
                                    for _ in range(R)]

    def adamw(p):
        decay = [p[n] for n in names if is_decayed(n, p[n])]
        no_decay = [p[n] for n in names if not is_decayed(n, p[n])]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg["train.weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg["train.lr"], betas=(cfg["train.beta1"], cfg["train.beta2"]), eps=cfg["train.eps"])
    opts = [adamw(p) for p in reps]
    stale = cfg["parallel.staleness"]
    assert stale == 0 or R == 1, "staleness with local SGD"
    queue = []
    clip = cfg["train.grad_clip"]
    if R > 1:
        theta = {n: params[n].detach().clone() for n in names}
        mom = {n: torch.zeros_like(theta[n]) for n in names}

    pos, epoch = 0, 0
    out = []
    for s in range(nsteps):
        if pos + gb > nseq:  # drop the partial batch, new epoch
            pos, epoch = 0, epoch + 1
        batch = list(range(pos, pos + gb))
        pos += gb
        lr = lr_at(cfg, s)
        loss_sum = 0.0
        norms = []
        for r, (p, opt) in enumerate(zip(reps, opts)):
            rows = batch if R == 1 else [batch[(k * D + q) * micro + j] for k in range(gb // (micro * D))
                                         for q in range(r * K, r * K + K) for j in range(micro)]
            for prm in p.values():
                prm.grad = None
            scale = 1.0 / (len(rows) * T)
            for k in range(0, len(rows), micro):
                seqs = rows[k:k + micro]
                win = torch.stack([tok[i * T:i * T + T + 1] for i in seqs])
                ls = loss_sum_fn(p, win[:, :T], win[:, 1:])
                (ls * scale).backward()
                loss_sum += ls.item()
            grads = [p[n].grad for n in names]
            norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
            norms.append(norm)
            if stale:
                queue.append([g.clone() for g in grads])
                if len(queue) <= stale:
                    continue  # nothing s steps old yet: no update
                for n, g in zip(names, queue.pop(0)):
                    p[n].grad = g
                grads = [p[n].grad for n in names]
                norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
            if clip > 0:
                # torch's rule: coef = clip / (norm + 1e-6), applied when < 1; it returns the pre-clip norm
                tnorm = float(torch.nn.utils.clip_grad_norm_([p[n] for n in names], clip))
                assert abs(tnorm - norm) <= (1e-9 if dtype == torch.float64 else 1e-5) * max(1.0, norm), (tnorm, norm)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
        if R > 1 and ((s + 1) % H == 0 or s + 1 == cfg["train.steps"]):
            lr_o, mu = cfg["parallel.outer_lr"], cfg["parallel.outer_momentum"]
            with torch.no_grad():
                for n in names:
                    d = sum(theta[n] - p[n] for p in reps) / R
                    if sync == "diloco":
                        mom[n] = mu * mom[n] + d
                        theta[n] -= lr_o * (d + mu * mom[n])
                    else:
                        theta[n] -= d
                    for p in reps:
                        p[n].copy_(theta[n])
        norm = norms[0]
        rec = {"step": s + 1, "loss": loss_sum / (gb * T), "grad_norm": norm, "lr": lr,
               "clipped": bool(clip > 0 and clip / (norm + 1e-6) < 1.0), "epoch": epoch}
        out.append(rec)
        print("step %3d | loss %.9f | grad_norm %.9f | lr %.6g%s" % (
            rec["step"], rec["loss"], rec["grad_norm"], lr, " | clipped" if rec["clipped"] else ""), file=sys.stderr)
    return out


def train_ps_async(cfg, params, tokens, nsteps, loss_sum_fn, dtype, N):
    """The asynchronous parameter server's fixed order (dp_mode ps-async, staleness s,
    bitwise determinism) as delayed SGD over tasks: N tasks per global batch, task k the
    rows data-parallel rank k mod N gets in step k // N; its gradient (the mean over its
    tokens) is computed at the weights after max(0, k - s) updates and applied as update k
    (clipped by its own norm, the lr of its step, AdamW counting updates). A record per
    global step: the loss over its N tasks, the last update's grad_norm."""
    T = cfg["train.seq_len"] or cfg["model.seq_len"]
    micro = cfg["train.micro_batch"]
    gb = cfg["train.global_batch"] or micro
    assert gb % (micro * N) == 0, "global_batch must split into the ranks' micro-batches"
    tok = torch.tensor(tokens, dtype=torch.long)
    nseq = (len(tokens) - 1) // T
    s = cfg["parallel.staleness"]
    names = sorted(params)
    decay = [params[n] for n in names if is_decayed(n, params[n])]
    no_decay = [params[n] for n in names if not is_decayed(n, params[n])]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["train.weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["train.lr"], betas=(cfg["train.beta1"], cfg["train.beta2"]), eps=cfg["train.eps"])
    clip = cfg["train.grad_clip"]
    history = [{n: params[n].detach().clone() for n in names}]  # weights after 0, 1, ... updates
    pos, epoch, out = 0, 0, []
    for st in range(nsteps):
        if pos + gb > nseq:
            pos, epoch = 0, epoch + 1
        batch = list(range(pos, pos + gb))
        pos += gb
        lr = lr_at(cfg, st)
        loss_sum = 0.0
        for share in range(N):
            k = st * N + share
            w = {n: history[max(0, k - s)][n].clone().requires_grad_(True) for n in names}
            rows = [batch[(kk * N + share) * micro + j] for kk in range(gb // (micro * N)) for j in range(micro)]
            scale = 1.0 / (len(rows) * T)
            for i in range(0, len(rows), micro):
                win = torch.stack([tok[q * T:q * T + T + 1] for q in rows[i:i + micro]])
                ls = loss_sum_fn(w, win[:, :T], win[:, 1:])
                (ls * scale).backward()
                loss_sum += ls.item()
            for n in names:
                params[n].grad = w[n].grad
            norm = math.sqrt(sum(float((params[n].grad.double() ** 2).sum()) for n in names))
            if clip > 0:
                torch.nn.utils.clip_grad_norm_([params[n] for n in names], clip)
            stale = k - max(0, k - s)  # updates between its weights and its application
            inverse = cfg["parallel.staleness_lr"] == "inverse" and stale > 1
            used = lr / stale if inverse else lr  # the last update's is reported, as dtrain does
            for g in opt.param_groups:
                g["lr"] = used
            opt.step()
            history.append({n: params[n].detach().clone() for n in names})
            if len(history) > s + 2:
                history[len(history) - s - 3] = None  # no longer read
        rec = {"step": st + 1, "loss": loss_sum / (gb * T), "grad_norm": norm, "lr": used,
               "clipped": bool(clip > 0 and clip / (norm + 1e-6) < 1.0), "epoch": epoch}
        out.append(rec)
        print("step %3d | loss %.9f | grad_norm %.9f | lr %.6g" % (rec["step"], rec["loss"], norm, used), file=sys.stderr)
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="dtrain JSON config")
    ap.add_argument("--init", required=True, help="initial weights (safetensors written by dtrain)")
    ap.add_argument("--tokens", required=True, help="training token file")
    ap.add_argument("--steps", type=int, default=None, help="steps to run (default: train.steps)")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--out", default="-", help="output JSON (default stdout)")
    ap.add_argument("--replicas", type=int, default=1,
                    help="data-parallel replicas (dtrain's dp): local SGD / DiLoCo train them apart")
    a = ap.parse_args()

    torch.manual_seed(0)  # nothing random is drawn; set for good measure
    cfg = load_config(a.config, {})
    nsteps = a.steps if a.steps is not None else cfg["train.steps"]
    dtype = torch.float64 if a.dtype == "float64" else torch.float32
    steps, ntok = run(cfg, a.init, a.tokens, nsteps, dtype, a.replicas)
    doc = {
        "config": dict(cfg, **{"dtype": a.dtype, "steps_run": nsteps, "token_count": ntok, "replicas": a.replicas,
                               "init_sha256": sha256(a.init), "torch": torch.__version__}),
        "steps": steps,
    }
    text = json.dumps(doc, indent=1) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
