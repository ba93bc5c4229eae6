#!/usr/bin/env python3
"""Randomised layout parity: the project's central promise, tried on layouts nobody wrote down.

Each case draws a model family (GPT-2, or Llama with grouped key/value heads, split by tp or
replicated when fewer than tp, its own MLP width, a tied or untied head, q/k/v biases, rotary
scaling), a model shape (layers, heads,
head size, length, an odd vocabulary), a batch
(micro-batch, gradient accumulation) and a layout (dp x tp x pp x cp up to 8 ranks, sp, ZeRO
stage, ps or ddp, pipeline schedule and micro-batches, virtual stages, bitwise mode, fp32 or
bf16), runs it under mpirun and checks it against the single process on the same global batch:
  - the initial weights' digest equals the single process's (every layout, bit for bit);
  - fp32: every step's loss and gradient norm within 1e-5 relative;
  - bf16: every step's loss within 1e-3 relative of the bf16 single process;
  - bitwise mode: the final digest equals the single process's in bitwise mode, the two runs
    on 1 to 3 threads per rank drawn apart (the bits do not depend on the thread count);
  - half the cases stop after k steps and resume on another random layout (any dp, tp, pp,
    cp, ZeRO): the resumed steps give the single-process curve too (checkpoints reshard).
A layout the trainer refuses must exit 2 with one `dtrain: error` line (counted, not a failure).

usage: tests/layout_sweep.py DTRAIN SRCDIR [--cases N] [--seed S] [--max-ranks R] [--keep DIR]
                             [--bitwise SHARE]
Prints one line per case and a summary; exits 1 if any case failed. Repeatable: the same seed
draws the same cases.
"""
import argparse, json, os, random, re, shutil, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("dtrain"); ap.add_argument("src")
ap.add_argument("--cases", type=int, default=20)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--max-ranks", type=int, default=8)
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--keep", default="")
ap.add_argument("--timeout", type=int, default=300)
ap.add_argument("--bitwise", type=float, default=0.2, help="the share of cases drawn in bitwise mode")
args = ap.parse_args()

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
MPI = ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "--mca", "btl", "self,vader"]
tmp = args.keep or tempfile.mkdtemp(prefix="dtrain-sweep.")
os.makedirs(tmp, exist_ok=True)
subprocess.run([args.dtrain, "prepare", "--fortune", "--input", os.path.join(args.src, "tests/data/tiny_corpus.txt"),
                "--out", os.path.join(tmp, "c"), "--val-fraction", "0.1"], check=True, stdout=subprocess.DEVNULL)


def draw(rng):
    """One case: (model and batch settings shared with the reference, layout settings, ranks)."""
    while True:
        tp = rng.choice([1, 1, 2, 2, 4]); pp = rng.choice([1, 2, 2]); cp = rng.choice([1, 1, 2])
        dp = rng.choice([1, 2, 2, 4])
        world = dp * tp * pp * cp
        if world == 1 or world > args.max_ranks:
            continue
        prec = "bf16" if rng.random() < 0.25 else "fp32"
        vs = 2 if pp > 1 and rng.random() < 0.3 else 1
        n_layer = pp * vs * rng.choice([1, 2])
        n_head = tp * rng.choice([1, 2]) if tp > 1 else rng.choice([1, 2, 4])
        hs = rng.choice([8, 16])
        seq = rng.choice([16, 32, 48])
        if seq % (2 * cp):
            continue
        mb = rng.choice([1, 2, 4])
        accum = rng.choice([1, 1, 2])
        model = {"model.n_layer": n_layer, "model.n_head": n_head, "model.n_embd": n_head * hs,
                 "model.seq_len": seq, "model.vocab_size": rng.choice([256 + 3, 300, 317, 384]),
                 "train.micro_batch": mb, "train.global_batch": mb * dp * accum,
                 "train.seed": rng.randrange(1, 10**6), "train.lr": rng.choice([1e-3, 3e-3]),
                 "precision": prec}
        if rng.random() < 0.4:  # Llama: key/value heads and MLP columns split by tp too
            kv = tp * rng.choice([d for d in (1, 2, 4) if (n_head // tp) % d == 0])
            # or fewer key/value heads than tp, each replicated over tp / n_kv_head ranks (drawn
            # apart, from the case's seed, so the other draws stay those of earlier versions)
            rep = random.Random(model["train.seed"])
            if tp > 1 and rep.random() < 0.5:
                kv = rep.choice([d for d in range(1, tp) if tp % d == 0])
            model.update({"model.family": "llama", "model.n_kv_head": kv,
                          "model.intermediate_size": tp * rng.choice([12, 20, 32]),
                          "model.tie_embeddings": rng.choice(["true", "false"]),
                          "model.qkv_bias": rng.choice(["true", "false"]),
                          "model.rope_theta": rng.choice([10000, 500000]),
                          "model.rope_factor": rng.choice([0, 0, 8]), "model.rope_original_max": 16})
        return model, draw_layout(rng, tp, pp, cp, vs, mb), world


def draw_layout(rng, tp, pp, cp, vs, mb):
    lay = {"parallel.tp": tp, "parallel.pp": pp, "parallel.cp": cp}
    if tp > 1 and rng.random() < 0.5:
        lay["parallel.sp"] = "true"
    lay["parallel.zero"] = rng.choice([0, 1, 2, 3])
    if rng.random() < 0.2:
        lay["parallel.dp_mode"] = "ps"
    if pp > 1:
        lay["parallel.schedule"] = "interleaved" if vs > 1 else rng.choice(["gpipe", "1f1b", "zb-h1"])
        if vs > 1:
            lay["parallel.virtual_stages"] = vs
        lay["parallel.micro_batches"] = rng.choice([0, 1, 2, mb]) if mb > 1 else rng.choice([0, 1])
    if rng.random() < args.bitwise:
        lay["parallel.determinism"] = "bitwise"
    return lay


def kv_fits(kv, tp):
    """Whether tp splits the key/value heads evenly or replicates each over tp / kv ranks."""
    return kv % tp == 0 or tp % kv == 0


def draw_resume_layout(rng, model):
    """Another layout of the same model and global batch, to resume a checkpoint on."""
    while True:
        tp = rng.choice([1, 2, 4]); pp = rng.choice([1, 2]); cp = rng.choice([1, 2]); dp = rng.choice([1, 2, 4])
        world = dp * tp * pp * cp
        if world > args.max_ranks or model["model.n_head"] % tp or model["model.n_layer"] < pp or \
                not kv_fits(model.get("model.n_kv_head", tp), tp) or model.get("model.intermediate_size", tp) % tp or \
                model["model.seq_len"] % (2 * cp) or model["train.global_batch"] % (model["train.micro_batch"] * dp):
            continue
        lay = draw_layout(rng, tp, pp, cp, 1, model["train.micro_batch"])
        full = {"parallel.sp": "false", "parallel.zero": 0, "parallel.dp_mode": "ddp", "parallel.schedule": "1f1b",
                "parallel.virtual_stages": 1, "parallel.micro_batches": 0, "parallel.determinism": "fast"}
        full.update(lay)  # every layout key set: a resumed run keeps the checkpoint's otherwise
        full["parallel.determinism"] = "fast"
        return full, world


def sets(d):
    out = []
    for k, v in d.items():
        out += ["--set", "%s=%s" % (k, v)]
    return out


def run(cmd, log, threads=1):
    """cmd with `threads` OpenMP threads per rank (OMP_NUM_THREADS overrides --threads)."""
    if threads != 1:
        cmd = cmd[:1] + ["-x", "OMP_NUM_THREADS=%d" % threads] + cmd[1:] if cmd[0] == "mpirun" else cmd
        cmd = cmd + ["--threads", str(threads)]
    try:
        p = subprocess.run(cmd, env=dict(env, OMP_NUM_THREADS=str(threads)), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=args.timeout)
        rc, out = p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", (e.stdout or b"").decode(errors="replace")
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + out)
    return rc, out


def metrics(path):
    rows = [json.loads(l) for l in open(path)]
    return {r["step"]: r for r in rows if "event" not in r}


def digest(out):
    m = re.findall(r"digest sha256:([0-9a-f]{64})", out)
    return m[-1] if m else None


base = ["--config", os.path.join(args.src, "tests/data/tiny.json"), "--set", "data.train=%s/c_train.bin" % tmp,
        "--set", "data.val=%s/c_val.bin" % tmp, "--threads", "1", "--set", "train.val_every=0",
        "--steps", str(args.steps), "--set", "train.warmup_steps=2"]
refs = {}
rng = random.Random(args.seed)
failed = refused = passed = 0
for i in range(args.cases):
    model, lay, world = draw(rng)
    name = "case%03d" % i
    desc = " ".join("%s=%s" % (k.split(".")[-1], v) for k, v in list(model.items()) + list(lay.items()))
    bitwise = lay.get("parallel.determinism") == "bitwise"
    # bitwise mode's digest does not depend on the threads: its reference and its layout run
    # draw theirs apart (from the case's seed, so the other draws stay those of earlier versions)
    trng = random.Random(model["train.seed"] * 31 + 7)
    ref_threads, run_threads = (trng.choice([1, 2, 3]), trng.choice([1, 2])) if bitwise else (1, 1)
    if bitwise:
        desc += " threads=%d/ref %d" % (run_threads, ref_threads)
    ref_model = dict(model)
    m = lay.get("parallel.micro_batches", 0)
    if bitwise and m:
        # bitwise sums one leaf per micro-batch: the reference runs the layout's micro-batch
        # (parallel.micro_batches sets it to global_batch / (dp x m))
        dp = world // (lay["parallel.tp"] * lay["parallel.pp"] * lay["parallel.cp"])
        if model["train.global_batch"] % (dp * m) == 0:
            ref_model["train.micro_batch"] = model["train.global_batch"] // (dp * m)
    # bitwise in fp32: the sequence's canonical chunks (cp_chunks.c), in the reference and
    # the layout alike, so cp is drawn too (4 chunks: cp 2; tp x cp must divide tp_chunks; Llama's
    # widths cut by them, its key/value heads split over tp, or replicated with a power of two
    # of query heads per rank)
    chunks = []
    q = 8 if lay["parallel.tp"] * lay["parallel.cp"] > 4 else 4
    hl = model.get("model.n_head", 1) // lay["parallel.tp"]
    llama_cut = model.get("model.family") != "llama" or (
        (model["model.n_kv_head"] % lay["parallel.tp"] == 0 or (hl > 0 and hl & (hl - 1) == 0)) and
        model["model.intermediate_size"] % q == 0 and
        model["model.n_kv_head"] * (model["model.n_embd"] // model["model.n_head"]) % q == 0)
    if bitwise and llama_cut and model["precision"] == "fp32":
        chunks = ["--set", "parallel.cp_chunks=4"]
        if q == 8:
            chunks += ["--set", "parallel.tp_chunks=8"]
        desc += " " + " ".join(c.split(".")[-1] for c in chunks[1::2])
    key = json.dumps(ref_model, sort_keys=True) + (" bitwise %d %s" % (ref_threads, chunks) if bitwise else "")
    if key not in refs:
        extra = ["--set", "parallel.determinism=bitwise"] + chunks if bitwise else []
        rj = "%s/%s.ref.jsonl" % (tmp, name)
        rc, out = run([args.dtrain, "train"] + base + sets(ref_model) + extra + ["--metrics", rj, "--digest"],
                      "%s/%s.ref.log" % (tmp, name), ref_threads)
        rc0, out0 = run([args.dtrain, "train"] + base + sets(model) + ["--steps", "0", "--digest"],
                        "%s/%s.ref0.log" % (tmp, name))
        refs[key] = (rc, rj, digest(out), digest(out0), out)
    rrc, rj, rdig, rdig0, rout = refs[key]
    if rrc != 0:
        print("REF-REFUSED %s rc %s: %s | %s" % (name, rrc, desc, rout.strip().splitlines()[-1:]))
        refused += 1
        continue
    gj = "%s/%s.jsonl" % (tmp, name)
    rc, out = run(MPI + ["-np", str(world), args.dtrain, "train"] + base + sets(model) + sets(lay) + chunks +
                  ["--metrics", gj, "--digest"], "%s/%s.log" % (tmp, name), run_threads)
    errs = [l for l in out.splitlines() if l.startswith("dtrain: error")]
    if rc == 2 and len(errs) == 1:
        print("refused  %s np %d: %s | %s" % (name, world, desc, errs[0]))
        refused += 1
        continue
    problems, worst = [], 0.0
    keys = ("loss",) if model["precision"] == "bf16" else ("loss", "grad_norm")
    tol = 1e-3 if model["precision"] == "bf16" else 1e-5
    if rc != 0:
        problems.append("rc %s: %s" % (rc, " / ".join(out.strip().splitlines()[-3:])))
    else:
        rc0, out0 = run(MPI + ["-np", str(world), args.dtrain, "train"] + base + sets(model) + sets(lay) + chunks +
                        ["--steps", "0", "--digest"], "%s/%s.init.log" % (tmp, name))
        if digest(out0) != rdig0:
            problems.append("initial digest %s != %s" % (digest(out0), rdig0))
        ref, got = metrics(rj), metrics(gj)
        if sorted(ref) != sorted(got):
            problems.append("steps %s vs %s" % (sorted(got), sorted(ref)))
        for s in ref:
            for k in keys:
                if s in got:
                    worst = max(worst, abs(got[s][k] - ref[s][k]) / max(abs(ref[s][k]), 1e-30))
        if worst > tol:
            problems.append("max rel diff %.2e > %.0e" % (worst, tol))
        if bitwise and digest(out) != rdig:
            problems.append("bitwise final digest differs")
    if not problems and rng.random() < 0.5:  # stop after k steps, resume on another layout
        k = rng.randrange(1, args.steps)
        lay2, world2 = draw_resume_layout(rng, model)
        ck, rj2 = "%s/%s.ckpt" % (tmp, name), "%s/%s.resumed.jsonl" % (tmp, name)
        shutil.rmtree(ck, ignore_errors=True)
        desc += " | resumed after %d on np %d: %s" % (k, world2, " ".join(
            "%s=%s" % (q.split(".")[-1], v) for q, v in lay2.items()))
        rc, out = run(MPI + ["-np", str(world), args.dtrain, "train"] + base + sets(model) + sets(lay) + chunks +
                      ["--set", "train.stop_after=%d" % k, "--save", ck], "%s/%s.first.log" % (tmp, name))
        if rc != 0:
            problems.append("first half rc %s: %s" % (rc, " / ".join(out.strip().splitlines()[-2:])))
        else:
            rc, out = run(MPI + ["-np", str(world2), args.dtrain, "train"] + base + sets(model) + sets(lay2) +
                          ["--resume", ck, "--metrics", rj2], "%s/%s.resumed.log" % (tmp, name))
            errs = [l for l in out.splitlines() if l.startswith("dtrain: error")]
            if rc == 2 and len(errs) == 1:
                desc += " (resume refused: %s)" % errs[0]
            elif rc != 0:
                problems.append("resumed rc %s: %s" % (rc, " / ".join(out.strip().splitlines()[-2:])))
            else:
                got2 = metrics(rj2)
                if sorted(got2) != list(range(k + 1, args.steps + 1)):
                    problems.append("resumed steps %s" % sorted(got2))
                w2 = max([abs(got2[q][kk] - ref[q][kk]) / max(abs(ref[q][kk]), 1e-30)
                          for q in got2 if q in ref for kk in keys] + [0.0])
                worst = max(worst, w2)
                if w2 > tol:
                    problems.append("resumed max rel diff %.2e > %.0e" % (w2, tol))
    if problems:
        failed += 1
        print("FAIL     %s np %d: %s | %s" % (name, world, desc, "; ".join(problems)))
    else:
        passed += 1
        print("ok       %s np %d: %s | %.1e" % (name, world, desc, worst))
    sys.stdout.flush()
print("%d passed, %d refused, %d failed (logs in %s)" % (passed, refused, failed, tmp))
if not args.keep and failed == 0:
    shutil.rmtree(tmp)
sys.exit(1 if failed else 0)
