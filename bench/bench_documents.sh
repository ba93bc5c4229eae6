#!/usr/bin/env bash
# Packed documents against full causal rows (issue 27, item 3): the same token file of
# documents averaging T/8 tokens, trained as stream windows (every row a full causal
# T x T attention) and as packed rows (data.layout pack: each token attends to its own
# document; the kernel skips the blocks of earlier documents). Tokens/s of both, same run,
# alternating, for an attention-bound shape (narrow: the attention is most of a step)
# and a GPT-2 small-width one (where the GEMMs are most of it). Then the same documents one
# per row (data.layout pad, a global batch of 16 documents) against the token budget
# (data.layout budget: the same documents packed whole into the micro-batches' rows):
# ms per step for the same loss.
# usage: bash bench/bench_documents.sh [build/dtrain]   env: ROUNDS (3), STEPS (6), T (1024)
set -euo pipefail
source "$(dirname "$0")/common.sh" documents "${1:-}"
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-6} T=${T:-1024}
# documents of T/16 .. 3T/16 - 1 tokens (mean T/8), random byte ids, 24 rows of T; batches of
# 2 x 2 rows; the median of the timed steps (the first is not timed) per run
/usr/bin/python3 - "$tmp/docs.bin" "$T" <<'PY'
import random, struct, sys
random.seed(1); T = int(sys.argv[2]); n = 24 * T + 1
starts, at = [0], 0
while at < n:
    at = min(n, at + random.randrange(T // 16, 3 * T // 16))
    starts.append(at)
toks = [random.randrange(256) for _ in range(n)]
h = [20240520, 3, n, 0, 0, 0, 2, len(starts) - 1, 0] + [0] * 247
open(sys.argv[1], "wb").write(struct.pack("<256i", *h) + struct.pack("<%dH" % n, *toks) +
                               struct.pack("<%dQ" % len(starts), *starts))
print("documents: %d, mean %.0f tokens" % (len(starts) - 1, n / (len(starts) - 1)), file=sys.stderr)
PY
# run LAYOUT GLOBAL_BATCH STEPS SHAPE_ARGS...: median ms per step of the timed steps
run() {
  local layout=$1 gb=$2 steps=$3; shift 3
  "${ENV[@]}" "$dtrain" train --set data.train="$tmp/docs.bin" --set data.val= --set model.vocab_size=256 \
    --set model.seq_len="$T" --set train.seq_len="$T" --set train.micro_batch=2 --set train.global_batch="$gb" \
    --steps "$steps" --threads 2 --set data.layout="$layout" --metrics "$tmp/m.jsonl" "$@" >"$tmp/out" 2>&1 ||
    { tail -2 "$tmp/out" >&2; echo 0; return; }
  /usr/bin/python3 -c "
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '\"event\"' not in l][1:]
print(statistics.median(x['ms'] for x in r))" "$tmp/m.jsonl"
}
# table A B UNIT GLOBAL_BATCH STEPS "NAME:SHAPE_ARGS"...: layouts A and B alternating, ROUNDS
# times per shape, B's speed over A's (per step, or per token when UNIT is tokens/s: A and
# B then train as many positions a step)
table() {
  local a=$1 b=$2 unit=$3 gb=$4 steps=$5; shift 5
  echo "| shape | T | $a $unit | $b $unit | $b over $a | probes |"
  echo "|---|---|---|---|---|---|"
  for shape in "$@"; do
    local name=${shape%%:*} args=${shape#*:} ta=() tb=() probes=()
    for ((r = 0; r < ROUNDS; r++)); do
      probes+=("$(probe)")
      # shellcheck disable=SC2086 # args is a word list
      ta+=("$(run "$a" "$gb" "$steps" $args)")
      # shellcheck disable=SC2086
      tb+=("$(run "$b" "$gb" "$steps" $args)")
    done
    /usr/bin/python3 - "$name" "$T" "$unit" "$((gb * T))" "${ta[*]}" "${tb[*]}" "${probes[*]}" <<'PY'
import statistics, sys
name, T, unit, tokens = sys.argv[1:5]
a, b, p = [list(map(float, x.split())) for x in sys.argv[5:8]]
if unit == "tokens/s":  # the positions of a step over its time
    a, b = [[float(tokens) / (ms / 1e3) if ms else 0 for ms in v] for v in (a, b)]
ma, mb = statistics.median(a), statistics.median(b)
speed = (mb / ma if ma else 0) if unit == "tokens/s" else (ma / mb if mb else 0)
print("| %s | %s | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | **%.2f** | %.2f-%.2f |" % (name, T, ma, min(a), max(a), mb, min(b),
      max(b), speed, min(p), max(p)))
PY
  done
}
NARROW8="narrow (L2 C32 H8):--set model.n_layer=2 --set model.n_embd=32 --set model.n_head=8"
NARROW4="narrow (L2 C32 H4):--set model.n_layer=2 --set model.n_embd=32 --set model.n_head=4"
NARROW2="narrow (L2 C64 H2):--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2"
GPT2="GPT-2 small width (L2 C768 H12):--set model.n_layer=2 --set model.n_embd=768 --set model.n_head=12"
table stream pack tokens/s 4 "$STEPS" "$NARROW8" "$NARROW4" "$NARROW2" "$GPT2"
echo
table pad budget ms/step 16 4 "$NARROW2" "$GPT2"
