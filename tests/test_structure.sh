# The tree keeps the shape issue 25 gave it (docs/architecture.md), checked on the sources
# alone (no build outputs): (a) no file in src/ above 700 lines; (b) no struct in
# src/parallel/ with more than 30 fields; (c) at most 5 data-parallel mode checks in code
# outside the strategy files and the layout value (a new mode is a table entry, not a
# branch); (d) no circular include among src/parallel/ files; (e) the trainer (src/train/)
# does not name tp, pp, cp or ZeRO (parallelize hides them). One line per violation.
# Usage: bash tests/test_structure.sh [dtrain] SRC [build] (only SRC is read).
SRC="${2:-$(dirname "$0")/..}"
python3 - "$SRC" <<'PY'
import os, re, sys

root = os.path.abspath(sys.argv[1])
src = os.path.join(root, "src")
MAX_LINES, MAX_FIELDS, MAX_MODE_CHECKS = 700, 30, 5
# The files allowed to branch on the mode: the strategies and their table, and the layout value.
STRATEGY = re.compile(r"src/parallel/data_parallel/(ps|ddp|flat|zero[^/]*|bitwise|strategy)\.[ch]$"
                      r"|src/parallel/layout/layout\.[ch]$")
MODE_CHECK = re.compile(r"\bis_zero|bitwise|\bdp_mode\b|\bzero >|\bzero ==|\.ps\b")
violations = []

def sources(top, exts=(".c", ".h", ".cu", ".cuh")):
    for d, _, files in os.walk(top):
        for f in sorted(files):
            if f.endswith(exts):
                yield os.path.join(d, f)

def rel(p):
    return os.path.relpath(p, root)

def strip_comments(text, strings=False):
    """Comments (and with strings, the contents of string and character literals: a
    message naming a mode is not a check of it) replaced by spaces; newlines kept, so
    line numbers hold."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j]) + c if strings else text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)

files = list(sources(src))
raw = {p: open(p, encoding="utf-8", errors="replace").read() for p in files}
code = {p: strip_comments(t) for p, t in raw.items()}

# (a) file length
for p in files:
    n = open(p, encoding="utf-8", errors="replace").read().count("\n")
    if n > MAX_LINES:
        violations.append("%s: %d lines (at most %d)" % (rel(p), n, MAX_LINES))

# (b) fields per struct: declarators at the struct's own depth (int a, b; is two; a nested
# struct or union is one field of its parent and is counted on its own)
def struct_fields(text, start):
    """Fields of the struct whose '{' is at start, and the index after its '}'."""
    fields, depth, paren, decl_has_name, i = 0, 0, 0, False, start
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return fields, i + 1
        elif depth == 1:
            if c == "(" or c == "[":
                paren += 1
            elif c == ")" or c == "]":
                paren -= 1
            elif paren == 0 and c in ",;":
                fields += 1
        i += 1
    return fields, i

for p in files:
    if not rel(p).startswith("src/parallel/"):
        continue
    text = code[p]
    for m in re.finditer(r"\bstruct\s*(\w*)\s*\{", text):
        n, _ = struct_fields(text, m.end() - 1)
        if n > MAX_FIELDS:
            line = text.count("\n", 0, m.start()) + 1
            violations.append("%s:%d: struct %s has %d fields (at most %d)"
                              % (rel(p), line, m.group(1) or "(anonymous)", n, MAX_FIELDS))

# (c) mode checks (in code: comments and literals stripped) outside the strategy files and the layout value
checks = []
for p in files:
    if STRATEGY.search(rel(p)):
        continue
    lines = raw[p].split("\n")
    for k, line in enumerate(strip_comments(raw[p], strings=True).split("\n"), 1):
        if MODE_CHECK.search(line):
            checks.append("%s:%d: %s" % (rel(p), k, lines[k - 1].strip()))
if len(checks) > MAX_MODE_CHECKS:
    violations.append("mode checks outside the strategy files and the layout value: %d (at most %d)"
                      % (len(checks), MAX_MODE_CHECKS))
    violations += ["  mode check: " + c for c in checks]

# (d) circular includes among src/parallel/ files
graph = {}
for p in files:
    if rel(p).startswith("src/parallel/"):
        deps = []
        for inc in re.findall(r'^\s*#\s*include\s*"([^"]+)"', code[p], re.M):
            q = os.path.normpath(os.path.join(os.path.dirname(p), inc))
            if rel(q).startswith("src/parallel/") and os.path.exists(q):
                deps.append(q)
        graph[p] = deps
seen, cycles = {}, set()
def visit(p, stack):
    seen[p] = 1
    stack.append(p)
    for q in graph.get(p, []):
        if seen.get(q) == 1:
            cyc = stack[stack.index(q):]
            k = cyc.index(min(cyc))
            cycles.add(tuple(cyc[k:] + cyc[:k]))
        elif q not in seen:
            visit(q, stack)
    stack.pop()
    seen[p] = 2
for p in sorted(graph):
    if p not in seen:
        visit(p, [])
for cyc in sorted(cycles):
    violations.append("circular include: " + " -> ".join(rel(p) for p in cyc + (cyc[0],)))

# (e) the trainer names no model-parallel size or ZeRO (code and comments)
word = re.compile(r"\b(tp|pp|cp|zero)\b", re.I)
for p in sources(os.path.join(src, "train")):
    for k, line in enumerate(open(p, encoding="utf-8", errors="replace"), 1):
        if word.search(line):
            violations.append("%s:%d: the trainer mentions %s: %s"
                              % (rel(p), k, word.search(line).group(0), line.strip()))

for v in violations:
    print("FAIL: " + v)
print("structure: %d files, %d mode checks outside the strategies, %d violation%s"
      % (len(files), len(checks), len(violations), "" if len(violations) == 1 else "s"))
sys.exit(1 if violations else 0)
PY
