# Uneven inputs (issue 27, item 5): finite data (train.epochs) whose rows are not a whole
# number of global batches. 37 documents, one per row (data.layout pad), global batch 8:
#   drop  every epoch's last 5 rows dropped: 4 steps an epoch, every rank stops at step 8;
#   join  the last batch trained with its 5 rows (ranks and micro-steps past them take rows
#         that add nothing, so every rank runs the same collectives): 5 steps an epoch, and
#         dp 2 and 4 with DDP and ZeRO-3 and dp2 x pp2 give the single process's curves;
#   error refused at start, one line naming the rows and the batch, exit 2.
# No run may hang (each under a timeout). Resuming in the middle of an epoch, or right after
# its short batch, lands on the straight run's weights (bitwise mode).
source "$(dirname "$0")/lib.sh"
need_mpi
python3 -c "
import json, random
r = random.Random(3)
for i in range(37):
    print(json.dumps({'prompt': 'Q%d ' % i, 'completion': ' '.join('w%d' % r.randint(0, 50) for _ in range(r.randint(1, 9)))}))" \
  >"$TMP/u.jsonl"
"$DTRAIN" prepare --format prompt --input "$TMP/u.jsonl" --out "$TMP/u" --val-fraction 0 >"$TMP/prep.out" 2>&1 ||
  fail "prepare: $(tail -1 "$TMP/prep.out")"
U=(--config "$SRC/tests/data/tiny.json" --set "data.train=$TMP/u_train.bin" --set data.val= --set data.layout=pad
   --set train.epochs=2 --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8)
# go NAME NP ARGS...: a run under a timeout; its metrics in $TMP/NAME.jsonl, its digest printed
go() {
  local name=$1 np=$2; shift 2
  local cmd=("$DTRAIN" train "${U[@]}" --digest --metrics "$TMP/$name.jsonl" "$@")
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  timeout 180 "${cmd[@]}" >"$TMP/$name.out" 2>&1; local rc=$?
  [ $rc -eq 124 ] && fail "$name: hung (killed after 180 s)"
  [ $rc -ne 0 ] && echo "(run $name: exit $rc: $(grep -m1 error "$TMP/$name.out"))" >&2
  digest_of "$TMP/$name.out"
}
steps_of() { python3 -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '\"event\"' not in l]
print(len(r), ' '.join(str(x['loss_tokens']) for x in r))" "$1"; }
# same REF GOT: per-step loss and gradient norm within 1e-5
same() { python3 - "$TMP/$1.jsonl" "$TMP/$2.jsonl" <<'PY'
import json, sys
rd = lambda f: [json.loads(l) for l in open(f) if '"event"' not in l]
a, b = rd(sys.argv[1]), rd(sys.argv[2])
assert len(a) == len(b) and a, (len(a), len(b))
w = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
assert all(x["loss_tokens"] == y["loss_tokens"] for x, y in zip(a, b))
print("%d steps, max rel diff %.2e" % (len(a), w))
sys.exit(0 if w <= 1e-5 else 1)
PY
}

go drop 1 --set data.uneven=drop >/dev/null
go join 1 --set data.uneven=join >/dev/null
read -r nd _ <<<"$(steps_of "$TMP/drop.jsonl")"
read -r nj tj <<<"$(steps_of "$TMP/join.jsonl")"
[ "$nd" = 8 ] && pass "drop: 2 epochs of 4 whole batches, 8 steps" || fail "drop: $nd steps"
python3 -c "
import sys
t = list(map(int, sys.argv[1].split()))
assert len(t) == 10 and t[4] < min(t[:4]) and t[9] < min(t[5:9]), t" "$tj" &&
  pass "join: 2 epochs of 5 batches, 10 steps; the short batches (steps 5, 10) count their 5 rows' targets ($tj)" ||
  fail "join: $nj steps, loss_tokens $tj"

for spec in "dp2:2:" "dp4:4:--set train.micro_batch=1" "dp2-zero3:2:--set parallel.zero=3" \
            "dp4-zero3:4:--set parallel.zero=3 --set train.micro_batch=1" "dp2xpp2:4:--set parallel.pp=2"; do
  IFS=: read -r name np args <<<"$spec"
  for pol in drop join; do
    # shellcheck disable=SC2086 # args is a word list
    go "$pol-$name" "$np" --set data.uneven=$pol $args >/dev/null
    if out=$(same "$pol" "$pol-$name" 2>&1); then pass "$pol, $name: every rank ends with the single process ($out)"
    else fail "$pol, $name: $out"; fi
  done
done

"$DTRAIN" train "${U[@]}" --set data.uneven=error >"$TMP/err.out" 2>&1; rc=$?
[ $rc -eq 2 ] && [ "$(grep -c . "$TMP/err.out")" -ge 1 ] &&
  grep -q "gives 37 rows, not a whole number of global batches of 8 (an epoch's last batch would hold 5)" "$TMP/err.out" &&
  pass "error: refused at start, exit 2, naming the rows and the batch" || fail "error: rc $rc: $(tail -1 "$TMP/err.out")"
"${MPI[@]}" -np 2 "$DTRAIN" train "${U[@]}" --set data.uneven=error >"$TMP/err2.out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "not a whole number of global batches" "$TMP/err2.out" &&
  pass "error on 2 ranks: both stop with the line" || fail "error dp2: rc $rc"

# resume: mid-epoch (after step 3) and right after the first epoch's short batch (step 5)
BW=(--set parallel.determinism=bitwise --set data.uneven=join)
straight=$(go straight 1 "${BW[@]}")
for at in 3 5; do
  "$DTRAIN" train "${U[@]}" "${BW[@]}" --set train.stop_after=$at --save "$TMP/ck$at" >"$TMP/ck$at.out" 2>&1 ||
    fail "save at $at: $(tail -1 "$TMP/ck$at.out")"
  got=$(go resume$at 2 "${BW[@]}" --resume "$TMP/ck$at")
  [ -n "$straight" ] && [ "$got" = "$straight" ] &&
    pass "join: saved after step $at, resumed on 2 ranks: the straight run's weights" ||
    fail "resume at $at: '$got' vs '$straight'"
done
finish
