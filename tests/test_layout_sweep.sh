# Randomised layout parity (tests/layout_sweep.py): 10 seeded draws of model shape, batch and
# layout (dp x tp x pp x cp up to 8 ranks, sp, ZeRO 0-3, ps, schedules, micro-batch counts,
# bitwise mode, fp32 or bf16) against the single process, half of them stopped and resumed
# on another random layout. The same seed draws the same cases; `python3
# tests/layout_sweep.py build/dtrain . --cases 200 --seed S` explores further.
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
python3 "$SRC/tests/layout_sweep.py" "$DTRAIN_BIN" "$SRC" --cases 10 --seed 11 --keep "$TMP/sweep" && pass "layout sweep" ||
  fail "layout sweep (logs above)"
finish
