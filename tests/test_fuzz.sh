# Fuzzing the input files (tests/fuzz.py): mutated checkpoints (safetensors headers and
# data, trainer state), token files and configs, seeded. Every case must exit 0 or 2 with
# at most one error line (1 only for weights that diverge), never a signal, a sanitizer
# report or a timeout. FUZZ_CASES sets the count (default 500, 150 in a sanitizer build,
# where each case costs ~10x; the Release pass covers the 500);
# FUZZ_SEED the seed; a failure prints the case number to rerun with FUZZ_ONLY=N.
source "$(dirname "$0")/lib.sh"
prepare_tiny
default=500
grep -q __asan_init "$DTRAIN" && default=150
python3 "$SRC/tests/fuzz.py" "$DTRAIN" "$TMP/fuzz" "${FUZZ_CASES:-$default}" "${FUZZ_SEED:-7}" \
  "$SRC/tests/data/tiny.json" "$TMP/c_train.bin" "$TMP/c_val.bin" && pass "fuzz" || fail "fuzz"
finish
