# The chaos trial (slow tier): tests/chaos.py runs supervised jobs (`dtrain launch`) over
# dp2, dp2 ZeRO-3, pp2, tp2 and dp2 x pp2, each with one fault at a random point (a rank
# that exits, hangs or is stopped, a hang before the first step, a crash inside a save,
# mpirun SIGKILLed, SIGTERM to the launcher then a resume, SIGTERM twice then a resume,
# the launcher SIGKILLed then a resume, a damaged newest checkpoint then a resume that
# falls back to the newest intact step, a trainer_state.json of another step, `latest` as a
# FIFO, a torn metrics file); every job must end on the uninterrupted run's
# digest (bitwise mode; fast mode with tp, on the same world), none past its timeout, and
# no process may outlive a killed launcher. DT_CHAOS_SEED and DT_CHAOS_COUNT pick the
# trial (default: seed 1, 26 jobs: each fault twice).
source "$(dirname "$0")/lib.sh"
need_mpi
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
python3 "$SRC/tests/chaos.py" --dtrain "$DTRAIN_BIN" --src "$SRC" --seed "${DT_CHAOS_SEED:-1}" \
  --count "${DT_CHAOS_COUNT:-26}" 2>&1 | tee "$TMP/chaos.out"
[ "${PIPESTATUS[0]}" -eq 0 ] && pass "chaos: $(tail -1 "$TMP/chaos.out")" || fail "chaos: $(tail -1 "$TMP/chaos.out")"
finish
