# The gradient-accumulation trap (issue 27, token-exact loss): a step's loss is the sum of
# its loss-bearing targets' losses over their count in the whole global batch, so micro-
# batches holding very different numbers of them (prompt/completion data: some windows
# all prompt, some all completion) accumulate to the gradient of the batch taken at once.
# Loss and gradient norm of every step, for 1, 2 and 8 micro-batches per rank and dp 1, 2
# and 4 (DDP, ZeRO-2), match the one-micro-batch run within 1e-6 relative; the metrics
# give the step's targets in the loss.
source "$(dirname "$0")/lib.sh"
need_mpi

# prompts of 2 to 120 characters against completions of 120 to 2, in runs, so a window of
# 32 tokens holds anything from no target in the loss to all of them
python3 -c "
import json
for i in range(400):
    a = (i // 7) % 2
    p, c = (120, 2) if a else (2, 120)
    print(json.dumps({'prompt': ('p%d ' % i * 40)[:p], 'completion': ('c%d ' % (i * 3) * 40)[:c]}))" >"$TMP/pc.jsonl"
"$DTRAIN" prepare --format prompt --input "$TMP/pc.jsonl" --out "$TMP/pc" --val-fraction 0 >"$TMP/prep.out" 2>&1 ||
  fail "prepare: $(tail -2 "$TMP/prep.out")"

BASE=(--config "$SRC/tests/data/tiny.json" --set data.train="$TMP/pc_train.bin" --set data.val= --steps 3
      --threads 1 --set train.global_batch=32)
# go NAME NP MICRO [ARGS...]: the run's metrics in $TMP/NAME.jsonl
go() {
  local name=$1 np=$2 micro=$3; shift 3
  local cmd=("$DTRAIN" train "${BASE[@]}" --set train.micro_batch="$micro" --metrics "$TMP/$name.jsonl" "$@")
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  "${cmd[@]}" >"$TMP/$name.out" 2>&1 || fail "$name: $(grep -m1 error "$TMP/$name.out")"
}

go ref 1 32
# the reference's micro-batches of 1 sequence differ: some hold no target in the loss
python3 - "$TMP/ref.jsonl" <<'PY' && pass "the data: every step's loss counts part of its targets (loss_tokens below the step's 1024)" ||
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"event"' not in l]
assert len(r) == 3 and all(0 < x["loss_tokens"] < 1024 for x in r), r
PY
  fail "loss_tokens: $(head -c 300 "$TMP/ref.jsonl")"

same() { # same LABEL NAME: per-step loss and grad norm of NAME equal the reference's within 1e-6 relative
  python3 - "$TMP/ref.jsonl" "$TMP/$2.jsonl" <<'PY' && pass "$1: loss and gradient norm of the one-micro-batch step (within 1e-6)" ||
import json, sys
rd = lambda f: [json.loads(l) for l in open(f) if '"event"' not in l]
a, b = rd(sys.argv[1]), rd(sys.argv[2])
assert len(a) == len(b) == 3, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    assert x["loss_tokens"] == y["loss_tokens"], (x, y)
    for k in ("loss", "grad_norm"):
        worst = max(worst, abs(x[k] - y[k]) / abs(x[k]))
print("worst relative difference %.2e" % worst)
assert worst <= 1e-6
PY
    fail "$1: $(tail -1 "$TMP/$2.out")"
}

for m in 2 8; do go m$m 1 $((32 / m)); same "dp1, $m micro-batches" m$m; done
for np in 2 4; do
  for m in 1 2 8; do
    micro=$((32 / np / m))
    go dp$np-m$m $np $micro
    same "dp$np (DDP), $m micro-batch(es) of $micro" dp$np-m$m
  done
  go z$np $np $((32 / np / 8)) --set parallel.zero=2
  same "dp$np ZeRO-2, 8 micro-batches" z$np
done
finish
