#!/usr/bin/env bash
# Regenerates the reference-parity fixtures in tests/reference/:
#   tiny_init.safetensors  initial weights, written by dtrain (--steps 0 --save)
#   tiny_expected.json     per-step loss / grad_norm of the independent PyTorch reference
#   llama/NAME_init.safetensors, llama/NAME_expected.json   the same for each llama/NAME.json
#                          (tests/reference/llama_reference.py)
#   sync/NAME_expected.json  local SGD / DiLoCo over 2 replicas (gpt2_reference.py --replicas 2; *_shard2:
#                            4 ranks, 2 replicas of 2)
# usage: bash tests/reference/regen.sh [path/to/dtrain]   (default: build/dtrain)
# Needs /usr/bin/python3 with torch (Debian python3-torch). tests/test_reference_parity.sh
# checks dtrain against these files; regenerate them only when the model, the optimizer
# or tiny_config.json change on purpose.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../.." && pwd)"
dtrain="${1:-$src/build/dtrain}"
[ -x "$dtrain" ] || { echo "regen: dtrain binary '$dtrain' not found (build first)" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$dtrain" prepare --fortune --input "$src/tests/data/tiny_corpus.txt" --out "$tmp/c" --val-fraction 0
"$dtrain" train --config "$here/tiny_config.json" --set data.train="$tmp/c_train.bin" --set data.val= \
    --steps 0 --save "$tmp/init" >/dev/null
cp "$tmp/init/step_00000000/model.safetensors" "$here/tiny_init.safetensors"
/usr/bin/python3 "$here/gpt2_reference.py" --config "$here/tiny_config.json" \
    --init "$here/tiny_init.safetensors" --tokens "$tmp/c_train.bin" --dtype float64 --out "$here/tiny_expected.json"
echo "regen: wrote $here/tiny_init.safetensors and $here/tiny_expected.json"
# local SGD and DiLoCo over 2 replicas from the same initial weights (sync/NAME.json)
for cfg in "$here"/sync/*.json; do
  case "$cfg" in *_expected.json) continue ;; esac
  name=$(basename "$cfg" .json)
  ranks=2; case "$name" in *_shard2) ranks=4 ;; esac # two replicas of dp_shard 2 ranks each
  /usr/bin/python3 "$here/gpt2_reference.py" --config "$cfg" --init "$here/tiny_init.safetensors" \
    --tokens "$tmp/c_train.bin" --dtype float64 --replicas "$ranks" --out "$here/sync/${name}_expected.json"
  echo "regen: wrote $here/sync/${name}_expected.json"
done
# the Llama family: each config's initial weights (dtrain's) and the reference's steps
for cfg in "$here"/llama/*.json; do
  case "$cfg" in *_expected.json | *_export_config.json) continue ;; esac
  name=$(basename "$cfg" .json)
  "$dtrain" train --config "$cfg" --set data.train="$tmp/c_train.bin" --set data.val= --steps 0 \
    --save "$tmp/$name" >/dev/null
  cp "$tmp/$name/step_00000000/model.safetensors" "$here/llama/${name}_init.safetensors"
  /usr/bin/python3 "$here/llama_reference.py" --config "$cfg" --init "$here/llama/${name}_init.safetensors" \
    --tokens "$tmp/c_train.bin" --dtype float64 --out "$here/llama/${name}_expected.json"
  # the same weights through `dtrain export`, read the way transformers reads them (the
  # reference's --hf: config.json's keys, not dtrain's): the same steps, bit for bit in float64
  "$dtrain" train --config "$cfg" --set data.train="$tmp/c_train.bin" --set data.val= --steps 0 \
    --set train.init_from="$here/llama/${name}_init.safetensors" --save "$tmp/$name-s" >/dev/null
  "$dtrain" export "$tmp/$name-s" "$tmp/$name-hf" >/dev/null
  /usr/bin/python3 "$here/llama_reference.py" --config "$cfg" --hf "$tmp/$name-hf" --tokens "$tmp/c_train.bin" \
    --dtype float64 --out "$tmp/$name-hf.json"
  /usr/bin/python3 -c "import json, sys
a, b = (json.load(open(p))['steps'] for p in sys.argv[1:3])
assert [s['loss'] for s in a] == [s['loss'] for s in b], 'the export gives other losses'" \
    "$here/llama/${name}_expected.json" "$tmp/$name-hf.json"
  cp "$tmp/$name-hf/config.json" "$here/llama/${name}_export_config.json"
  echo "regen: wrote $here/llama/${name}_init.safetensors, ${name}_expected.json, ${name}_export_config.json"
done
