#!/usr/bin/env python3
"""Chaos trial of `dtrain launch`: supervised jobs over several layouts, each with a fault
injected at a random point; every job must end on the uninterrupted run's digest (bitwise
mode), none may outlive its timeout, and a killed launcher must leave no process behind.
Prints a table of faults and outcomes; exit 0 when every job passed.

    python3 tests/chaos.py --dtrain build/dtrain --src . --seed 1 --count 18

Faults (one a job): a rank exits (exit), hangs (hang) or is stopped (stop) after a random
step; a rank hangs before its first step (hang-start); every rank dies inside a save at a
random crash point (crash-save); mpirun is SIGKILLed (mpirun-kill); SIGTERM to the launcher,
then the run resumed (term-resume); SIGTERM twice, the job killed mid-step, then resumed
(term2-resume); the launcher SIGKILLed, then resumed (launcher-kill: no process of the job
may survive it by more than 3 s); SIGTERM to the launcher, then before the resume: a
flipped byte in the newest checkpoint's largest file (damage) or a trainer_state.json
claiming another step (state-step), both falling back to the newest intact step; `latest`
replaced by a FIFO (latest-fifo: nothing may block on it); the metrics file cut inside its
last line (torn-metrics: the resumed run's lines stay whole and `dtrain report` reads the
file, skipping the torn line).
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

LAYOUTS = {  # name: (ranks, extra train arguments)
    "dp2": (2, []),
    "dp2-zero3": (2, ["--set", "parallel.zero=3"]),
    "pp2": (2, ["--set", "parallel.pp=2"]),
    # (bitwise mode is not there with tp: a restart on the same world reproduces fast mode too)
    "tp2": (2, ["--set", "parallel.tp=2", "--set", "parallel.determinism=fast"]),
    "dp2xpp2": (4, ["--set", "parallel.pp=2"]),
}
KINDS = ["exit", "hang", "stop", "hang-start", "crash-save", "mpirun-kill", "term-resume", "term2-resume",
         "launcher-kill", "damage", "state-step", "latest-fifo", "torn-metrics"]
DAMAGE = ("damage", "state-step", "latest-fifo", "torn-metrics")  # SIGTERM, then this, then a resume
CRASH_POINTS = ["tmp", "renamed", "latest_tmp", "latest", "retire"]
STEPS, EVERY = 24, 3
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
MPI_ARGS = ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "--mca", "btl", "self,vader"]


def digest(text):
    m = re.findall(r"digest sha256:[0-9a-f]+", text)
    return m[-1] if m else None


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rfind(")") + 2:].split()
        if int(rest[1]) == pid and rest[0] != "Z":
            out.append(int(d))
    return out


def tree(pid):
    """pid's live descendants"""
    out, todo = [], [pid]
    while todo:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
    except OSError:
        return False
    return st[st.rfind(")") + 2] != "Z"


def latest_step(ck):
    p = os.path.join(ck, "latest")
    if not os.path.isfile(p):  # missing, or the FIFO a latest-fifo fault left (an open would block)
        return -1
    try:
        with open(p) as f:
            return int(re.sub(r".*step_0*", "", f.read().strip()) or 0)
    except (OSError, ValueError):
        return -1


class Trial:
    def __init__(self, a):
        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="dtrain-chaos.")
        subprocess.run([a.dtrain, "prepare", "--fortune", "--input", os.path.join(a.src, "tests/data/tiny_corpus.txt"),
                        "--out", os.path.join(self.tmp, "c"), "--val-fraction", "0.1"], check=True,
                       stdout=subprocess.DEVNULL, env=ENV)
        self.base = ["--config", os.path.join(a.src, "tests/data/tiny.json"),
                     "--set", "data.train=%s/c_train.bin" % self.tmp, "--set", "data.val=%s/c_val.bin" % self.tmp,
                     "--steps", str(STEPS), "--threads", "1", "--seed", "1", "--set", "train.micro_batch=1",
                     "--set", "train.global_batch=8", "--set", "train.val_every=0", "--set", "log.sample_tokens=0",
                     "--set", "parallel.determinism=bitwise", "--digest"]
        self.refs = {}
        # faults that must fire once only ride on an mpirun wrapper: the first start gets them
        self.once = os.path.join(self.tmp, "mpirun-once.sh")
        with open(self.once, "w") as f:
            f.write('#!/bin/sh\nif [ -e "$CHAOS_MARK" ]; then unset DT_TEST_CRASH_AT; else : >"$CHAOS_MARK"; fi\n'
                    'exec mpirun "$@"\n')
        os.chmod(self.once, 0o755)

    def ref(self, layout):
        if layout not in self.refs:
            n, extra = LAYOUTS[layout]
            r = subprocess.run(["mpirun", "-np", str(n)] + MPI_ARGS + [self.a.dtrain, "train"] + self.base + extra,
                               capture_output=True, text=True, env=ENV, timeout=600)
            self.refs[layout] = digest(r.stdout + r.stderr)
            if r.returncode or not self.refs[layout]:
                sys.exit("chaos: the uninterrupted %s run failed: %s" % (layout, (r.stdout + r.stderr)[-2000:]))
        return self.refs[layout]

    def launch(self, job, n, extra, env, launch_opts=()):
        cmd = [self.a.dtrain, "launch", "-n", str(n), "--restart-delay", "0.2", "--max-restarts", "3",
               "--mpirun", self.once] + [x for m in MPI_ARGS for x in ("--mpi-arg", m)] + list(launch_opts) + \
              ["--", "train"] + self.base + extra + ["--save", job["ck"], "--save-every", str(EVERY),
                                                     "--metrics", job["metrics"]]
        if job.get("resume"):
            cmd += ["--resume", job["ck"]]
        out = open(os.path.join(job["dir"], "out%d.txt" % job["starts"]), "w")
        job["starts"] += 1
        self.current = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self.current

    def stop(self):
        """ends the running job, if any (the trial was interrupted)"""
        p = getattr(self, "current", None)
        if p and p.poll() is None:
            for c in tree(p.pid):
                os.kill(c, signal.SIGKILL)
            p.kill()
            p.wait()

    def wait(self, p, until):
        while p.poll() is None:
            if time.time() > until:
                for c in tree(p.pid):
                    os.kill(c, signal.SIGKILL)
                p.kill()
                p.wait()
                return None
            time.sleep(0.05)
        return p.returncode

    def wait_latest(self, job, p, step, until):
        while latest_step(job["ck"]) < step and p.poll() is None and time.time() < until:
            time.sleep(0.02)
        return p.poll() is None

    def run(self, i, kind, layout, rng):
        n, extra = LAYOUTS[layout]
        d = os.path.join(self.tmp, "job%03d" % i)
        os.makedirs(d)
        job = {"dir": d, "ck": os.path.join(d, "ck"), "starts": 0, "metrics": os.path.join(d, "m.jsonl")}
        env = dict(ENV, CHAOS_MARK=os.path.join(d, "mark"), DT_TEST_FAULT_ONCE=os.path.join(d, "once"))
        until = time.time() + self.a.timeout
        step, rank = rng.randrange(1, STEPS), rng.randrange(n)
        opts = ["--heartbeat-timeout", "3"]
        what = ""
        if kind in ("exit", "hang", "stop"):
            env["DT_TEST_FAULT"] = "%s:%d:%d" % (kind, step, rank)
            what = "rank %d after step %d" % (rank, step)
        elif kind == "hang-start":
            env["DT_TEST_FAULT"] = "hang:start:%d" % rank
            opts = ["--heartbeat-timeout", "2", "--startup-timeout", "10"]
            what = "rank %d" % rank
        elif kind == "crash-save":
            point, step = rng.choice(CRASH_POINTS), EVERY * rng.randrange(1, STEPS // EVERY)
            env["DT_TEST_CRASH_AT"] = "%s:%d" % (point, step)
            what = "%s at step %d" % (point, step)
        keep = 1 if kind == "crash-save" and "retire" in what else rng.choice([0, 1, 2])
        if kind in DAMAGE:  # an older step to fall back to
            keep = rng.choice([0, 2])
        if keep:
            extra = extra + ["--set", "checkpoint.keep_last=%d" % keep]
        p = self.launch(job, n, extra, env, opts)
        fired = True
        if kind in ("mpirun-kill", "term-resume", "term2-resume", "launcher-kill") + DAMAGE:
            # a damage needs an older step to fall back to, and lands before the tiny job ends
            at = 2 * EVERY + rng.randrange(EVERY) if kind in DAMAGE else rng.randrange(EVERY, STEPS - 2 * EVERY)
            fired = self.wait_latest(job, p, at, until)
            what = "after step %d saved" % latest_step(job["ck"])
        if keep:
            what += " (keep_last=%d)" % keep
        if fired and kind == "mpirun-kill":
            for c in children(p.pid):
                os.kill(c, signal.SIGKILL)
        elif fired and kind in ("term-resume",) + DAMAGE:
            p.send_signal(signal.SIGTERM)
        elif fired and kind == "term2-resume":
            p.send_signal(signal.SIGTERM)
            time.sleep(0.05)
            p.send_signal(signal.SIGTERM)
        elif fired and kind == "launcher-kill":
            procs = tree(p.pid)
            p.kill()
            p.wait()
            t0 = time.time()
            while any(alive(q) for q in procs) and time.time() - t0 < 3:
                time.sleep(0.05)
            left = [q for q in procs if alive(q)]
            for q in left:
                os.kill(q, signal.SIGKILL)
            if left:
                return what, "FAIL: processes %s outlived the killed launcher by 3 s" % left
        rc = self.wait(p, until)
        if rc is None:
            return what, "FAIL: timeout (%d s)" % self.a.timeout
        if fired and rc == 0 and kind in ("term-resume", "term2-resume") + DAMAGE:
            fired = False  # the job ended first
        if fired and kind in ("term-resume", "term2-resume", "launcher-kill") + DAMAGE:
            if kind != "launcher-kill" and rc != 128 + signal.SIGTERM:
                return what, "FAIL: exit %d after SIGTERM (want 143)" % rc
            job["resume"] = latest_step(job["ck"]) >= 0
            if kind in DAMAGE:
                what = "%s at step %d%s" % (kind, latest_step(job["ck"]), " (keep_last=%d)" % keep if keep else "")
                self.damage(job, kind)
            env.pop("DT_TEST_FAULT", None)
            p = self.launch(job, n, extra, env, opts)
            rc = self.wait(p, until)
            if rc is None:
                return what, "FAIL: timeout after the resume (%d s)" % self.a.timeout
        outs = [open(os.path.join(d, "out%d.txt" % k)).read() for k in range(job["starts"])]
        got = digest(outs[-1])
        restarts = sum(len(re.findall(r"^dtrain launch: restart \d", o, re.M)) for o in outs)
        if kind in ("exit", "hang", "stop", "hang-start", "crash-save", "mpirun-kill"):
            fired = fired and restarts > 0
        if rc != 0:
            return what, "FAIL: exit %d: %s" % (rc, " | ".join(l for l in outs[-1].splitlines() if "error" in l)[-300:])
        if fired and kind == "torn-metrics":
            r = subprocess.run([self.a.dtrain, "report", job["metrics"], "--out", os.path.join(d, "r.html")],
                               capture_output=True, text=True, env=ENV, timeout=60)
            if r.returncode != 0 or "torn line" not in r.stderr:
                return what, "FAIL: report of the torn metrics: exit %d: %s" % (r.returncode, r.stderr.strip()[-300:])
        if got != self.ref(layout):
            return what, "FAIL: digest %s, want %s" % (got, self.ref(layout))
        return what, "ok (%d restart%s%s)" % (restarts, "" if restarts == 1 else "s",
                                              ", resumed" if job.get("resume") else "" if fired else ", fault missed")

    def damage(self, job, kind):
        """what a crash, a full disk or a bad disk leaves behind, before the resume"""
        latest = os.path.join(job["ck"], "latest")
        with open(latest) as f:
            step_dir = os.path.join(job["ck"], f.read().strip())
        if kind == "damage":  # a flipped byte in the middle of the newest step's largest file
            files = [os.path.join(step_dir, x) for x in os.listdir(step_dir)]
            big = max(files, key=os.path.getsize)
            with open(big, "r+b") as f:
                f.seek(os.path.getsize(big) // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0xFF]))
        elif kind == "state-step":  # the state of another step under this step's name
            p = os.path.join(step_dir, "trainer_state.json")
            with open(p) as f:
                text = f.read()
            with open(p, "w") as f:
                f.write(re.sub(r'"step":\s*(\d+)', lambda m: '"step": %d' % (int(m.group(1)) - 1), text, count=1))
        elif kind == "latest-fifo":
            os.remove(latest)
            os.mkfifo(latest)
        elif kind == "torn-metrics":  # a full disk cut the last line short
            with open(job["metrics"], "r+b") as f:
                size = os.path.getsize(job["metrics"])
                f.truncate(size - 7)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtrain", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=2 * len(KINDS), help="jobs (one fault each; the default: each kind twice)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds a job may take")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--keep", action="store_true", help="keep the trial's directory")
    a = ap.parse_args()
    a.dtrain = os.path.abspath(a.dtrain)
    rng = random.Random(a.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("chaos: terminated"))
    trial = Trial(a)
    layouts, kinds = a.layouts.split(","), a.kinds.split(",")
    rows, t0 = [], time.time()
    print("chaos: seed %d, %d jobs over %s" % (a.seed, a.count, ", ".join(layouts)), flush=True)
    try:
        for i in range(a.count):
            # every kind and layout in turn, then at random
            kind = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
            layout = layouts[i % len(layouts)] if i < len(kinds) else rng.choice(layouts)
            trial.ref(layout)
            s = time.time()
            what, outcome = trial.run(i, kind, layout, rng)
            rows.append((i, layout, kind, what, outcome, time.time() - s))
            print("%3d  %-9s %-13s %-28s %5.1f s  %s" % (i, layout, kind, what, time.time() - s, outcome), flush=True)
    finally:
        trial.stop()
        if not a.keep:
            shutil.rmtree(trial.tmp, ignore_errors=True)
    print("\nfault           jobs  injected  ok  failed")
    for k in sorted({r[2] for r in rows}):
        mine = [r for r in rows if r[2] == k]
        ok = sum(r[4].startswith("ok") for r in mine)
        print("%-15s %4d %9d %3d %7d" % (k, len(mine), sum("fault missed" not in r[4] for r in mine), ok,
                                          len(mine) - ok))
    bad = [r for r in rows if not r[4].startswith("ok")]
    print("%d jobs, %d faults injected, %d passed, %d failed, %.0f s" %
          (len(rows), sum("fault missed" not in r[4] for r in rows), len(rows) - len(bad), len(bad), time.time() - t0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
