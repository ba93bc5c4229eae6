# Shared helpers for the CLI tests: bash tests/test_X.sh <dtrain> <srcdir> <builddir>
DTRAIN="$1"; SRC="$2"; BUILD="$3"
TMP="$(mktemp -d /tmp/dtrain-test.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
PASSED=0; FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok: $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*"; }
finish() { echo "$PASSED passed, $FAILED failed"; [ "$FAILED" -eq 0 ]; }
# Tiny corpus token files: $TMP/c_train.bin, $TMP/c_val.bin
prepare_tiny() {
  "$DTRAIN" prepare --input "$SRC/tests/data/tiny_corpus.txt" --out "$TMP/c" --val-fraction 0.1 >/dev/null
}
TINY=(--config "$SRC/tests/data/tiny.json" --set "data.train=$TMP/c_train.bin" --set "data.val=$TMP/c_val.bin")
digest_of() { grep -o 'digest sha256:[0-9a-f]*' "$1"; }
