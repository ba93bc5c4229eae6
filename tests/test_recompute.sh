# Activation checkpointing (train.recompute=full): a slot keeps only each block's input and
# the backward recomputes the block, so the activations shrink (allocated = estimated) and
# the run is bitwise the run without it: in one process (fp32 and bf16) and with ZeRO-3,
# tp + sp, pp (1f1b and interleaved) and cp, whose recomputed forwards repeat their
# collectives. zb-h1 (a split backward) is refused.
source "$(dirname "$0")/lib.sh"
prepare_tiny
RUN=("${TINY[@]}" --steps 6 --threads 1 --seed 1 --set train.micro_batch=2 --set train.global_batch=8
     --set model.n_layer=4 --set train.val_every=3 --set log.sample_tokens=0 --digest)
RC=(--set train.recompute=full)
act_of() { python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "summary"][0]["mem"][0]["activations"])' "$1"; }

"$DTRAIN" train "${RUN[@]}" --metrics "$TMP/plain.jsonl" >"$TMP/plain.out" 2>&1 || fail "plain run"
"$DTRAIN" train "${RUN[@]}" "${RC[@]}" --metrics "$TMP/rc.jsonl" >"$TMP/rc.out" 2>&1 || fail "recompute run"
[ -n "$(digest_of "$TMP/plain.out")" ] && [ "$(digest_of "$TMP/rc.out")" = "$(digest_of "$TMP/plain.out")" ] &&
  pass "recompute: bitwise the run without it ($(digest_of "$TMP/rc.out"))" ||
  fail "recompute digest: $(digest_of "$TMP/rc.out") vs $(digest_of "$TMP/plain.out")"
a0=$(act_of "$TMP/plain.jsonl"); a1=$(act_of "$TMP/rc.jsonl")
e1=$("$DTRAIN" estimate "${TINY[@]}" --set train.micro_batch=2 --set model.n_layer=4 "${RC[@]}" -n 1 --json |
     python3 -c 'import json,sys; print(json.load(sys.stdin)["activations"])')
[ -n "$a1" ] && [ "$a1" -lt "$a0" ] && [ "$a1" = "$e1" ] &&
  pass "activations $a0 -> $a1 bytes ($(python3 -c "print('%.2f' % ($a0 / $a1))")x less), = the estimate" ||
  fail "activations: $a0 -> $a1, estimate $e1"
"$DTRAIN" train "${RUN[@]}" --set precision=bf16 >"$TMP/b.out" 2>&1 || fail "bf16 run"
"$DTRAIN" train "${RUN[@]}" --set precision=bf16 "${RC[@]}" >"$TMP/brc.out" 2>&1 || fail "bf16 recompute run"
[ -n "$(digest_of "$TMP/b.out")" ] && [ "$(digest_of "$TMP/brc.out")" = "$(digest_of "$TMP/b.out")" ] &&
  pass "bf16 recompute: bitwise the bf16 run" || fail "bf16 recompute: $(digest_of "$TMP/brc.out") vs $(digest_of "$TMP/b.out")"

if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
  for lay in "zero3:2:--set parallel.zero=3" "tp2_sp:2:--set parallel.tp=2 --set parallel.sp=true" \
             "pp2:2:--set parallel.pp=2" "pp2_interleaved:2:--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2" \
             "cp2:2:--set parallel.cp=2" "dp2_pp2_zero1:4:--set parallel.pp=2 --set parallel.zero=1"; do
    name=${lay%%:*}; rest=${lay#*:}; np=${rest%%:*}; args=${rest#*:}
    case $name in pp2) ;; *) full || continue ;; esac  # ASan: ZeRO-3 and cp run in other tests there
    "${MPI[@]}" -np $np "$DTRAIN" train "${RUN[@]}" $args >"$TMP/$name.out" 2>&1 || fail "$name run"
    "${MPI[@]}" -np $np "$DTRAIN" train "${RUN[@]}" $args "${RC[@]}" >"$TMP/$name.rc.out" 2>&1 || fail "$name recompute run"
    [ -n "$(digest_of "$TMP/$name.out")" ] && [ "$(digest_of "$TMP/$name.rc.out")" = "$(digest_of "$TMP/$name.out")" ] &&
      pass "$name with recompute: bitwise the $name run" ||
      fail "$name recompute: $(digest_of "$TMP/$name.rc.out") vs $(digest_of "$TMP/$name.out"): $(grep error "$TMP/$name.rc.out")"
  done
  out=$("${MPI[@]}" -np 2 "$DTRAIN" train "${RUN[@]}" --set parallel.pp=2 --set parallel.schedule=zb-h1 "${RC[@]}" 2>&1)
  [ $? -eq 2 ] && [ "$(echo "$out" | grep -c '^dtrain: error')" -eq 1 ] && echo "$out" | grep -q "not with a split backward" &&
    pass "zb-h1 + recompute refused: $(echo "$out" | grep error)" || fail "zb-h1 + recompute: $out"
fi
finish
