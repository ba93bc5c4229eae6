# dtrain report (interface.md, "Other commands"): real runs overlaid in one
# self-contained HTML page, one polyline per run in every plot, legends naming the runs,
# a run resumed into the same metrics file drawn as the uninterrupted one; bad input
# exits 2 with one line naming the file and leaves an existing report untouched.
source "$(dirname "$0")/lib.sh"
prepare_tiny
"$DTRAIN" train "${TINY[@]}" --steps 12 --metrics "$TMP/lr3e-3.jsonl" >/dev/null 2>&1 || fail "train lr 3e-3"
"$DTRAIN" train "${TINY[@]}" --steps 12 --set train.lr=1e-3 --metrics "$TMP/lr1e-3.jsonl" >/dev/null 2>&1 \
  || fail "train lr 1e-3"
# the lr 3e-3 run again, stopped after 9 steps and resumed from step 6 into the same file (steps 7-9 twice)
"$DTRAIN" train "${TINY[@]}" --steps 12 --set train.stop_after=9 --save "$TMP/ck" --save-every 6 \
  --metrics "$TMP/resumed.jsonl" >/dev/null 2>&1 || fail "first part of the resumed run"
"$DTRAIN" train "${TINY[@]}" --steps 12 --resume "$TMP/ck/step_00000006" --metrics "$TMP/resumed.jsonl" \
  >/dev/null 2>&1 || fail "resumed part"

"$DTRAIN" report --help | grep -q "usage: dtrain report" && pass "report --help" || fail "report --help"
"$DTRAIN" --help | grep -q "^  report " && pass "report in dtrain --help" || fail "dtrain --help lacks report"

"$DTRAIN" report "$TMP/lr3e-3.jsonl" "$TMP/lr1e-3.jsonl" "$TMP/resumed.jsonl" --out "$TMP/r.html" >"$TMP/out" 2>&1 \
  && grep -q "^report: 3 runs" "$TMP/out" && pass "report of three runs" || fail "report: $(cat "$TMP/out")"
python3 - "$TMP/r.html" "$TMP/lr3e-3.jsonl" <<'PY' && pass "page: self-contained, 7 plots x 3 polylines, legends, memory bars, resumed = straight" || fail "page content"
import json, re, sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
page = open(sys.argv[1]).read()
runs = ["lr3e-3", "lr1e-3", "resumed"]
# self-contained: nothing fetched, no scripts, no external style sheets or fonts
assert not re.search(r'(src|href)\s*=', page, re.I), "src/href attribute"
assert not re.search(r'https?://', page), "URL in the page"
assert "<script" not in page and "<link" not in page and "@import" not in page and "url(" not in page
class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.svg = None; self.plots = {}; self.text = False
    def handle_starttag(self, tag, a):
        a = dict(a)
        if tag == "svg": self.svg = a["id"]; self.plots[self.svg] = {"cls": a["class"], "lines": [], "legend": [], "bars": 0}
        elif tag == "polyline": self.plots[self.svg]["lines"].append((a["data-run"], a["points"]))
        elif tag == "rect" and a.get("class") == "bar": self.plots[self.svg]["bars"] += 1
        elif tag == "g" and a.get("class") == "legend": self.text = True
    def handle_endtag(self, tag):
        if tag == "g": self.text = False
        if tag == "svg": self.svg = None
    def handle_data(self, d):
        if self.text and self.svg: self.plots[self.svg]["legend"].append(d)
p = P(); p.feed(page)
line_plots = {k: v for k, v in p.plots.items() if v["cls"] == "plot"}
assert sorted(line_plots) == sorted(["train-loss-steps", "train-loss-tokens", "val-loss-steps", "val-loss-tokens",
                                     "lr", "grad-norm", "tokens-per-s", "mfu"]), sorted(line_plots)
for k, v in line_plots.items():
    assert [r for r, _ in v["lines"]] == runs, (k, v["lines"])
    assert v["legend"] == runs, (k, v["legend"])
    for r, pts in v["lines"]:
        xy = [tuple(map(float, q.split(","))) for q in pts.split()]
        # val_every 5 and at the end: steps 5, 10, 12; the resumed run also validated at 9 when it stopped
        want = (4 if r == "resumed" else 3) if k.startswith("val") else 12
        assert len(xy) == want, (k, r, len(xy))
        assert all(a[0] < b[0] for a, b in zip(xy, xy[1:])), (k, r, "x not increasing")
        assert all(0 <= x <= 500 and 0 <= y <= 300 for x, y in xy), (k, r, "outside the chart")
    # the resumed run (steps 7-9 written twice) is drawn exactly as the straight run
    if k in ("train-loss-steps", "train-loss-tokens", "lr", "grad-norm"):
        assert v["lines"][2][1] == v["lines"][0][1], (k, "resumed differs from straight")
    # different learning rates: different curves
    assert v["lines"][1][1] != v["lines"][0][1] or k in ("tokens-per-s", "mfu"), k
bars = {k: v for k, v in p.plots.items() if v["cls"] == "bars"}
assert len(bars) == 3 and all(v["bars"] == 6 for v in bars.values()), bars  # 1 rank x 6 categories
# every chart is well-formed XML
for svg in re.findall(r"<svg .*?</svg>", page, re.S):
    ET.fromstring(svg)
# the table reports the file's final loss
final = [json.loads(l) for l in open(sys.argv[2])][-1]["final_loss"]
row = re.search(r"lr3e-3</td><td>12</td><td>([0-9.]+)</td>", page)
assert row and abs(float(row.group(1)) - final) < 1e-4, (row and row.group(1), final)
PY

# bad input: exit 2, one stderr line naming the file (and line); the existing page stays
cp "$TMP/r.html" "$TMP/r.keep"
printf '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\nnot json\n' >"$TMP/bad.jsonl"
printf '{"event": "summary", "steps": 0}\n' >"$TMP/nosteps.jsonl"
mkdir -p "$TMP/ro"
expect_error() { # expect_error NAME PATTERN ARGS...: exit 2 and one stderr line matching PATTERN
  local name="$1" pat="$2"; shift 2
  "$DTRAIN" report "$@" >"$TMP/eo" 2>"$TMP/ee"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/ee")" -eq 1 ] && grep -q -- "$pat" "$TMP/ee" && [ ! -s "$TMP/eo" ]; then
    pass "$name: $(cat "$TMP/ee")"
  else
    fail "$name: rc $rc, stderr: $(cat "$TMP/ee")"
  fi
}
expect_error "missing file" "$TMP/nope.jsonl" "$TMP/lr3e-3.jsonl" "$TMP/nope.jsonl" --out "$TMP/r.html"
expect_error "bad JSON line" "bad.jsonl:3: not valid JSON" "$TMP/bad.jsonl" --out "$TMP/r.html"
# a killed run's file ends mid-line: plotted without that line, with one warning
head -c -20 "$TMP/lr3e-3.jsonl" >"$TMP/torn.jsonl"
"$DTRAIN" report "$TMP/torn.jsonl" --out "$TMP/torn.html" >/dev/null 2>"$TMP/te" && [ -s "$TMP/torn.html" ] \
  && [ "$(wc -l <"$TMP/te")" -eq 1 ] && grep -q "warning: .*torn.jsonl: the last line is cut short" "$TMP/te" \
  && pass "torn last line skipped with a warning" || fail "torn last line: $(cat "$TMP/te")"
expect_error "no step rows" "nosteps.jsonl: no step rows" "$TMP/nosteps.jsonl" --out "$TMP/r.html"
expect_error "missing --out" "--out FILE.html is required" "$TMP/lr3e-3.jsonl"
expect_error "--out without value" "needs a value" "$TMP/lr3e-3.jsonl" --out
expect_error "no inputs" "no metrics files" --out "$TMP/r.html"
expect_error "unknown option" "unknown option '--bogus'" "$TMP/lr3e-3.jsonl" --bogus --out "$TMP/r.html"
expect_error "output directory missing" "$TMP/no/such/dir" "$TMP/lr3e-3.jsonl" --out "$TMP/no/such/dir/r.html"
expect_error "output is a directory" "is a directory" "$TMP/lr3e-3.jsonl" --out "$TMP/ro"
if [ "$(id -u)" -ne 0 ]; then
  chmod 555 "$TMP/ro"
  expect_error "unwritable directory" "not writable" "$TMP/lr3e-3.jsonl" --out "$TMP/ro/r.html"
  chmod 755 "$TMP/ro"
fi
cmp -s "$TMP/r.html" "$TMP/r.keep" && pass "failed runs leave the existing page untouched" || fail "page changed"
ls "$TMP" | grep -q '\.tmp\.' && fail "temporary file left: $(ls "$TMP")" || pass "no temporary files left"

# a long run stays fast and small: 100k steps (nulls, a resume that rewrites steps, an
# unknown event, a loss spike) downsampled to <= 2000 points per line, the spike kept
python3 - "$TMP/long.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(1, 100001):
        loss = None if s % 997 == 0 else 9.0 if s == 43210 else 3 + 2.0 / (1 + s / 1000)
        f.write(json.dumps({"step": s, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1e4,
                            "ms": 25.6}) + "\n")
    f.write('{"event": "resume", "step": 80000}\n{"event": "future_event", "x": [1, 2]}\n')
    for s in range(80001, 100001):
        f.write(json.dumps({"step": s, "loss": 2.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1e4, "ms": 25.6,
                            "tokens": 256 * s}) + "\n")
PY
start=$(date +%s.%N)
"$DTRAIN" report "$TMP/long.jsonl" "$TMP/lr3e-3.jsonl" --out "$TMP/long.html" >"$TMP/out" 2>&1 || fail "long report: $(cat "$TMP/out")"
secs=$(python3 -c "import time; print('%.2f' % (time.time() - $start))")
python3 - "$TMP/long.html" "$secs" <<'PY' && pass "100k steps in ${secs}s: downsampled, spike and resume marker kept" || fail "long run"
import re, sys
page, secs = open(sys.argv[1]).read(), float(sys.argv[2])
assert secs < 60, secs  # well under 1 s in a release build; a quadratic step would take minutes
svg = re.search(r'<svg class="plot" id="train-loss-steps".*?</svg>', page, re.S).group(0)
lines = re.findall(r'<polyline[^>]*data-run="([^"]*)"[^>]*points="([^"]*)"', svg)
assert [r for r, _ in lines] == ["long", "lr3e-3"], lines
pts = [tuple(map(float, q.split(","))) for q in lines[0][1].split()]
assert 1000 <= len(pts) <= 2000, len(pts)
ys = sorted(y for _, y in pts)  # the spike (9.0; the rest is at most 5) stands far above every other point
assert ys[1] - ys[0] > 50, ys[:3]
assert svg.count('class="mark"') == 1, "resume marker"
# the resumed rows (loss 2.0 from step 80001) replaced the first ones: the last points are flat
assert len(set(y for _, y in pts[-50:])) == 1, pts[-50:]
PY
finish
