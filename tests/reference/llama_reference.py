#!/usr/bin/python3
"""Independent PyTorch reference for dtrain's Llama family (training steps with AdamW).

Written from Hugging Face's published LlamaForCausalLM architecture (modeling_llama.py,
as documented), not from dtrain's code: token embedding, pre-norm decoder layers with
RMSNorm (x * rsqrt(mean(x^2) + eps) * w), self-attention with separate q/k/v projections
(nn.Linear weights [out, in]; optional q/k/v biases as in Qwen2), rotary embeddings in
the rotate_half convention (inv_freq = theta^(-2i/d), Llama 3's frequency scaling when
rope_scaling is set), grouped-query attention by repeat_kv, causal softmax attention,
o_proj, a SwiGLU MLP (down(silu(gate(x)) * up(x))), a final RMSNorm and the LM head
(lm_head.weight, or the embedding when tie_word_embeddings). The loss is the mean cross
entropy over every token of the global batch.

The data, the schedule, clipping and AdamW are gpt2_reference.py's train() (the training
loop is the same for both families). Writes per-step loss and pre-clip gradient norm as JSON.

usage: llama_reference.py --config C.json --init init.safetensors --tokens c_train.bin
                          [--steps N] [--dtype float64|float32] [--out F]
       llama_reference.py --config C.json --hf DIR --tokens c_train.bin ...
With --hf the model comes from a Hugging Face directory as transformers reads it
(config.json's LlamaConfig/Qwen2Config keys, model.safetensors): what `dtrain export`
writes; the training keys still come from --config.
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as g2  # noqa: E402  (files, schedule, loop helpers)

LLAMA_DEFAULTS = {"model.family": "gpt2", "model.n_kv_head": 0, "model.intermediate_size": 0,
                  "model.rope_theta": 10000.0, "model.norm_eps": 1e-5, "model.tie_embeddings": True,
                  "model.qkv_bias": False, "model.rope_factor": 0.0, "model.rope_low_freq": 1.0,
                  "model.rope_high_freq": 4.0, "model.rope_original_max": 8192}


def load_config(path):
    g2.DEFAULTS.update(LLAMA_DEFAULTS)
    cfg = g2.load_config(path, {})
    if cfg["model.family"] != "llama":
        sys.exit("llama_reference: %s: model.family is not llama" % path)
    C, H = cfg["model.n_embd"], cfg["model.n_head"]
    cfg["model.n_kv_head"] = cfg["model.n_kv_head"] or H
    cfg["model.intermediate_size"] = cfg["model.intermediate_size"] or (8 * C // 3 + 255) // 256 * 256
    return cfg


def hf_config(cfg, d):
    """The model keys from a Hugging Face config.json (LlamaConfig / Qwen2Config)."""
    j = json.load(open(os.path.join(d, "config.json")))
    assert j["model_type"] in ("llama", "qwen2"), j["model_type"]
    assert j.get("hidden_act", "silu") == "silu"
    cfg = dict(cfg)
    cfg.update({"model.n_embd": j["hidden_size"], "model.n_layer": j["num_hidden_layers"],
                "model.n_head": j["num_attention_heads"],
                "model.n_kv_head": j.get("num_key_value_heads", j["num_attention_heads"]),
                "model.intermediate_size": j["intermediate_size"], "model.vocab_size": j["vocab_size"],
                "model.rope_theta": j.get("rope_theta", 10000.0), "model.norm_eps": j["rms_norm_eps"],
                "model.tie_embeddings": j.get("tie_word_embeddings", True),
                "model.qkv_bias": j["model_type"] == "qwen2" or j.get("attention_bias", False),
                "model.rope_factor": 0.0})
    rs = j.get("rope_scaling")
    if rs:
        assert rs.get("rope_type", rs.get("type")) == "llama3"
        cfg.update({"model.rope_factor": rs["factor"], "model.rope_low_freq": rs["low_freq_factor"],
                    "model.rope_high_freq": rs["high_freq_factor"],
                    "model.rope_original_max": rs["original_max_position_embeddings"]})
    return cfg


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def inv_freq(cfg, dim, dtype):
    # HF: 1 / base^(arange(0, dim, 2) / dim), in float32
    f = 1.0 / (cfg["model.rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if cfg["model.rope_factor"] > 0:  # HF's _compute_llama3_parameters
        factor, lo, hi = cfg["model.rope_factor"], cfg["model.rope_low_freq"], cfg["model.rope_high_freq"]
        old = cfg["model.rope_original_max"]
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / f
        f_llama = torch.where(wavelen > low_wavelen, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * f_llama / factor + smooth * f_llama
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        f = torch.where(medium, smoothed, f_llama)
    return f.to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward_loss_sum(p, cfg, idx, targets, freqs):
    B, T = idx.shape
    C, H, KV = cfg["model.n_embd"], cfg["model.n_head"], cfg["model.n_kv_head"]
    hd, eps = C // H, cfg["model.norm_eps"]
    pos = torch.arange(T, dtype=freqs.dtype)
    ang = torch.outer(pos, freqs)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = p["model.embed_tokens.weight"][idx]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    lin = lambda v, name: v @ p[name + ".weight"].t() + (p[name + ".bias"] if name + ".bias" in p else 0)
    for l in range(cfg["model.n_layer"]):
        pre = "model.layers.%d." % l
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = lin(h, pre + "self_attn.q_proj").view(B, T, H, hd).transpose(1, 2)
        k = lin(h, pre + "self_attn.k_proj").view(B, T, KV, hd).transpose(1, 2)
        v = lin(h, pre + "self_attn.v_proj").view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + lin(y, pre + "self_attn.o_proj")
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        f = torch.nn.functional.silu(lin(h, pre + "mlp.gate_proj")) * lin(h, pre + "mlp.up_proj")
        x = x + lin(f, pre + "mlp.down_proj")
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["model.tie_embeddings"] else p["lm_head.weight"]
    logits = (x @ head.t()).reshape(B * T, -1)
    tgt = targets.reshape(B * T)
    return (torch.logsumexp(logits, dim=-1) - logits.gather(1, tgt.unsqueeze(1)).squeeze(1)).sum()


def expected_shapes(cfg):
    C, V, I = cfg["model.n_embd"], cfg["model.vocab_size"], cfg["model.intermediate_size"]
    kv = cfg["model.n_kv_head"] * (C // cfg["model.n_head"])
    e = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    if not cfg["model.tie_embeddings"]:
        e["lm_head.weight"] = [V, C]
    for l in range(cfg["model.n_layer"]):
        pre = "model.layers.%d." % l
        e.update({pre + "input_layernorm.weight": [C], pre + "post_attention_layernorm.weight": [C],
                  pre + "self_attn.q_proj.weight": [C, C], pre + "self_attn.k_proj.weight": [kv, C],
                  pre + "self_attn.v_proj.weight": [kv, C], pre + "self_attn.o_proj.weight": [C, C],
                  pre + "mlp.gate_proj.weight": [I, C], pre + "mlp.up_proj.weight": [I, C],
                  pre + "mlp.down_proj.weight": [C, I]})
        if cfg["model.qkv_bias"]:
            e.update({pre + "self_attn.q_proj.bias": [C], pre + "self_attn.k_proj.bias": [kv],
                      pre + "self_attn.v_proj.bias": [kv]})
    return e


def run(cfg, init_path, tokens_path, nsteps, dtype):
    raw = g2.read_safetensors(init_path)
    expect = expected_shapes(cfg)
    if set(raw) != set(expect):
        sys.exit("llama_reference: %s: tensor names differ (missing %s, extra %s)"
                 % (init_path, sorted(set(expect) - set(raw))[:5], sorted(set(raw) - set(expect))[:5]))
    for name, shape in expect.items():
        if list(raw[name].shape) != shape:
            sys.exit("llama_reference: %s has shape %s, expected %s" % (name, list(raw[name].shape), shape))
    params = {name: t.to(dtype).clone().requires_grad_(True) for name, t in sorted(raw.items())}
    freqs = inv_freq(cfg, cfg["model.n_embd"] // cfg["model.n_head"], dtype)
    tokens = g2.read_tokens(tokens_path)
    loss_sum = lambda p, idx, tgt: forward_loss_sum(p, cfg, idx, tgt, freqs)
    return g2.train(cfg, params, tokens, nsteps, loss_sum, dtype), len(tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--init", help="initial weights (safetensors with Hugging Face names)")
    ap.add_argument("--hf", help="a Hugging Face model directory instead of --init and the config's model keys")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    cfg = load_config(a.config)
    if a.hf:
        cfg = hf_config(cfg, a.hf)
        a.init = os.path.join(a.hf, "model.safetensors")
    if not a.init:
        sys.exit("llama_reference: --init or --hf is required")
    nsteps = a.steps if a.steps is not None else cfg["train.steps"]
    steps, ntok = run(cfg, a.init, a.tokens, nsteps, torch.float64 if a.dtype == "float64" else torch.float32)
    doc = {"config": dict(cfg, **{"dtype": a.dtype, "steps_run": nsteps, "token_count": ntok,
                                  "init_sha256": g2.sha256(a.init), "torch": torch.__version__}), "steps": steps}
    text = json.dumps(doc, indent=1) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
