#!/usr/bin/env bash
# make demo: prepares the default corpus (Debian's `fortunes`: real English text),
# trains the built-in default model on it, then prints a text sample.
set -euo pipefail
dtrain="${1:-build/dtrain}"
corpus=/usr/share/games/fortunes
mkdir -p data
if [ ! -f data/demo_train.bin ] || [ ! -f data/demo_val.bin ]; then
  inputs=()
  for f in "$corpus"/*; do
    case "$f" in *.dat|*.u8) continue ;; esac
    [ -f "$f" ] && inputs+=(--input "$f")
  done
  [ ${#inputs[@]} -gt 0 ] || { echo "demo: no corpus in $corpus (run make deps)" >&2; exit 2; }
  "$dtrain" prepare --fortune "${inputs[@]}" --out data/demo --val-fraction 0.05
fi
rm -rf build/demo-ckpt
"$dtrain" train --save build/demo-ckpt --metrics build/demo-metrics.jsonl
echo
echo "sample from the trained model (dtrain sample --checkpoint build/demo-ckpt --prompt 'The '):"
"$dtrain" sample --checkpoint build/demo-ckpt --prompt "The " --length 400 --temperature 0.8 --top-k 40 --seed 1 --echo
