# Fuzzing the input files (tests/fuzz.py): mutated checkpoints (safetensors headers and
# data, trainer state; a sharded checkpoint's index files and shards), token files and
# configs, seeded. Every case must exit 0 or 2 with
# at most one error line (1 only for weights that diverge), never a signal, a sanitizer
# report or a timeout; a flipped bit in a tensor's data must be exit 2 naming its checksum. FUZZ_CASES sets the count (default 250, 150 in a sanitizer build,
# where each case costs ~10x), FUZZ_SEED the seed (default 7, 8 in a sanitizer build, so
# `make test`'s two passes try 400 different cases); a failure prints the case number to
# rerun with FUZZ_ONLY=N.
source "$(dirname "$0")/lib.sh"
prepare_tiny
default=250 seed=7
grep -q __asan_init "$DTRAIN_BIN" && default=150 seed=8
python3 "$SRC/tests/fuzz.py" "$DTRAIN" "$TMP/fuzz" "${FUZZ_CASES:-$default}" "${FUZZ_SEED:-$seed}" \
  "$SRC/tests/data/tiny.json" "$TMP/c_train.bin" "$TMP/c_val.bin" && pass "fuzz" || fail "fuzz"
finish
