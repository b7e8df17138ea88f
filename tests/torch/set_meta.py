#!/usr/bin/env python3
"""tests/torch/set_meta.py: set __metadata__ keys of a safetensors file in place.

usage: set_meta.py FILE KEY=VALUE...

For tests that start meshrun from a state training reaches only by chance,
e.g. fp16's loss scale high enough to overflow for several steps:
  set_meta.py CK/step-00000200/optim.safetensors loss_scale=268435456
"""
import json
import struct
import sys


def main():
    if len(sys.argv) < 3 or any("=" not in kv for kv in sys.argv[2:]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    path = sys.argv[1]
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0] if len(blob) >= 8 else 0
    if n == 0 or 8 + n > len(blob):
        print(f"set_meta.py: {path}: not a safetensors file", file=sys.stderr)
        return 1
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.setdefault("__metadata__", {})
    for kv in sys.argv[2:]:
        k, v = kv.split("=", 1)
        meta[k] = v
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data stays 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob[8 + n:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
