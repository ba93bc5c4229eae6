# frozen_check.py BEFORE AFTER PATTERNS: the tensors PATTERNS match are byte-identical in the two
# checkpoints (safetensors files or step directories), every other tensor changed (tests/test_freeze.sh).
import json, struct, sys, fnmatch
import os
def load_file(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n]); base = 8 + n
    return {k: b[base+v['data_offsets'][0]:base+v['data_offsets'][1]] for k, v in h.items() if k != '__metadata__'}
def load(p):  # a safetensors file, or a step directory (one file or Hugging Face shards + index)
    if not os.path.isdir(p): return load_file(p)
    if os.path.exists(os.path.join(p, 'model.safetensors')): return load_file(os.path.join(p, 'model.safetensors'))
    out = {}
    for f in sorted(set(json.load(open(os.path.join(p, 'model.safetensors.index.json')))['weight_map'].values())):
        out.update(load_file(os.path.join(p, f)))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2]); pats = sys.argv[3].split(',')
frozen = [k for k in a if any(fnmatch.fnmatchcase(k, p) for p in pats)]
bad = [k for k in frozen if a[k] != b[k]] + [k for k in a if k not in frozen and a[k] == b[k]]
print("%d frozen tensors unchanged, %d others changed" % (len(frozen), len(a) - len(frozen)) if not bad else "WRONG: %s" % bad[:5])
sys.exit(1 if bad else 0)
