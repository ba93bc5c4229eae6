"""Damages or checks a safetensors file as the checkpoint tests need (standard library only).
  st_damage.py check FILE            every "crc32.<name>" in __metadata__ matches the data (zlib.crc32)
  st_damage.py flip FILE TENSOR      flips one bit in the middle of TENSOR's data
  st_damage.py garble FILE           overwrites the header's first bytes after the length
  st_damage.py truncate FILE         cuts the file short by a quarter of its data"""
import json, struct, sys, zlib

def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))

def main():
    cmd, path = sys.argv[1], sys.argv[2]
    n, h = header(path)
    if cmd == "check":
        meta = h.get("__metadata__", {})
        data = open(path, "rb").read()[8 + n:]
        names = [k for k in h if k != "__metadata__"]
        for k in names:
            b, e = h[k]["data_offsets"]
            want = meta["crc32." + k]
            got = "%08x" % zlib.crc32(data[b:e])
            assert got == want, (k, got, want)
        print("checked %d tensors" % len(names))
    elif cmd == "flip":
        b, e = h[sys.argv[3]]["data_offsets"]
        off = 8 + n + (b + e) // 2
        with open(path, "r+b") as f:
            f.seek(off)
            c = f.read(1)[0]
            f.seek(off)
            f.write(bytes([c ^ 0x10]))
    elif cmd == "garble":
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(b"{garbage")
    elif cmd == "truncate":
        import os
        size = os.path.getsize(path)
        os.truncate(path, size - (size - 8 - n) // 4)
    else:
        sys.exit("unknown command " + cmd)

main()
