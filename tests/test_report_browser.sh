# dtrain report in a real browser (Debian's chromium, headless): the page of two real
# runs loads without errors, every plot renders one visible polyline per run, and the
# screenshot shows both runs' colours in quantity. Skipped (77) without chromium.
source "$(dirname "$0")/lib.sh"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  echo "skip: chromium is not installed (scripts/deps.sh installs it)"; exit 77
fi
# headless chromium wants a writable home for its profile; keep it inside $TMP
export HOME="$TMP/home"; mkdir -p "$HOME"
browse() { timeout 120 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
  --user-data-dir="$TMP/profile" "$@"; }
prepare_tiny
"$DTRAIN" train "${TINY[@]}" --steps 12 --metrics "$TMP/lr3e-3.jsonl" >/dev/null 2>&1 || fail "train lr 3e-3"
"$DTRAIN" train "${TINY[@]}" --steps 12 --set train.lr=1e-3 --metrics "$TMP/lr1e-3.jsonl" >/dev/null 2>&1 \
  || fail "train lr 1e-3"
"$DTRAIN" report "$TMP/lr3e-3.jsonl" "$TMP/lr1e-3.jsonl" --out "$TMP/r.html" >/dev/null || fail "report"

# 1. the page as written: no console messages, the rendered DOM has the polylines
browse --enable-logging=stderr --v=0 --dump-dom "file://$TMP/r.html" >"$TMP/dom.html" 2>"$TMP/console.log"
if [ -s "$TMP/dom.html" ] && ! grep -q ':CONSOLE' "$TMP/console.log"; then pass "page loads, no console messages"
else fail "console: $(grep ':CONSOLE' "$TMP/console.log" | head -3)"; fi

# 2. an instrumented copy: a probe script (the page itself has none) records errors and
# each polyline's rendered bounding box after load
python3 - "$TMP/r.html" "$TMP/probe.html" <<'PY'
import sys
page = open(sys.argv[1]).read()
probe = """<script>
var errs = [];
window.addEventListener('error', function (e) { errs.push(e.message || 'failed to load ' + (e.target.src || e.target.href)); }, true);
var ce = console.error; console.error = function () { errs.push([].join.call(arguments, ' ')); ce.apply(console, arguments); };
window.addEventListener('load', function () {
  var out = [];
  document.querySelectorAll('svg.plot').forEach(function (svg) {
    svg.querySelectorAll('polyline').forEach(function (l) {
      var b = l.getBBox();
      out.push(svg.id + '/' + l.getAttribute('data-run') + '/' + l.points.length + '/' + b.width.toFixed(1) + '/' + b.height.toFixed(1));
    });
  });
  document.body.setAttribute('data-errors', JSON.stringify(errs));
  document.body.setAttribute('data-boxes', out.join(' '));
});
</script>"""
assert "<head>" in page
open(sys.argv[2], "w").write(page.replace("<head>", "<head>" + probe, 1))
PY
browse --dump-dom "file://$TMP/probe.html" >"$TMP/probe_dom.html" 2>/dev/null
python3 - "$TMP/dom.html" "$TMP/probe_dom.html" <<'PY' && pass "rendered: 8 plots x 2 visible polylines (MFU included), no script errors" || fail "rendered DOM"
import sys
from html.parser import HTMLParser
class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.svg = None; self.lines = {}; self.body = {}
    def handle_starttag(self, tag, a):
        a = dict(a)
        if tag == "body": self.body = a
        if tag == "svg" and a.get("class") == "plot": self.svg = a["id"]; self.lines[self.svg] = []
        if tag == "polyline" and self.svg: self.lines[self.svg].append((a["data-run"], a.get("points", "")))
    def handle_endtag(self, tag):
        if tag == "svg": self.svg = None
dom = P(); dom.feed(open(sys.argv[1]).read())
assert len(dom.lines) == 8, sorted(dom.lines)
for plot, lines in dom.lines.items():
    assert [r for r, _ in lines] == ["lr3e-3", "lr1e-3"], (plot, lines)
    assert all(len(p.split()) >= 3 for _, p in lines), (plot, "empty points")
probe = P(); probe.feed(open(sys.argv[2]).read())
assert probe.body.get("data-errors") == "[]", probe.body.get("data-errors")
boxes = [b.split("/") for b in probe.body["data-boxes"].split()]
assert len(boxes) == 16, boxes
lines = {(plot, run): pts for plot, ls in dom.lines.items() for run, pts in ls}
for plot, run, n, w, h in boxes:
    # a line across the whole x range (the chart is 500 wide, the plot area about 420);
    # the timing plots may be flat on a loaded machine (one slow or fast step sets the
    # scale), the others must rise or fall
    timed = plot in ("tokens-per-s", "mfu")
    assert int(n) >= 3 and float(w) > 300 and (timed or float(h) > 0), (plot, run, n, w, h, lines[(plot, run)])
    if float(h) == 0: print("note: %s/%s is flat: %s" % (plot, run, lines[(plot, run)]))
print("polyline boxes:", " ".join("%s:%sx%s" % (b[0][:9], b[3], b[4]) for b in boxes[:4]), "...")
PY

# 3. the screenshot: not blank, and each run's colour drawn in quantity (legend swatches,
# table swatch, lines); decoded with the standard library only
browse --screenshot="$TMP/r.png" --window-size=1200,2400 "file://$TMP/r.html" >/dev/null 2>&1
python3 - "$TMP/r.png" <<'PY' && pass "screenshot shows both runs" || fail "screenshot"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, hdr = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR": hdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT": idat += body
    pos += 12 + n
w, h, depth, ctype, _, _, interlace = hdr
assert depth == 8 and ctype in (2, 6) and interlace == 0, hdr
bpp = 3 if ctype == 2 else 4
raw, stride = zlib.decompress(idat), w * bpp
rows, prev = [], bytearray(stride)
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if f == 1:
        for i in range(bpp, stride): line[i] = (line[i] + line[i - bpp]) & 255
    elif f == 2:
        line = bytearray((a + b) & 255 for a, b in zip(line, prev))
    elif f == 3:
        for i in range(stride): line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
    elif f == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0; b = prev[i]; c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line)); prev = line
counts = {}
for line in rows:
    for i in range(0, stride, bpp):
        px = line[i:i + 3]
        counts[px] = counts.get(px, 0) + 1
total = w * h
bg = max(counts.values())
assert total - bg > total // 20, "blank page: %d of %d pixels differ from the background" % (total - bg, total)
def near(rgb, tol=24):
    return sum(c for px, c in counts.items() if sum(abs(a - b) for a, b in zip(px, rgb)) <= tol)
runs = {"lr3e-3": (0x1f, 0x77, 0xb4), "lr1e-3": (0xff, 0x7f, 0x0e)}
got = {r: near(rgb) for r, rgb in runs.items()}
print("%dx%d, %d colours, run colour pixels: %s" % (w, h, len(counts), got))
# 7 legends x 144 swatch pixels alone are 1008
assert all(v >= 1500 for v in got.values()), got
PY
finish
