# Rows of documents (issue 27, data.layout): packed prompt/completion documents with
# their loss mask (`pack`) and one document per row (`pad`) train the same model in every
# layout: dp2 (ps, DDP, ZeRO-1/2/3), tp2 (with and without sp), pp2 under each schedule,
# cp2 and dp2 x pp2 x tp2 give the single process's per-step loss, gradient norm and
# validation loss within 1e-5 (fp32); bitwise mode gives the single process's weights
# with dp2 and pp2; recompute and the emulated device give the same weights, bf16 the
# fp32 curve within 1%. The rows differ from stream windows (documents are kept apart), and
# a layout name outside stream|pack|pad is refused.
source "$(dirname "$0")/lib.sh"
need_mpi

prepare_prompt_docs # lib.sh: prompt/completion documents, prompts out of the loss
DP_RUN=(--config "$SRC/tests/data/tiny.json" --set "data.train=$TMP/d_train.bin" --set "data.val=$TMP/d_val.bin"
        --set model.n_layer=4 --steps 20 --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8
        --set train.val_every=10)

LAYOUTS=("${PARITY_LAYOUTS[@]}")
# the ASan pass runs a layout of each kind (the full list in the plain pass)
full || LAYOUTS=("dp2-zero3:2:--set parallel.zero=3" "tp2-sp:2:--set parallel.tp=2 --set parallel.sp=true"
                 "pp2-1f1b:2:--set parallel.pp=2" "cp2:2:--set parallel.cp=2")
for rows in pack pad; do
  ref=$(dp_run "$rows-ref" 1 --set data.layout=$rows)
  [ -n "$ref" ] || fail "$rows: the single process: $(tail -2 "$TMP/$rows-ref.out")"
  for spec in "${LAYOUTS[@]}"; do
    IFS=: read -r name np args <<<"$spec"
    # shellcheck disable=SC2086 # args is a word list
    dp_run "$rows-$name" "$np" --set data.layout=$rows $args >/dev/null
    if out=$(compare_curves "$TMP/$rows-ref.jsonl" "$TMP/$rows-$name.jsonl" 2>&1); then
      pass "$rows, $name: the single process's curves ($out)"
    else
      fail "$rows, $name: $out $(grep -m1 error "$TMP/$rows-$name.out")"
    fi
  done
  # bitwise mode: the same weights
  BW=(--set parallel.determinism=bitwise --set data.layout=$rows)
  one=$(dp_run "$rows-bw1" 1 "${BW[@]}")
  for spec in "dp2:2:" "pp2:2:--set parallel.pp=2" "dp2-zero3:2:--set parallel.zero=3"; do
    IFS=: read -r name np args <<<"$spec"
    # shellcheck disable=SC2086
    got=$(dp_run "$rows-bw-$name" "$np" "${BW[@]}" $args)
    [ -n "$one" ] && [ "$got" = "$one" ] && pass "$rows, bitwise $name: the single process's weights" ||
      fail "$rows, bitwise $name: '$got' vs '$one'"
  done
done

# activation recompute and the emulated device give the same weights; bf16 the fp32 curve
# within 1%
if full; then
  for rows in pack pad; do
    one=$(dp_run "$rows-bw1" 1 --set data.layout=$rows)
    rc=$(dp_run "$rows-rc" 1 --set data.layout=$rows --set train.recompute=full)
    em=$(dp_run "$rows-em" 1 --set data.layout=$rows --set backend=emulated)
    dp_run "$rows-bf16" 1 --set data.layout=$rows --set precision=bf16 >/dev/null
    [ -n "$one" ] && [ "$rc" = "$one" ] && [ "$em" = "$one" ] &&
      pass "$rows: recompute and the emulated device give the same weights" || fail "$rows: '$one' '$rc' '$em'"
    python3 - "$TMP/$rows-bw1.jsonl" "$TMP/$rows-bf16.jsonl" <<'PY' && pass "$rows, bf16: the fp32 curve within 1%" ||
import json, sys
rd = lambda f: [json.loads(l) for l in open(f) if '"event"' not in l]
a, b = rd(sys.argv[1]), rd(sys.argv[2])
assert len(a) == len(b) == 20 and max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)) < 0.01
PY
      fail "$rows, bf16 curve"
  done
fi

# the rows are not stream windows: documents apart, padding out of the loss
stream=$(dp_run stream 1)
python3 - "$TMP/stream.jsonl" "$TMP/pack-ref.jsonl" "$TMP/pad-ref.jsonl" <<'PY' &&
import json, sys
rd = lambda f: [json.loads(l) for l in open(f) if '"event"' not in l]
s, k, d = rd(sys.argv[1]), rd(sys.argv[2]), rd(sys.argv[3])
assert s[0]["loss"] != k[0]["loss"], "pack trains on other rows than stream"
# pad: one completion per row, far fewer targets than a packed row's
assert sum(x["loss_tokens"] for x in d) < sum(x["loss_tokens"] for x in k), "pad rows hold one document each"
PY
  pass "pack and pad rows differ from stream windows; pad rows hold one document each" ||
  fail "rows: stream/pack/pad metrics"

expect() { # expect LABEL PATTERN ARGS...: exit 2 with the pattern
  local label=$1 pat=$2; shift 2
  "$DTRAIN" train "${DP_RUN[@]}" "$@" >"$TMP/bad.out" 2>&1; local rc=$?
  [ $rc -eq 2 ] && grep -q "$pat" "$TMP/bad.out" && pass "$label: refused (exit 2)" ||
    fail "$label: rc $rc: $(tail -1 "$TMP/bad.out")"
}
expect "an unknown data.layout" "data.layout" --set data.layout=packed
finish
