# The token budget (issue 27, data.layout budget): pad's documents packed whole into each
# micro-batch's rows, so the data-parallel ranks' documents fill different numbers of
# micro-batches in a step. 640 documents of 2 to 40 tokens (T 32), global batch 16, one
# row per micro-batch:
#   join   every rank runs the most micro-steps any rank needs: dp 1, 2 and 4 with DDP and
#          ZeRO-3, and dp2 x pp2 (its schedule's micro-batches, the extra ones empty), give
#          the single process's `pad` curves (the same documents, each computed as alone)
#          within 1e-5;
#   drop   every rank runs the fewest: the documents past them are left out of the step
#          (fewer targets in the loss on some steps), every rank ends at the same step;
#   error  the first uneven step stops every rank with one line, exit 2.
# No run may hang (each under a timeout); budget in bitwise mode is refused.
source "$(dirname "$0")/lib.sh"
need_mpi
python3 -c "
import json, random
r = random.Random(11)
for i in range(640):
    n = r.choice([1, 2, 3, 25, 30, 36])
    print(json.dumps({'text': ' '.join('w%d' % r.randint(0, 9) for _ in range(n))[:r.choice([2, 5, 40])]}))" \
  >"$TMP/b.jsonl"
"$DTRAIN" prepare --format jsonl --input "$TMP/b.jsonl" --out "$TMP/b" --val-fraction 0 >"$TMP/prep.out" 2>&1 ||
  fail "prepare: $(tail -1 "$TMP/prep.out")"
n=$(grep -o '[0-9]* documents' "$TMP/prep.out" | cut -d' ' -f1)
[ "$n" = 640 ] || fail "prepare: $n documents, 640 expected"
B=(--config "$SRC/tests/data/tiny.json" --set "data.train=$TMP/b_train.bin" --set data.val= --steps 12 --threads 1
   --seed 1 --set train.micro_batch=1 --set train.global_batch=16)
go() { # go NAME NP ARGS...: under a timeout, metrics in $TMP/NAME.jsonl; prints the exit status
  local name=$1 np=$2; shift 2
  local cmd=("$DTRAIN" train "${B[@]}" --metrics "$TMP/$name.jsonl" "$@")
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  timeout 180 "${cmd[@]}" >"$TMP/$name.out" 2>&1; local rc=$?
  [ $rc -eq 124 ] && fail "$name: hung (killed after 180 s)"
  echo $rc
}
# compare REF GOT: per-step loss and gradient norm within 1e-5, the same targets in the loss
compare() { python3 - "$TMP/$1.jsonl" "$TMP/$2.jsonl" <<'PY'
import json, sys
rd = lambda f: [json.loads(l) for l in open(f) if '"event"' not in l]
a, b = rd(sys.argv[1]), rd(sys.argv[2])
assert len(a) == len(b) == 12, (len(a), len(b))
assert all(x["loss_tokens"] == y["loss_tokens"] for x, y in zip(a, b)), "loss_tokens differ"
w = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
print("max rel diff %.2e" % w)
sys.exit(0 if w <= 1e-5 else 1)
PY
}

[ "$(go pad 1 --set data.layout=pad)" = 0 ] || fail "pad reference: $(tail -1 "$TMP/pad.out")"
# throughput counts the documents' tokens, not the padding: under 16 x 32 a step
python3 - "$TMP/pad.jsonl" <<'PY' && pass "pad: tokens/s counts the documents' tokens, not the padding" ||
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"event"' not in l]
assert all(x["tokens_per_s"] * x["ms"] / 1e3 < 0.9 * 16 * 32 for x in r), [x["tokens_per_s"] * x["ms"] / 1e3 for x in r]
PY
  fail "pad: tokens/s counts padding"
for spec in "dp1:1:" "dp2:2:" "dp4:4:" "dp2-zero3:2:--set parallel.zero=3" "dp4-zero3:4:--set parallel.zero=3" \
            "dp2xpp2:4:--set parallel.pp=2"; do
  IFS=: read -r name np args <<<"$spec"
  # shellcheck disable=SC2086 # args is a word list
  rc=$(go "join-$name" "$np" --set data.layout=budget --set data.uneven=join $args)
  if [ "$rc" = 0 ] && out=$(compare pad "join-$name" 2>&1); then
    pass "budget, join, $name: the single process's pad curves ($out)"
  else
    fail "budget, join, $name: rc $rc $out $(grep -m1 error "$TMP/join-$name.out")"
  fi
done

rc=$(go drop-dp2 2 --set data.layout=budget --set data.uneven=drop)
rcp=$(go drop-dp2xpp2 4 --set data.layout=budget --set data.uneven=drop --set parallel.pp=2)
out=$(compare drop-dp2 drop-dp2xpp2 2>&1) || fail "budget, drop, dp2 x pp2 against dp2: rc $rcp $out"
python3 - "$TMP/pad.jsonl" "$TMP/drop-dp2.jsonl" <<'PY' && [ "$rc" = 0 ] && [ "$rcp" = 0 ] &&
import json, sys
rd = lambda f: [json.loads(l) for l in open(f) if '"event"' not in l]
a, b = rd(sys.argv[1]), rd(sys.argv[2])
assert len(b) == 12, len(b)
assert all(y["loss_tokens"] <= x["loss_tokens"] for x, y in zip(a, b))
assert any(y["loss_tokens"] < x["loss_tokens"] for x, y in zip(a, b)), "no step was uneven"
PY
  pass "budget, drop, dp2 (and dp2 x pp2, the same curves): 12 steps on every rank, the documents past the fewest micro-steps left out of uneven steps" ||
  fail "budget, drop: rc $rc"

rc=$(go err-dp2 2 --set data.layout=budget --set data.uneven=error)
[ "$rc" = 2 ] && grep -q "the data-parallel ranks' documents fill different numbers of micro-batches" "$TMP/err-dp2.out" &&
  pass "budget, error, dp2: the first uneven step stops both ranks (exit 2, one line)" ||
  fail "budget, error: rc $rc: $(grep -m1 error "$TMP/err-dp2.out")"

for bad in "bitwise:not with parallel.determinism bitwise:--set parallel.determinism=bitwise"; do
  IFS=: read -r label pat args <<<"$bad"
  # shellcheck disable=SC2086
  "$DTRAIN" train "${B[@]}" --set data.layout=budget $args >"$TMP/bad.out" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q "$pat" "$TMP/bad.out" && pass "budget with $label: refused (exit 2)" ||
    fail "budget with $label: rc $rc: $(tail -1 "$TMP/bad.out")"
done
finish
