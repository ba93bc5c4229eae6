"""Seeded fuzzer for dtrain's input files (stdlib only): mutates a valid checkpoint
(model.safetensors, optimizer.safetensors, trainer_state.json), a sharded one (its
model.safetensors.index.json / optimizer.safetensors.index.json and shard files), token
files and config files (a few replaced by a FIFO or /dev/zero), runs dtrain on each case and
checks the outcome: exit 0 or 2 (1 only for a run whose mutated but finite weights diverge,
which is a runtime failure by design), at most one "dtrain: error:" line, no signal, no
sanitizer report, no timeout; a flipped bit in a tensor's data: exit 2 naming its checksum.

usage: python3 fuzz.py DTRAIN WORKDIR CASES SEED TINY_CONFIG TRAIN_BIN VAL_BIN
A failing case prints its number and the command to reproduce it (FUZZ_ONLY=N runs one).
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys

DTRAIN, WORK, CASES, SEED, TINY, TRAIN_BIN, VAL_BIN = sys.argv[1:8]
CASES, SEED = int(CASES), int(SEED)
ONLY = int(os.environ["FUZZ_ONLY"]) if os.environ.get("FUZZ_ONLY") else None
TIMEOUT = 30

INTERESTING_INTS = [0, 1, -1, 2, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**53, 2**63 - 1, 2**64,
                    -2**31, 10**300]
INTERESTING_VALUES = INTERESTING_INTS + [0.5, -0.0, 2.5, 1e-300, 1e308, -1e308, "", "x", "/nonexistent/x",
                                          "a" * 5000, None, True, False, [], {}, [1, 2], {"a": 1}]


def reader_args(rng, ck, d, resume_only):
    """A command that reads the checkpoint ck: resume (always for the optimizer's files,
    which only resume reads), sample or export."""
    how = rng.randrange(3)
    if how == 0 or resume_only:
        return ["train", "--resume", ck, "--set", "train.stop_after=1", "--set", "threads=1",
                "--set", "checkpoint.dir=" + os.path.join(d, "out"), "--set", "log.metrics="]
    if how == 1:
        return ["sample", "--checkpoint", ck, "--length", "3", "--prompt", "ab"]
    return ["export", ck, os.path.join(d, "hf")]


def run(args, env=None):
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    try:
        p = subprocess.run([DTRAIN] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=TIMEOUT,
                           env=e, cwd=WORK)
        return p.returncode, p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as t:
        return "timeout", (t.stderr or b"").decode("utf-8", "replace")


# --- mutators -------------------------------------------------------------------------
def mutate_bytes(rng, b):
    b = bytearray(b)
    op = rng.randrange(5)
    if op == 0 and b:  # flip bits
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # truncate
        del b[rng.randrange(len(b) + 1):]
    elif op == 2:  # insert bytes
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif op == 3 and len(b) >= 8:  # an interesting integer over 4 or 8 bytes, often near the start
        i = rng.randrange(min(len(b) - 8, 64) + 1) if rng.random() < 0.5 else rng.randrange(len(b) - 7)
        v = rng.choice(INTERESTING_INTS) & (2**64 - 1)
        b[i:i + 8] = struct.pack("<Q", v) if rng.random() < 0.5 else struct.pack("<I", v & 0xFFFFFFFF) + b[i + 4:i + 8]
    else:  # delete a range
        if b:
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 64)]
    return bytes(b)


def leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))
    if path:
        yield path


def get(node, path):
    for p in path:
        node = node[p]
    return node


def mutate_json_value(rng, obj):
    """A structural change: replace, delete, swap or add."""
    paths = list(leaves(obj))
    if not paths:
        return obj
    op = rng.randrange(4)
    a = rng.choice(paths)
    parent = get(obj, a[:-1])
    if op == 0:
        parent[a[-1]] = rng.choice(INTERESTING_VALUES)
    elif op == 1:
        if isinstance(parent, dict):
            del parent[a[-1]]
        else:
            parent.pop(a[-1])
    elif op == 2:
        b = rng.choice(paths)
        try:
            va, vb = get(obj, a), get(obj, b)
            pb = get(obj, b[:-1])
            parent[a[-1]], pb[b[-1]] = vb, va
        except (KeyError, IndexError, TypeError):
            pass
    else:
        if isinstance(parent, dict):
            parent[rng.choice(["zz", "n_layer", "format", "step", "__metadata__"])] = rng.choice(INTERESTING_VALUES)
    return obj


def mutate_json_text(rng, text):
    if rng.random() < 0.6:
        try:
            obj = json.loads(text)
            for _ in range(rng.randint(1, 3)):
                obj = mutate_json_value(rng, obj)
            return json.dumps(obj, allow_nan=True).encode()
        except (ValueError, RecursionError):
            pass
    return mutate_bytes(rng, text.encode() if isinstance(text, str) else text)


def mutate_safetensors(rng, raw):
    if rng.random() < 0.5 and len(raw) > 8:
        n = struct.unpack("<Q", raw[:8])[0]
        try:
            hdr = json.loads(raw[8:8 + n])
        except ValueError:
            return mutate_bytes(rng, raw)
        names = [k for k in hdr if k != "__metadata__"]
        t = hdr[rng.choice(names)]
        field = rng.choice(["dtype", "shape", "data_offsets", "drop", "extra"])
        if field == "dtype":
            t["dtype"] = rng.choice(["F16", "BF16", "F64", "I8", "U8", "BOOL", "Q7", "", 3])
        elif field == "shape":
            t["shape"] = rng.choice([[], [0], [-1], [2**40, 2**40], t["shape"][::-1], t["shape"] + [1], [1] * 9])
        elif field == "data_offsets":
            b, e = t["data_offsets"]
            t["data_offsets"] = rng.choice([[e, b], [b, e + 4], [b + 4, e + 4], [0, 4], [-4, e], [b, 2**64 - 1]])
        elif field == "drop":
            del hdr[rng.choice(names)]
        else:
            hdr["zz." + rng.choice(names)] = dict(t)
        hb = json.dumps(hdr).encode()
        return struct.pack("<Q", len(hb)) + hb + raw[8 + n:]
    if rng.random() < 0.3 and len(raw) > 8:  # a non-finite or huge float inside the data
        n = struct.unpack("<Q", raw[:8])[0]
        i = 8 + n + 4 * rng.randrange(max(1, (len(raw) - 8 - n) // 4))
        if i + 4 <= len(raw):
            v = rng.choice([float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1e30])
            return raw[:i] + struct.pack("<f", v) + raw[i + 4:]
    return mutate_bytes(rng, raw)


def mutate_index(rng, text, files):
    """A Hugging Face index: targeted edits of weight_map and metadata, or generic JSON/byte ones."""
    if rng.random() < 0.4:
        return mutate_json_text(rng, text)
    idx = json.loads(text)
    wm = idx["weight_map"]
    names = sorted(wm)
    op = rng.randrange(9)
    if op == 0:  # a tensor to another file: path traversal, absolute, missing, another shard, odd names
        wm[rng.choice(names)] = rng.choice(["../" + rng.choice(files), "/etc/passwd", "model-00009-of-00009.safetensors",
                                            rng.choice(files), "", ".", "..", "a\\b", "sub/" + rng.choice(files),
                                            "x" * 300, "\u0001", 7, None, [rng.choice(files)]])
    elif op == 1:  # a tensor dropped from the index
        del wm[rng.choice(names)]
    elif op == 2:  # a tensor the model does not have
        wm[rng.choice(["h.9.ln_1.weight", "zz", "exp_avg.wte.weight", "wte.weight.x"])] = rng.choice(files)
    elif op == 3:
        idx["metadata"]["total_size"] = rng.choice(INTERESTING_VALUES + [idx["metadata"]["total_size"] + rng.choice([-4, 4])])
    elif op == 4:
        del idx[rng.choice(["metadata", "weight_map"])]
    elif op == 5:
        idx["weight_map"] = rng.choice(INTERESTING_VALUES)
    elif op == 6:  # two tensors' files swapped
        a, b = rng.choice(names), rng.choice(names)
        wm[a], wm[b] = wm[b], wm[a]
    elif op == 7:  # a duplicate key (cJSON keeps both)
        t = json.dumps(idx)
        k = rng.choice(names)
        return t.replace(json.dumps(k) + ":", json.dumps(k) + ": " + json.dumps(rng.choice(files)) + ", " +
                         json.dumps(k) + ":", 1).encode()
    else:
        idx["metadata"] = rng.choice(INTERESTING_VALUES)
    return json.dumps(idx, indent=rng.choice([None, 2])).encode()


def mutate_tokens(rng, raw):
    r = rng.random()
    if r < 0.3:  # header fields
        i = 4 * rng.randrange(4)
        v = rng.choice(INTERESTING_INTS) & 0xFFFFFFFF
        return raw[:i] + struct.pack("<I", v) + raw[i + 4:]
    if r < 0.5:  # token values beyond the vocabulary
        i = 1024 + 2 * rng.randrange(max(1, (len(raw) - 1024) // 2))
        return raw[:i] + struct.pack("<H", rng.choice([256, 299, 300, 301, 65535])) + raw[i + 2:]
    return mutate_bytes(rng, raw)


def make_special(case, p):
    """In about 1 case in 12 of the kinds below, the input becomes a FIFO with no writer or
    /dev/zero (issue 24: an open that blocked for good, a read that never ended), which
    must be exit 2 at once. Its own random stream: the other cases stay as they were."""
    r = random.Random(SEED * 7919 + case).random()
    if r >= 0.08:
        return None
    os.remove(p)
    if r < 0.04:
        os.mkfifo(p)
        return "fifo"
    os.symlink("/dev/zero", p)
    return "/dev/zero"


# --- the cases --------------------------------------------------------------------------
def flip_data(rng, raw):
    """One bit of one tensor's data flipped: the file stays valid but for its checksum."""
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    b, e = hdr[rng.choice([k for k in hdr if k != "__metadata__" and hdr[k]["data_offsets"][1] > hdr[k]["data_offsets"][0]])]["data_offsets"]
    i = 8 + n + rng.randrange(b, e)
    return raw[:i] + bytes([raw[i] ^ (1 << rng.randrange(8))]) + raw[i + 1:]


def main():
    os.makedirs(WORK, exist_ok=True)
    base = os.path.join(WORK, "base")
    tiny = ["--config", TINY, "--set", "data.train=" + TRAIN_BIN, "--set", "data.val=" + VAL_BIN, "--threads", "1"]
    if not os.path.isdir(base):
        rc, err = run(["train"] + tiny + ["--steps", "4", "--set", "train.stop_after=2", "--save", base])
        if rc != 0:
            print("FAIL: could not make the base checkpoint: " + err)
            return 1
    step = os.path.join(base, open(os.path.join(base, "latest")).read().strip())
    base_sh = os.path.join(WORK, "base_sharded")  # checkpoint.shard_mb: 3 shards + indexes in one process
    if not os.path.isdir(base_sh):
        rc, err = run(["train"] + tiny + ["--steps", "4", "--set", "train.stop_after=2", "--set", "checkpoint.shard_mb=0.05",
                                          "--save", base_sh])
        if rc != 0:
            print("FAIL: could not make the sharded base checkpoint: " + err)
            return 1
    step_sh = os.path.join(base_sh, open(os.path.join(base_sh, "latest")).read().strip())
    cfg_text = subprocess.run([DTRAIN, "config"] + tiny + ["--steps", "4"], stdout=subprocess.PIPE, check=True,
                              cwd=WORK).stdout
    train_raw, val_raw = open(TRAIN_BIN, "rb").read(), open(VAL_BIN, "rb").read()
    failures, counts = 0, {}
    for case in range(CASES):
        if ONLY is not None and case != ONLY:
            continue
        rng = random.Random(SEED * 1000003 + case)
        d = os.path.join(WORK, "c%d" % case)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        kind = ["model", "optimizer", "state", "tokens", "config", "index", "shard"][case % 7]
        must = None  # what the error must say (a flipped data bit: its checksum)
        if kind in ("index", "shard"):
            ck = os.path.join(d, "ck")
            shutil.copytree(step_sh, ck)
            which = rng.choice(["model", "optimizer"])
            files = sorted(f for f in os.listdir(ck) if f.startswith(which + "-"))
            if kind == "index":
                p = os.path.join(ck, which + ".safetensors.index.json")
                text = open(p).read()
                open(p, "wb").write(mutate_index(rng, text, files))
            else:
                p = os.path.join(ck, rng.choice(files))
                r = rng.random()
                if r < 0.15:
                    os.remove(p)
                elif r < 0.3:  # another shard's bytes under this name
                    other = os.path.join(ck, rng.choice([f for f in files if os.path.join(ck, f) != p]))
                    shutil.copyfile(other, p)
                elif r < 0.45:
                    raw = open(p, "rb").read()
                    open(p, "wb").write(flip_data(rng, raw))
                    must = "checksum mismatch"
                else:
                    raw = open(p, "rb").read()
                    open(p, "wb").write(mutate_safetensors(rng, raw))
            args = reader_args(rng, ck, d, which == "optimizer")
        elif kind in ("model", "optimizer", "state"):
            ck = os.path.join(d, "ck")
            shutil.copytree(step, ck)
            f = {"model": "model.safetensors", "optimizer": "optimizer.safetensors",
                 "state": "trainer_state.json"}[kind]
            p = os.path.join(ck, f)
            raw = open(p, "rb").read()
            if kind != "state" and rng.random() < 0.2:
                raw = flip_data(rng, raw)
                must = "checksum mismatch"
            else:
                raw = mutate_json_text(rng, raw.decode()) if kind == "state" else mutate_safetensors(rng, raw)
            open(p, "wb").write(raw)
            args = reader_args(rng, ck, d, kind == "optimizer")
        elif kind == "tokens":
            p = os.path.join(d, "t.bin")
            which = rng.randrange(2)
            open(p, "wb").write(mutate_tokens(rng, train_raw if which == 0 else val_raw))
            args = ["train"] + tiny + ["--steps", "2", "--set", "train.val_every=1",
                                       "--set", ("data.train=" if which == 0 else "data.val=") + p]
        else:
            p = os.path.join(d, "c.json")
            open(p, "wb").write(mutate_json_text(rng, cfg_text.decode()))
            args = ["train", "--config", p, "--set", "data.train=" + TRAIN_BIN, "--set", "data.val=" + VAL_BIN,
                    "--set", "train.stop_after=1", "--set", "threads=1", "--set", "checkpoint.dir=" + os.path.join(d, "out"),
                    "--set", "log.metrics=", "--set", "checkpoint.resume=",
                    # a valid but long sample (65536 tokens: 6 s, a minute under ASan) is no bug; the
                    # file's own value is still parsed and range-checked before this override
                    "--set", "log.sample_tokens=0"]
        special = make_special(case, p) if kind in ("tokens", "config", "state") else None
        if special:
            kind += " " + special
        rc, err = run(args)
        errors = [l for l in err.splitlines() if l.startswith("dtrain: error:")]
        bad = None
        if rc == "timeout":
            bad = "timeout after %d s" % TIMEOUT
        elif not isinstance(rc, int) or rc < 0 or rc > 128:
            bad = "killed by a signal (rc %s)" % rc
        elif "runtime error" in err or "Sanitizer" in err:
            bad = "sanitizer report"
        elif rc not in (0, 1, 2):
            bad = "exit %d" % rc
        elif rc == 1 and not (errors and "training diverged" in errors[0]):
            bad = "exit 1 without a divergence"
        elif len(errors) > 1 or (rc != 0 and len(errors) != 1):
            bad = "%d error lines" % len(errors)
        elif special and kind != "state " + special and (rc != 2 or "not a regular file" not in errors[0]):
            bad = "a %s input not refused as such (rc %s)" % (special, rc)
        elif must and (rc != 2 or must not in errors[0]):
            bad = "exit %d, not exit 2 with '%s'" % (rc, must)
        counts[(kind, rc)] = counts.get((kind, rc), 0) + 1
        if bad:
            failures += 1
            print("FAIL: case %d (%s, seed %d): %s\n  reproduce: FUZZ_ONLY=%d (args: %s)\n  stderr: %s"
                  % (case, kind, SEED, bad, case, " ".join(args), err.strip()[-2000:]))
        else:
            shutil.rmtree(d, ignore_errors=True)
    summary = ", ".join("%s exit %s: %d" % (k, r, n) for (k, r), n in sorted(counts.items(), key=str))
    print("fuzz: %d cases, %d failed (%s)" % (sum(counts.values()), failures, summary))
    return 1 if failures else 0


sys.exit(main())
