"""Standard-library-only checks of a `dtrain export` directory (used by tests/test_export.sh).

The forward pass is written from Hugging Face transformers' GPT-2 semantics, not from dtrain's
code, and reads only the export (config.json + model.safetensors): Conv1D y = x @ W + b,
LayerNorm with config.layer_norm_epsilon, causal attention scaled by 1/sqrt(head_dim), the
activation named by config.activation_function, pre-LN blocks, final ln_f, LM head tied to
wte. float64 throughout.

  python3 hf_gpt2.py config  OUT KEY=VALUE...       config.json fields (VALUE is JSON)
  python3 hf_gpt2.py header  OUT                    safetensors names/shapes/dtypes/layout
  python3 hf_gpt2.py same    OUT CKPT_STEP_DIR      every tensor's bytes equal the checkpoint's (sharded: its index's files)
  python3 hf_gpt2.py loss    OUT TOKENS.bin N T LOSS [gelu|eps]   mean loss of windows 0..N-1 vs LOSS
  python3 hf_gpt2.py scale   IN.safetensors OUT.safetensors SUFFIX=FACTOR...
  python3 hf_gpt2.py hubify  IN.safetensors OUT.safetensors plain|prefixed
                                                    as the hub's file (mask buffers) or save_pretrained's
  python3 hf_gpt2.py greedy  OUT IDS N SAMPLE_OUT PROMPT_BYTES [vocab.json]
                                                    dtrain sample's N greedy tokens after IDS
"""
import json, zlib
import math
import operator
import os
import struct
import sys


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:], n


def expected_shapes(cfg):
    C, V, P = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    want = {"wte.weight": [V, C], "wpe.weight": [P, C], "ln_f.weight": [C], "ln_f.bias": [C]}
    for i in range(cfg["n_layer"]):
        for k, s in {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C],
                     "attn.c_attn.bias": [3 * C], "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C],
                     "ln_2.weight": [C], "ln_2.bias": [C], "mlp.c_fc.weight": [C, 4 * C],
                     "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [4 * C, C], "mlp.c_proj.bias": [C]}.items():
            want["h.%d.%s" % (i, k)] = s
    return want


def load_config(out):
    with open(os.path.join(out, "config.json")) as f:
        return json.load(f)


def check_config(out, pairs):
    cfg = load_config(out)
    bad = []
    for p in pairs:
        k, v = p.split("=", 1)
        if k not in cfg or cfg[k] != json.loads(v):
            bad.append("%s: %r, want %s" % (k, cfg.get(k, "<missing>"), v))
    assert not bad, "; ".join(bad)


def check_header(out):
    cfg = load_config(out)
    hdr, data, n = read_st(os.path.join(out, "model.safetensors"))
    meta = hdr.pop("__metadata__", None) or {}
    # format pt, and dtrain's checksum of each tensor (zlib's CRC-32 of its bytes)
    crcs = {"crc32." + k: "%08x" % zlib.crc32(data[e["data_offsets"][0]:e["data_offsets"][1]]) for k, e in hdr.items()}
    assert meta == dict(crcs, format="pt"), "metadata must be format pt and each tensor's crc32"
    want = expected_shapes(cfg)
    assert set(hdr) == set(want), "names differ: extra %s, missing %s" % (
        sorted(set(hdr) - set(want))[:5], sorted(set(want) - set(hdr))[:5])
    for k, e in hdr.items():
        assert e["dtype"] == "F32", (k, e["dtype"])
        assert e["shape"] == want[k], (k, e["shape"], want[k])
    spans = sorted(tuple(e["data_offsets"]) for e in hdr.values())
    pos = 0
    for b, e in spans:  # packed, no gaps or overlaps, as safetensors' loader requires
        assert b == pos, "gap or overlap at byte %d" % b
        pos = e
    assert pos == len(data), "data section %d bytes, tensors end at %d" % (len(data), pos)
    assert (8 + n) % 8 == 0, "data not 8-byte aligned"
    for k, e in hdr.items():
        b, end = e["data_offsets"]
        assert end - b == 4 * math.prod(e["shape"]), k
    print("%d tensors, %d bytes of data" % (len(hdr), len(data)))


def read_tensors(d):
    """name -> (shape, bytes) of d/model.safetensors, or of the shards its
    model.safetensors.index.json maps (a sharded checkpoint, as transformers reads it)."""
    single, index = os.path.join(d, "model.safetensors"), os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(single) or not os.path.exists(index):
        files = {"model.safetensors": None}
    else:
        files = {}
        for name, f in json.load(open(index))["weight_map"].items():
            files.setdefault(f, set()).add(name)
    out = {}
    for f, names in files.items():
        h, data, _ = read_st(os.path.join(d, f))
        h.pop("__metadata__", None)
        assert names is None or set(h) == names, "%s holds %s, the index maps %s" % (f, sorted(h), sorted(names))
        for k, e in h.items():
            assert k not in out, "tensor %s in two files" % k
            b, end = e["data_offsets"]
            out[k] = (e["shape"], data[b:end])
    return out


def check_same(out, step_dir):
    t1, t2 = read_tensors(out), read_tensors(step_dir)
    assert set(t1) == set(t2), "tensor names differ from the checkpoint's"
    for k in t1:
        assert t1[k][0] == t2[k][0], k
        assert t1[k][1] == t2[k][1], "tensor %s differs from the checkpoint's" % k


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class GPT2:
    """transformers' GPT2LMHeadModel forward, eval mode (dropout off), float64."""

    def __init__(self, out):
        cfg = load_config(out)
        self.cfg = cfg
        assert cfg["model_type"] == "gpt2" and cfg.get("tie_word_embeddings", True)
        assert cfg.get("scale_attn_weights", True) and not cfg.get("scale_attn_by_inverse_layer_idx", False)
        act = cfg["activation_function"]
        if act in ("gelu_new", "gelu_pytorch_tanh"):
            self.act = lambda x: 0.5 * x * (1.0 + math.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
        elif act == "gelu":
            self.act = lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))
        else:
            raise AssertionError("activation %s" % act)
        self.eps = cfg["layer_norm_epsilon"]
        self.L, self.H, self.C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
        hdr, data, _ = read_st(os.path.join(out, "model.safetensors"))
        self.w = {}
        for k, e in hdr.items():
            if k == "__metadata__":
                continue
            b, end = e["data_offsets"]
            vals = list(struct.unpack("<%df" % ((end - b) // 4), data[b:end]))
            if len(e["shape"]) == 2:
                r, c = e["shape"]
                vals = [vals[i * c:(i + 1) * c] for i in range(r)]
            self.w[k] = vals
        self.wT = {}  # Conv1D weights [in, out] by output column, for dot products

    def conv1d(self, x, name):  # x: rows of length in; W [in, out]; y = x @ W + b
        if name not in self.wT:
            self.wT[name] = [list(col) for col in zip(*self.w[name + ".weight"])]
        cols, b = self.wT[name], self.w[name + ".bias"]
        return [[bj + sum(map(operator.mul, row, col)) for col, bj in zip(cols, b)] for row in x]

    def layernorm(self, x, name):
        g, b = self.w[name + ".weight"], self.w[name + ".bias"]
        out = []
        for row in x:
            m = sum(row) / len(row)
            v = sum((a - m) ** 2 for a in row) / len(row)
            r = 1.0 / math.sqrt(v + self.eps)
            out.append([(a - m) * r * gi + bi for a, gi, bi in zip(row, g, b)])
        return out

    def attention(self, x, i):
        C, H = self.C, self.H
        hs = C // H
        qkv = self.conv1d(x, "h.%d.attn.c_attn" % i)
        T = len(x)
        y = [[0.0] * C for _ in range(T)]
        for h in range(H):
            q = [r[h * hs:(h + 1) * hs] for r in qkv]
            k = [r[C + h * hs:C + (h + 1) * hs] for r in qkv]
            v = [r[2 * C + h * hs:2 * C + (h + 1) * hs] for r in qkv]
            for t in range(T):
                s = [sum(map(operator.mul, q[t], k[u])) / math.sqrt(hs) for u in range(t + 1)]  # causal
                mx = max(s)
                e = [math.exp(a - mx) for a in s]
                z = sum(e)
                for d in range(hs):
                    y[t][h * hs + d] = sum(e[u] * v[u][d] for u in range(t + 1)) / z
        return self.conv1d(y, "h.%d.attn.c_proj" % i)

    def hidden(self, ids):
        wte, wpe = self.w["wte.weight"], self.w["wpe.weight"]
        x = [[a + b for a, b in zip(wte[t], wpe[p])] for p, t in enumerate(ids)]
        for i in range(self.L):
            a = self.attention(self.layernorm(x, "h.%d.ln_1" % i), i)
            x = [[p + q for p, q in zip(r, s)] for r, s in zip(x, a)]
            f = self.conv1d(self.layernorm(x, "h.%d.ln_2" % i), "h.%d.mlp.c_fc" % i)
            f = self.conv1d([[self.act(a) for a in r] for r in f], "h.%d.mlp.c_proj" % i)
            x = [[p + q for p, q in zip(r, s)] for r, s in zip(x, f)]
        return self.layernorm(x, "ln_f")

    def logits(self, row):  # lm_head.weight is wte.weight (tied)
        return [sum(map(operator.mul, row, w)) for w in self.w["wte.weight"]]


def read_tokens(path):  # token file: 256 int32 header (magic, version, count), then the ids
    with open(path, "rb") as f:
        raw = f.read()
    h = struct.unpack("<256i", raw[:1024])
    magic, version, count = h[:3]
    assert magic == 20240520 and version in (1, 3), path  # 3: documents (ids of h[6] bytes, then their tail)
    width = 2 if version == 1 else h[6]
    return list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), raw[1024:1024 + width * count]))


def mean_loss(m, toks, nwin, T):
    total, n = 0.0, 0
    for w in range(nwin):  # dtrain's validation: window w = tokens [w*T, w*T+T], targets shifted by one
        ids, tgt = toks[w * T:w * T + T], toks[w * T + 1:w * T + T + 1]
        for row, t in zip(m.hidden(ids), tgt):
            lg = m.logits(row)
            mx = max(lg)
            total += mx + math.log(sum(math.exp(a - mx) for a in lg)) - lg[t]
            n += 1
    return total / n


LOSS_TOL = 1e-5  # dtrain computes in float32; observed differences are ~1e-7


def check_loss(out, tokfile, nwin, T, want, variant=None):
    """Mean loss of windows 0..nwin-1 equals dtrain's. variant "gelu" (the erf GELU instead of
    gelu_new) or "eps" (LayerNorm eps 1e-6): also show that at these weights the check would
    catch that mistake (the variant misses dtrain's loss by more than 10x the tolerance)."""
    m = GPT2(out)
    toks = read_tokens(tokfile)
    got = mean_loss(m, toks, nwin, T)
    print("python float64 loss %.9f, dtrain val_loss %.9f, diff %.2e" % (got, want, abs(got - want)))
    assert abs(got - want) < LOSS_TOL, "loss differs"
    if variant == "gelu":
        m.act = lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))
    elif variant == "eps":
        m.eps = 1e-6
    if variant:
        d = abs(mean_loss(m, toks, nwin, T) - want)
        print("with the %s variant the diff would be %.2e" % (variant, d))
        assert d > 10 * LOSS_TOL, "these weights cannot tell %s variants apart" % variant


def scale_weights(src, dst, factors):
    """Copies a safetensors file, multiplying the named tensors (name suffix=factor)."""
    hdr, data, n = read_st(src)
    data = bytearray(data)
    for k, e in hdr.items():
        for suffix, f in (p.split("=") for p in factors):
            if k.endswith(suffix):
                b, end = e["data_offsets"]
                vals = struct.unpack("<%df" % ((end - b) // 4), data[b:end])
                data[b:end] = struct.pack("<%df" % len(vals), *(v * float(f) for v in vals))
    with open(src, "rb") as f:
        head = bytearray(f.read(8 + n))
    for k, e in hdr.items():  # the checksums of the scaled tensors (fixed width: in place)
        if k == "__metadata__":
            continue
        b, end = e["data_offsets"]
        key = ('"crc32.%s":"' % k).encode()
        at = head.find(key)
        if at >= 0:
            at += len(key)
            head[at:at + 8] = ("%08x" % zlib.crc32(data[b:end])).encode()
    with open(dst, "wb") as f:
        f.write(head + bytes(data))


def hubify(src, dst, prefixed):
    """Rewrites an export's model.safetensors as Hugging Face files come: the hub's gpt2 file
    adds causal-mask buffers (h.N.attn.bias [1,1,n_ctx,n_ctx], h.N.attn.masked_bias []);
    GPT2LMHeadModel.save_pretrained prefixes "transformer." and may add lm_head.weight."""
    hdr, data, _ = read_st(src)
    meta = hdr.pop("__metadata__", None)
    items, n_ctx = [], hdr["wpe.weight"]["shape"][0]
    layers = sorted({int(k.split(".")[1]) for k in hdr if k.startswith("h.")})
    for k, e in hdr.items():
        b, end = e["data_offsets"]
        items.append((("transformer." if prefixed else "") + k, e["dtype"], e["shape"], bytes(data[b:end])))
    for l in layers:
        pre = "transformer." if prefixed else ""
        items.append((pre + "h.%d.attn.bias" % l, "F32", [1, 1, n_ctx, n_ctx], bytes(4 * n_ctx * n_ctx)))
        items.append((pre + "h.%d.attn.masked_bias" % l, "F32", [], struct.pack("<f", -1e4)))
    if prefixed:
        b, end = hdr["wte.weight"]["data_offsets"]
        items.append(("lm_head.weight", "F32", hdr["wte.weight"]["shape"], bytes(data[b:end])))
    out, blobs, off = {}, [], 0
    for name, dt, shape, blob in items:
        out[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    if meta is not None:
        out["__metadata__"] = meta
    head = json.dumps(out).encode()
    head += b" " * (-len(head) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def byte_decoder():  # GPT-2's bytes_to_unicode, inverted
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def check_greedy(out, ids_json, ntok, dtrain_file, prompt_len, vocab_json=None):
    """dtrain's greedy continuation (its stdout: prompt, the new tokens' bytes, newline) must be
    the argmax chain of this forward; a token within 1e-4 of the max counts as a tie."""
    m = GPT2(out)
    ids = json.loads(ids_json)
    with open(dtrain_file, "rb") as f:
        got = f.read()[int(prompt_len):-1]
    if vocab_json:
        with open(vocab_json, encoding="utf-8") as f:
            inv = {v: k for k, v in json.load(f).items()}
        bd = byte_decoder()
        decode = lambda t: bytes(bd[ch] for ch in inv[t])
    else:
        decode = lambda t: bytes([t]) if t < 256 else b""  # byte tokenizer; ids >= 256 print nothing
    pos, chain = 0, []
    for _ in range(int(ntok)):
        lg = m.logits(m.hidden(ids[-m.cfg["n_positions"]:])[-1])
        best = max(range(len(lg)), key=lg.__getitem__)
        pick = None
        for t in sorted(range(len(lg)), key=lambda t: -lg[t]):
            if lg[best] - lg[t] > 1e-4:
                break
            b = decode(t)
            if got[pos:pos + len(b)] == b:
                pick = t
                break
        assert pick is not None, "dtrain's next bytes %r; python's argmax %d (%r)" % (got[pos:pos + 8], best, decode(best))
        chain.append(pick)
        ids.append(pick)
        pos += len(decode(pick))
    assert pos == len(got), "dtrain printed %r after %r" % (got[pos:pos + 8], got[:pos])
    print("greedy tokens %s match dtrain sample --temperature 0" % chain)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    try:
        if mode == "config":
            check_config(args[0], args[1:])
        elif mode == "header":
            check_header(args[0])
        elif mode == "same":
            check_same(args[0], args[1])
        elif mode == "loss":
            check_loss(args[0], args[1], int(args[2]), int(args[3]), float(args[4]), *args[5:])
        elif mode == "scale":
            scale_weights(args[0], args[1], args[2:])
        elif mode == "hubify":
            hubify(args[0], args[1], args[2] == "prefixed")
        elif mode == "greedy":
            check_greedy(*args)
        else:
            raise SystemExit("unknown mode " + mode)
    except AssertionError as e:
        print("check failed: %s" % e)
        sys.exit(1)
