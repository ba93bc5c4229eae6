// Reference ids for a Hugging Face tokenizer.json, from Hugging Face's own JavaScript
// tokenizers (npm @huggingface/tokenizers, an implementation independent of dtrain's):
//   node tests/reference/hf_tokenizer_reference.mjs TOKENIZER_JSON TEXT_FILE [MODULE_DIR] > ids
// Prints the ids of the whole text (no special tokens added), 20 per line, then
// "# N ids, M bytes, S s" on stderr.
import fs from 'fs';
import path from 'path';
import { fileURLToPath, pathToFileURL } from 'url';

const [tokPath, textPath, modDir] = process.argv.slice(2);
if (!tokPath || !textPath) {
  process.stderr.write('usage: node hf_tokenizer_reference.mjs TOKENIZER_JSON TEXT_FILE [MODULE_DIR]\n');
  process.exit(2);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const dir = modDir || path.join(here, '..', '..', 'build', 'deps', 'node_modules', '@huggingface', 'tokenizers');
const { Tokenizer } = await import(pathToFileURL(path.join(path.resolve(dir), 'dist', 'tokenizers.mjs')).href);
const json = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
const cfgPath = path.join(path.dirname(tokPath), 'tokenizer_config.json');
const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, 'utf8')) : {};
const tok = new Tokenizer(json, cfg);
const text = fs.readFileSync(textPath, 'utf8');
const t0 = process.hrtime.bigint();
const ids = tok.encode(text, { add_special_tokens: false }).ids;
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
const lines = [];
for (let i = 0; i < ids.length; i += 20) lines.push(ids.slice(i, i + 20).join(' '));
process.stdout.write(lines.join('\n') + '\n');
process.stderr.write(`# ${ids.length} ids, ${Buffer.byteLength(text)} bytes, ${secs.toFixed(3)} s\n`);
