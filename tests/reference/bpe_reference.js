// Reference GPT-2 BPE ids for a UTF-8 text file, from npm's gpt-3-encoder (a port of
// OpenAI's encoder.py). Regenerates tests/data/bpe_sample.ids:
//   bash scripts/deps.sh
//   node tests/reference/bpe_reference.js tests/data/bpe_sample.txt > tests/data/bpe_sample.ids
// An optional second argument names the gpt-3-encoder directory.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length < 3) {
  process.stderr.write('usage: node bpe_reference.js TEXT_FILE [GPT3_ENCODER_DIR]\n');
  process.exit(2);
}
const dir = process.argv[3] ||
  path.join(__dirname, '..', '..', 'build', 'deps', 'node_modules', 'gpt-3-encoder');
const { encode } = require(path.resolve(dir));
const text = fs.readFileSync(process.argv[2], 'utf8');
const ids = encode(text);
// One line of up to 20 ids each, so diffs stay readable.
const lines = [];
for (let i = 0; i < ids.length; i += 20) lines.push(ids.slice(i, i + 20).join(' '));
process.stdout.write(lines.join('\n') + '\n');
