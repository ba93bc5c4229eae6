#!/usr/bin/env bash
# Randomised-layout sweep before and after a change (issue 25's acceptance: "the same results
# as before: 0 failures, the same refusals").
#
#   bench/sweep_compare.sh run DTRAIN OUTDIR [SRCDIR]
#       runs tests/layout_sweep.py (SRCDIR's copy and test data; default: this checkout) with
#       DTRAIN once per seed and saves each seed's one-line-per-case results as
#       OUTDIR/seed-S.txt (the case logs of a seed with failures stay in OUTDIR/logs-S/).
#       A seed whose file already ends with the sweep's summary line is skipped, so an
#       interrupted run resumes where it stopped. Prints the summary over all seeds.
#   bench/sweep_compare.sh compare DIR_A DIR_B
#       case by case: the same case drawn (its description), the same outcome (ok / refused /
#       REF-REFUSED / FAIL), the same refusal message, and 0 failures in either; prints the
#       totals of each, every difference and every failure both share; exit 1 if any.
#   bench/sweep_compare.sh summary OUTDIR
#       the totals of one result directory.
# knobs (environment): SEEDS="1 2 3 4 5 6", CASES=50 (per seed; 6 x 50 = 300 cases),
#   MAX_RANKS=8, STEPS=6 (layout_sweep.py's defaults), NICE=0 (e.g. 10 beside other work).
# Same seed = same cases, so two binaries run with the same SEEDS/CASES are comparable;
# the sweep's per-case numbers (worst relative difference) are shown, not compared.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SEEDS=${SEEDS:-"1 2 3 4 5 6"}
CASES=${CASES:-50}
MAX_RANKS=${MAX_RANKS:-8}
STEPS=${STEPS:-6}
NICE=${NICE:-0}
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# summary DIR: cases, passed, refused (by the layout run or by the reference), failed
summary() {
  cat "$1"/seed-*.txt 2>/dev/null | awk -v d="$1" '
    /^ok /{p++} /^refused /{r++} /^REF-REFUSED /{rr++} /^FAIL /{f++}
    END {printf "%s: %d cases: %d passed, %d refused (%d of them by the single-process reference), %d failed\n",
         d, p + r + rr + f, p, r + rr, rr, f}'
}

cmd_run() {
  [ $# -ge 2 ] || usage
  local dtrain src out s f
  dtrain="$(realpath "$1")"; out="$2"; src="$(realpath "${3:-$here/..}")"
  [ -x "$dtrain" ] || { echo "sweep_compare: no binary '$dtrain'" >&2; exit 2; }
  [ -f "$src/tests/layout_sweep.py" ] || { echo "sweep_compare: no tests/layout_sweep.py under '$src'" >&2; exit 2; }
  mkdir -p "$out"
  echo "binary $dtrain, sweep $src/tests/layout_sweep.py, seeds $SEEDS, $CASES cases each, max $MAX_RANKS ranks" \
    >"$out/README"
  for s in $SEEDS; do
    f="$out/seed-$s.txt"
    if [ -f "$f" ] && tail -1 "$f" | grep -q ' passed, .* refused, .* failed'; then
      echo "seed $s: done before ($(tail -1 "$f"))"; continue
    fi
    echo "seed $s: $CASES cases ($(date -u +%H:%M:%S))"
    rm -rf "$out/logs-$s"
    # The sweep removes its logs when nothing failed; --keep holds them, so drop them here then.
    nice -n "$NICE" python3 "$src/tests/layout_sweep.py" "$dtrain" "$src" --cases "$CASES" --seed "$s" \
      --max-ranks "$MAX_RANKS" --steps "$STEPS" --keep "$out/logs-$s" >"$f.part" 2>&1 || true
    mv "$f.part" "$f"
    if grep -q '^FAIL ' "$f" || ! tail -1 "$f" | grep -q ' passed, '; then
      echo "seed $s: failures or an incomplete sweep, logs kept in $out/logs-$s"
    else
      rm -rf "$out/logs-$s"
    fi
    echo "seed $s: $(tail -1 "$f" | sed 's/ (logs in.*//')"
  done
  summary "$out"
}

cmd_compare() {
  [ $# -eq 2 ] || usage
  summary "$1"; summary "$2"
  python3 - "$1" "$2" <<'PY'
import glob, os, re, sys
def load(d):
    """seed -> {case: (outcome, description, refusal message)}, and whether each seed finished."""
    res, done = {}, {}
    for f in sorted(glob.glob(os.path.join(d, "seed-*.txt"))):
        seed = re.search(r"seed-(\w+)\.txt$", f).group(1)
        cases = res.setdefault(seed, {})
        lines = open(f, errors="replace").read().splitlines()
        done[seed] = bool(lines) and re.search(r" passed, \d+ refused, \d+ failed", lines[-1]) is not None
        for l in lines:
            m = re.match(r"^(ok|refused|REF-REFUSED|FAIL)\s+(case\d+)(?: np \d+)?(?: rc \S+)?: (.*)$", l)
            if not m:
                continue
            out, case, rest = m.groups()
            if out == "ok":  # "desc | worst": the worst relative difference is shown, not compared
                desc, msg = rest.rsplit(" | ", 1)[0], ""
            elif out == "FAIL":  # "desc | problems" (desc may hold " | resumed after ...")
                desc, msg = rest.rsplit(" | ", 1)
            else:  # refused: "desc | dtrain: error ..."; REF-REFUSED: "desc | [last line]"
                desc, _, msg = rest.partition(" | ")
            # the case drawn is what precedes " | resumed after ..."; the resumed half (its
            # layout, and its refusal if any) belongs to the outcome
            desc, sep, resumed = desc.partition(" | resumed")
            if sep:
                msg = (msg + " " if msg else "") + "| resumed" + resumed
            cases[case] = (out, desc, msg)
    return res, done
(a, da), (b, db) = load(sys.argv[1]), load(sys.argv[2])
diffs, both = [], []  # both: the same failure in both directories (still not "0 failures")
for seed in sorted(set(a) | set(b), key=lambda s: (len(s), s)):
    if seed not in a or seed not in b:
        diffs.append("seed %s: only in %s" % (seed, sys.argv[1] if seed in a else sys.argv[2])); continue
    for d, n in ((da, sys.argv[1]), (db, sys.argv[2])):
        if not d[seed]:
            diffs.append("seed %s: sweep in %s did not finish" % (seed, n))
    A, B = a[seed], b[seed]
    for case in sorted(set(A) | set(B)):
        if case not in A or case not in B:
            diffs.append("seed %s %s: only in %s" % (seed, case, sys.argv[1] if case in A else sys.argv[2])); continue
        (oa, xa, ma), (ob, xb, mb) = A[case], B[case]
        if xa != xb:
            diffs.append("seed %s %s: a different case drawn:\n  %s\n  %s" % (seed, case, xa, xb))
        elif oa != ob or ma != mb:
            diffs.append("seed %s %s: %s %s\n  vs %s %s" % (seed, case, oa, ma, ob, mb))
        elif oa == "FAIL":
            both.append("seed %s %s: %s" % (seed, case, ma))
n = sum(len(c) for c in a.values())
for d in diffs:
    print("DIFFERENT " + d)
for d in both:
    print("FAILS IN BOTH " + d)
print("%d cases over %d seeds compared: %d difference(s) in outcome or refusal, %d case(s) failing in both%s" % (
    n, len(a), len(diffs), len(both), "" if diffs or both else ": same outcomes and refusals, 0 failures"))
sys.exit(1 if diffs or both else 0)
PY
}

case "${1:-}" in
run) shift; cmd_run "$@" ;;
compare) shift; cmd_compare "$@" ;;
summary) shift; [ $# -eq 1 ] || usage; summary "$1" ;;
*) usage ;;
esac
