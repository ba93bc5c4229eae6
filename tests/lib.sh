# Shared helpers for the CLI tests: bash tests/test_X.sh <dtrain> <srcdir> <builddir>
DTRAIN="$1"; SRC="$2"; BUILD="$3"
DTRAIN_BIN="$1" # the binary itself (DTRAIN may become a wrapper below)
TMP="$(mktemp -d /tmp/dtrain-test.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
PASSED=0; FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok: $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*"; }
finish() { echo "$PASSED passed, $FAILED failed"; [ "$FAILED" -eq 0 ]; }
# The ASan pass (`make test-asan` sets DT_TEST_TIER=asan) runs each multi-rank test's
# core cases; `full` guards the cases that take a code path already taken again, with
# other sizes or knobs, which the Release pass runs.
full() { [ "${DT_TEST_TIER:-}" != asan ]; }
# LeakSanitizer's check at exit costs an Open MPI rank about a second, and the slow
# unwinder it needs there (fast_unwind_on_malloc=0: Open MPI has no frame pointers, so only
# a full stack reaches the libmpi frame its suppressions name) half a second more on every
# rank. In the ASan pass, rank 0 of each test's first mpirun run keeps both, and every
# single-process run; the other ranks and runs check memory errors only. Teardown is the
# same code on every rank (each stage, tp piece and replica frees through
# dt_pipeline_destroy, dt_dp_destroy, gpt_destroy), single-process runs check the whole
# model's, and each test's first multi-rank run (its main layout) checks the strategy's.
if ! full && [ -n "$DTRAIN" ]; then
  cat >"$TMP/dtrain" <<EOF
#!/bin/sh
if [ -n "\${OMPI_COMM_WORLD_RANK:-}" ] && ! { [ "\$OMPI_COMM_WORLD_RANK" = 0 ] && mkdir "$TMP/.leak-checked" 2>/dev/null; }; then
  ASAN_OPTIONS="\${ASAN_OPTIONS:+\$ASAN_OPTIONS:}detect_leaks=0"; LSAN_OPTIONS=; export ASAN_OPTIONS LSAN_OPTIONS
fi
exec "$(realpath "$DTRAIN")" "\$@"
EOF
  chmod +x "$TMP/dtrain" && DTRAIN="$TMP/dtrain"
fi
# Open MPI tries UCX, its default point-to-point layer, at every start (0.2 s of a 0.5 s
# two-rank run here); the tests' ranks share a node or an emulated host's TCP link, which
# ob1 (over vader and tcp) carries, so they skip the probe.
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
# OpenMP's default wait policy spins on a core between parallel regions; the tests that run
# several ranks with 2 or 3 threads each on two cores then wait for each other's spinning
# threads (a 1 s dp2 x cp2 run on 2 threads per rank took 47 s), so their threads sleep.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# MPI: the multi-rank tests' launcher command (oversubscribed on small machines); need_mpi:
# a multi-rank test skips (77) without mpirun, else runs it as root, one thread per rank
MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
need_mpi() {
  command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
}
# Tiny corpus token files: $TMP/c_train.bin, $TMP/c_val.bin
prepare_tiny() {
  "$DTRAIN" prepare --fortune --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/c" --val-fraction 0.1 >/dev/null
}
# Every kind of layout against the single process (NAME:RANKS:ARGS): dp2 (ps, DDP,
# ZeRO-1/2/3), tp2 (+sp), pp2 under each schedule, cp2 and dp2 x pp2 x tp2
PARITY_LAYOUTS=("dp2-ps:2:--set parallel.dp_mode=ps" "dp2-ddp:2:" "dp2-zero1:2:--set parallel.zero=1"
                "dp2-zero2:2:--set parallel.zero=2" "dp2-zero3:2:--set parallel.zero=3" "tp2:2:--set parallel.tp=2"
                "tp2-sp:2:--set parallel.tp=2 --set parallel.sp=true"
                "pp2-gpipe:2:--set parallel.pp=2 --set parallel.schedule=gpipe" "pp2-1f1b:2:--set parallel.pp=2"
                "pp2-interleaved:2:--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2"
                "pp2-zbh1:2:--set parallel.pp=2 --set parallel.schedule=zb-h1" "cp2:2:--set parallel.cp=2"
                "dp2xpp2xtp2:8:--set parallel.pp=2 --set parallel.tp=2")
# Prompt/completion documents of 2 to 60 tokens, prompts out of the loss: $TMP/d_train.bin,
# $TMP/d_val.bin (data seed 6: seed 5 has a gradient spike at step 12, norm 3.9 against 2.0,
# where fp32 summation order alone moves the norm by 6.6e-6; a parity test should compare
# implementations, not that)
prepare_prompt_docs() {
  python3 -c "
import json, random
r = random.Random(6)
for i in range(700):
    n = r.randint(1, 12)
    print(json.dumps({'prompt': 'Q%d ' % i + 'x' * r.randint(0, 10),
                      'completion': ' '.join('w%d' % r.randint(0, 50) for _ in range(n)) + '.'}))" >"$TMP/d.jsonl"
  "$DTRAIN" prepare --format prompt --input "$TMP/d.jsonl" --out "$TMP/d" --val-fraction 0.1 >"$TMP/prep.out" 2>&1 ||
    fail "prepare documents: $(tail -1 "$TMP/prep.out")"
}
TINY=(--config "$SRC/tests/data/tiny.json" --set "data.train=$TMP/c_train.bin" --set "data.val=$TMP/c_val.bin")
# alloc_is_estimate METRICS EST_JSON NRANKS: every one of the NRANKS ranks of a run (its
# metrics' summary) allocates what `dtrain estimate --json` (EST_JSON) says, to the byte
alloc_is_estimate() {
  python3 - "$@" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
want = json.load(open(sys.argv[2]))["stages"][0]["rank_bytes"]
got = [m["params"] + m["grads"] + m["optim"] + m["activations"] + m["workspace"] for m in summ["mem"]]
print("allocated %s, estimate %d" % (got, want))
sys.exit(0 if len(got) == int(sys.argv[3]) and all(g == want for g in got) else 1)
PY
}
digest_of() { grep -o 'digest sha256:[0-9a-f]*' "$1"; }
# dp_run NAME NP ARGS...: a DP_RUN (below) on NP ranks (the test's MPI launcher array) with
# its digest printed and its output and metrics in $TMP/NAME.out and $TMP/NAME.jsonl
dp_run() {
  local name=$1 np=$2; shift 2
  local cmd=("$DTRAIN" train "${DP_RUN[@]}" --digest --metrics "$TMP/$name.jsonl" "$@")
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  "${cmd[@]}" >"$TMP/$name.out" 2>&1 || echo "(run $name failed: $(grep -m1 error "$TMP/$name.out"))" >&2
  digest_of "$TMP/$name.out"
}
# The data-parallel parity run: 20 steps, global batch 8, validation at steps 10 and 20.
# Seed 1: with seed 42, step 15 has a gradient spike (norm 17 against ~1.3: token 70 at
# position 0) where micro-batch gradients cancel, and fp32 summation order alone moves
# the norm by 2.6e-5 relative; a parity test should compare implementations, not that.
DP_RUN=("${TINY[@]}" --steps 20 --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8
        --set train.val_every=10)
# compare_curves REF GOT: per-step loss and grad norm and both val losses of two DP_RUN
# metrics files within 1e-5 relative; prints the worst difference.
compare_curves() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p)]
    return {r["step"]: r for r in rows if "event" not in r}, [r["val_loss"] for r in rows if r.get("event") == "val"]
(ref, rv), (got, gv) = load(sys.argv[1]), load(sys.argv[2])
assert sorted(got) == sorted(ref) == list(range(1, 21)), sorted(got)
worst = 0.0
for s in ref:
    for k in ("loss", "grad_norm"):
        worst = max(worst, abs(got[s][k] - ref[s][k]) / abs(ref[s][k]))
for a, b in zip(rv, gv):
    worst = max(worst, abs(a - b) / abs(a))
assert len(rv) == len(gv) == 2, (rv, gv)
print("max rel diff %.2e" % worst)
sys.exit(0 if worst <= 1e-5 else 1)
PY
}

# The multi-rank layout tests (tp, pp) share these; they use the test's MPI launcher array
# and its base arguments in the array RUN.
# refused NAME PATTERN NP ARGS...: the layout is refused on every rank before any work:
# exit 2 within 120 s (no rank hangs) and one `dtrain: error` line matching PATTERN.
refused() {
  local name=$1 pat=$2 np=$3; shift 3
  timeout 120 "${MPI[@]}" -np "$np" "$DTRAIN" train "${RUN[@]}" "$@" >"$TMP/bad.out" 2>&1
  local rc=$? n; n=$(grep -c "^dtrain: error" "$TMP/bad.out")
  [ $rc -eq 2 ] && [ "$n" -eq 1 ] && grep -q "$pat" "$TMP/bad.out" && pass "$name: $(grep '^dtrain: error' "$TMP/bad.out")" ||
    fail "$name: rc $rc, $n error lines: $(tail -3 "$TMP/bad.out")"
}
# compare_resumed REF GOT: a run resumed after step 10 (GOT) has REF's steps 11-20, loss and
# grad norm within 1e-5 relative; prints the worst difference.
compare_resumed() {
  python3 - "$1" "$2" <<'PY'
import json, sys
ref, got = ({r["step"]: r for r in map(json.loads, open(p)) if "event" not in r} for p in sys.argv[1:3])
assert sorted(got) == list(range(11, 21)), sorted(got)
worst = max(abs(got[s][k] - ref[s][k]) / abs(ref[s][k]) for s in got for k in ("loss", "grad_norm"))
print("steps 11-20 within %.2e" % worst)
sys.exit(worst > 1e-5)
PY
}
# parity NAME NP REF ARGS...: RUN with ARGS on NP ranks (metrics and output in $TMP/NAME.*)
# gives the curve of the metrics file REF (compare_curves: within 1e-5 relative).
parity() {
  local name=$1 np=$2 ref=$3 r; shift 3
  if "${MPI[@]}" -np "$np" "$DTRAIN" train "${RUN[@]}" "$@" --metrics "$TMP/$name.jsonl" >"$TMP/$name.out" 2>&1; then
    r=$(compare_curves "$ref" "$TMP/$name.jsonl") && pass "$name matches single process ($r)" || fail "$name: $r"
  else
    fail "$name run: $(grep -v '^\[' "$TMP/$name.out" | tail -2)"
  fi
}
# same_initial_weights EXTRA -- NAME:NP:ARGS...: with RUN and the extra arguments (one word
# list before --), every layout's weights before training have the single-process digest.
same_initial_weights() {
  local extra=() lay name rest np args d d1
  while [ "$1" != -- ]; do extra+=("$1"); shift; done; shift
  d1=$("$DTRAIN" train "${RUN[@]}" "${extra[@]}" --steps 0 --set log.digest=true 2>&1 | grep -o 'sha256:[0-9a-f]*')
  for lay in "$@"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    d=$("${MPI[@]}" -np "$np" "$DTRAIN" train "${RUN[@]}" "${extra[@]}" --steps 0 --set log.digest=true $args 2>&1 |
        grep -o 'sha256:[0-9a-f]*')
    [ -n "$d1" ] && [ "$d" = "$d1" ] && pass "$name initial weights = single process ($d)" ||
      fail "$name initial: $d vs $d1"
  done
}
