"""bench_offload.sh's report: its raw TSV rows -> markdown tables for docs/benchmarks.md.
usage: offload_report.py RESULTS.tsv ELAPSED_S WARMUP STEPS STEP_THREADS STEP_BACKEND COMMIT"""
import datetime
import json
import math
import statistics
import sys

path, elapsed, warmup, steps, step_threads, step_backend, commit = sys.argv[1:8]
warmup = int(warmup)
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]


def num(x):
    try:
        return float(x)
    except ValueError:
        return None


def probes(p0, p1):
    p0, p1 = num(p0), num(p1)
    if p0 is None or p1 is None:
        return "-"
    return "%.2f→%.2f%s" % (p0, p1, " ⚠" if min(p0, p1) < 1.6 else "")


cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t")
ncpu = len([l for l in open("/proc/cpuinfo") if l.startswith("processor")])
print()
print("### %s, %s, %d cores (commit %s)" % (datetime.date.today().isoformat(), cpu, ncpu, commit))

# ---- adamw ----
# adamw TH P0 P1 row NAME BYTES BEST MEDIAN | incache NAME BYTES GBS NS | check TEXT
ad = [r for r in rows if r[0] == "adamw"]
if ad:
    best = {(r[1], r[5]): (num(r[7]), num(r[8])) for r in ad if r[4] == "row"}
    inc = {(r[1], r[5]): (num(r[7]), num(r[8])) for r in ad if r[4] == "incache"}
    prb = {r[1]: (r[2], r[3]) for r in ad}
    ths = sorted(prb, key=int)
    g = lambda th, k: best.get((th, k), (None, None))[0]
    f = lambda x, fmt="%.1f": fmt % x if x else "-"
    ratio = lambda a, b: "%.2f" % (a / b) if a and b else "-"
    print()
    print("#### CPU AdamW against memory bandwidth")
    print()
    print("GB/s (1e9 B) as STREAM counts them: each array read or written once per element; best of the "
          "repetitions, the kernels interleaved, same arrays (first-touched by the same threads), same threads, one "
          "process. AdamW is the library's `dt_ops_cpu()->adamw`: p, g, m, v read, p, m, v written = 28 B/element "
          "(30 with the bf16 copy). **The denominator is `stream7`** (p, m, v += s·g: AdamW's 4 arrays read and 3 "
          "written back in place, so the same traffic with almost no arithmetic), because the STREAM triad's 12 B "
          "leave out the read-for-ownership of its store (16 B really move) while all of AdamW's 28 B are real "
          "traffic: AdamW / triad flatters AdamW by up to 4/3 and is printed for reference only. Goal: AdamW / "
          "stream7 ≥ 0.8.")
    print()
    print("| threads | triad (12 B) | stream7 (28 B) | AdamW (28 B) | **AdamW / stream7** | AdamW / triad "
          "| stream7 + bf16 (30 B) | AdamW + bf16 (30 B) | bf16: AdamW / stream7 | probes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for th in ths:
        print("| %s | %s | %s | %s | **%s** | %s | %s | %s | %s | %s |" % (
            th, f(g(th, "triad")), f(g(th, "stream7")), f(g(th, "adamw")), ratio(g(th, "adamw"), g(th, "stream7")),
            ratio(g(th, "adamw"), g(th, "triad")), f(g(th, "stream7_bf16")), f(g(th, "adamw_bf16")),
            ratio(g(th, "adamw_bf16"), g(th, "stream7_bf16")), probes(*prb[th])))
    print()
    print("Compute ceiling: the same kernels on arrays that stay in L2 (32K elements a thread), GB/s as above "
          "(ns per element). Where AdamW's ceiling is near stream7's memory rate, the update is compute bound; "
          "`unit-bc` is a candidate change (not in the library): the division by a bias correction skipped where "
          "it is exactly 1.0f (beta1's from step 165 on), which cannot change a bit (x / 1.0f = x).")
    print()
    print("| threads | stream7 in L2 | AdamW in L2 | unit-bc AdamW in L2 | unit-bc AdamW from memory | AdamW from memory |")
    print("|---|---|---|---|---|---|")
    ic = lambda th, k: "%.1f (%.2f ns)" % inc[(th, k)] if (th, k) in inc else "-"
    for th in ths:
        print("| %s | %s | %s | %s | %s | %s |" % (th, ic(th, "stream7"), ic(th, "adamw"), ic(th, "adamw_unitbc"),
                                               f(g(th, "adamw_unitbc")), f(g(th, "adamw"))))
    print()
    for text in dict.fromkeys(r[5] for r in ad if r[4] == "check"):
        print("Check: %s." % text)
    print()

# ---- disk ----
# dd ROUND RW MBPS | fio ROUND ENGINE BS QD RW MBPS | disk_probe P0 P1 SIZE_MB "SOURCE FSTYPE"
fio, dd = {}, {}
for r in rows:
    if r[0] == "fio" and num(r[6]):
        fio.setdefault((r[2], int(r[3]), int(r[4]), r[5]), []).append(num(r[6]))
    if r[0] == "dd" and num(r[3]):
        dd.setdefault(r[2], []).append(num(r[3]))
seq = {}  # the disk's sequential bandwidth: the best any engine reached (a conservative denominator)
dp = [r for r in rows if r[0] == "disk_probe"]
if fio or dd:
    size_mb, dev = (dp[0][3], dp[0][4]) if dp else ("?", "?")
    cell = lambda v: "-" if not v else ("%.0f" % max(v) if len(v) == 1 else "%.0f (%.0f–%.0f)" % (max(v), min(v), max(v)))
    print()
    print("#### Disk: sequential O_DIRECT bandwidth")
    print()
    print("MB/s (1e6 B/s), one %s MiB file on %s, fio with `--direct=1`, one job, `rw=write` (overwriting the "
          "laid-out file) then `rw=read`; best of the rounds (min–max when several). psync has one I/O in flight "
          "whatever the queue depth. CPU-share probes before → after: %s." % (
              size_mb, dev, probes(dp[0][1], dp[0][2]) if dp else "-"))
    print()
    print("| engine | block | queue depth | write MB/s | read MB/s |")
    print("|---|---|---|---|---|")
    cells = sorted({k[:3] for k in fio}, key=lambda k: (k[0], k[1], k[2]))
    for e, bs, qd in cells:
        print("| %s | %d MiB | %d | %s | %s |" % (e, bs, qd, cell(fio.get((e, bs, qd, "write"))),
                                               cell(fio.get((e, bs, qd, "read")))))
    if dd:
        print("| dd (`oflag=direct` writing zeros, `iflag=direct`) | 8 MiB | 1 | %s | %s |" % (
            cell(dd.get("write")), cell(dd.get("read"))))
    for rw in ("write", "read"):
        v = [max(x) for k, x in fio.items() if k[3] == rw]
        if v:
            seq[rw] = max(v)
    print()
    # which async library: io_uring against libaio, cell by cell where both ran
    pairs = [(max(fio[k]), max(fio[("libaio",) + k[1:]])) for k in fio
             if k[0] == "io_uring" and ("libaio",) + k[1:] in fio]
    if pairs:
        gm = math.exp(statistics.mean(math.log(a / b) for a, b in pairs))
        wins = sum(a > b for a, b in pairs)
        print("io_uring / libaio: geometric mean %.3f over %d cells (io_uring ahead in %d). " % (gm, len(pairs), wins),
              end="")
        at = [(rw, fio.get(("io_uring", 8, 4, rw)), fio.get(("libaio", 8, 4, rw))) for rw in ("read", "write")]
        at = ["%s io_uring %.0f vs libaio %.0f MB/s" % (rw, max(a), max(b)) for rw, a, b in at if a and b]
        if at:
            print("At 8 MiB blocks, 4 in flight (offload.block_mb and offload.buffer_count's defaults): %s. " % "; ".join(at),
                  end="")
        # a disk's run-to-run noise is several per cent: call a winner only past 5%
        print("Winner by measurement: **%s**." % ("io_uring" if gm > 1.05 else "libaio" if gm < 1 / 1.05 else
                                                 "neither (within 5%, a disk's run-to-run noise)"))
    if seq:
        print()
        print("Sequential bandwidth used below: write %.0f MB/s, read %.0f MB/s (the best cell of each)." % (
            seq.get("write", 0), seq.get("read", 0)))
    print()

# ---- step ----
# step_skip WHY | step SHAPE MODE P0 P1 RC JSONL
skip = [r for r in rows if r[0] == "step_skip"]
st = [r for r in rows if r[0] == "step"]
shapes = {"small": "GPT-2 small (L12 C768 H12, T256, micro-batch 4, 4 seq/step)",
          "hide": "GPT-2 small, T1024, micro-batch 4, 8 seq/step (2 micro-steps)",
          "tiny": "tiny (L2 C64 H2 T64, 2 seq/step: a smoke test, not a figure)"}
if skip or st:
    print()
    print("#### Step time with the optimizer state offloaded")
    print()
    if skip:
        print("Not measured: %s." % skip[0][1])
        print()
if st:
    print("`dtrain train`, backend %s, %s thread(s), %d untimed + %s timed steps; step ms = median of the timed "
          "steps; I/O per step from the metrics' offload_read_mb + offload_write_mb (MB = 1e6 B), waited = "
          "offload_wait_ms. Rate vs sequential: the time the disk needs for that step's reads and writes at the "
          "sequential rates above, over the interval they had: the update (offload_ms) where the metrics give it, "
          "else the whole step (then it understates). The gap to `none` not spent waiting for I/O is the host "
          "update and the copies." % (step_backend, step_threads, warmup, steps))
    print()
    print("| shape | offload.optimizer | step ms | vs none | waited for I/O, ms | other extra, ms | I/O MB/step "
          "| MB/s | rate vs sequential | probes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = {}
    for r in st:
        shape, mode, p0, p1, rc, jl = r[1:7]
        recs = []
        try:
            recs = [json.loads(l) for l in open(jl) if l.strip()]
        except OSError:
            pass
        recs = [x for x in recs if "step" in x and "event" not in x and x["step"] > warmup]
        if rc != "0" or not recs:
            print("| %s | %s | failed (exit %s) | | | | | | | %s |" % (shapes.get(shape, shape), mode, rc, probes(p0, p1)))
            continue
        ms = statistics.median(x["ms"] for x in recs)
        if mode == "none":
            base[shape] = ms
        mean = lambda k: statistics.mean(x[k] for x in recs) if all(k in x for x in recs) else None
        rd, wr, wait, upd = mean("offload_read_mb"), mean("offload_write_mb"), mean("offload_wait_ms"), mean("offload_ms")
        b = base.get(shape)
        io = rd + wr if rd is not None and wr is not None else None
        interval = upd if upd else ms
        rate = io / (interval / 1e3) if io else None
        vs_seq = None
        if io and seq.get("read") and seq.get("write"):
            vs_seq = (rd / seq["read"] + wr / seq["write"]) / (interval / 1e3)
        print("| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |" % (
            shapes.get(shape, shape), mode, ms, "%.2f" % (ms / b) if b else "-",
            "%.0f" % wait if wait is not None else "-",
            "%.0f" % (ms - b - wait) if b and wait is not None and mode != "none" else "-",
            "%.0f" % io if io is not None else "-", "%.0f%s" % (rate, "" if upd else " (step)") if rate else "-",
            "%.0f%%" % (100 * vs_seq) if vs_seq else "-", probes(p0, p1)))
    print()
print("Script: `bash bench/bench_offload.sh` (%s s in all)." % elapsed)
