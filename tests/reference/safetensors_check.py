#!/usr/bin/env python3
"""An independent reading of the safetensors format for tests/test_safetensors.c, in plain Python
(struct and json only), so that our reader and writer are not checked only against each other.

  safetensors_check.py check FILE SPEC         our single file against the spec the test wrote
  safetensors_check.py check-dir DIR SPEC K    a sharded checkpoint of K shards (or K = 1: one file)
  safetensors_check.py write FILE EXPECT       hand-build a file; EXPECT gets what a reader must see

SPEC: {"metadata": {...}, "tensors": [{"name", "dtype", "shape", "bits": [stored element bits]}]}.
EXPECT: {"metadata": {...}, "tensors": [{"name", "dtype", "shape", "f32_bits": [...], "raw_hex"}]}.
Exit status 0 when everything agrees, 1 with the first difference on stderr, 2 on bad usage."""
import json
import math
import os
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2}
FMT = {"F32": "<I", "BF16": "<H", "F16": "<H"}


class Mismatch(Exception):
    pass


def need(cond, what):
    if not cond:
        raise Mismatch(what)


def read_file(path):
    """Header (ordered pairs), data buffer, header length; checks the framing as the format says."""
    with open(path, "rb") as f:
        blob = f.read()
    need(len(blob) >= 8, f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack_from("<Q", blob, 0)
    need(8 + n <= len(blob), f"{path}: header length {n} past the end")
    text = blob[8 : 8 + n].decode("utf-8")
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
    return pairs, blob[8 + n :], n, text


def check_file(path, spec_tensors, metadata, strict_layout=True):
    """Checks one file written by our writer against the spec's tensors, in order."""
    pairs, data, n, text = read_file(path)
    need(n % 8 == 0, f"{path}: header length {n} is not a multiple of 8")
    need(len(text) - len(text.rstrip(" ")) < 8, f"{path}: more header padding than alignment needs")
    keys = [k for k, _ in pairs]
    want = ([] if not metadata else ["__metadata__"]) + [t["name"] for t in spec_tensors]
    need(keys == want, f"{path}: keys {keys} != declaration order {want}")
    at = 0
    for k, v in pairs:
        if k == "__metadata__":
            need(dict(v) == metadata, f"{path}: metadata {dict(v)} != {metadata}")
            continue
        info = dict(v)
        t = next(t for t in spec_tensors if t["name"] == k)
        need(info["dtype"] == t["dtype"], f"{path}: {k}: dtype {info['dtype']} != {t['dtype']}")
        need(list(info["shape"]) == t["shape"], f"{path}: {k}: shape {info['shape']} != {t['shape']}")
        b, e = info["data_offsets"]
        numel = math.prod(t["shape"])
        need(e - b == numel * SIZES[t["dtype"]], f"{path}: {k}: size")
        if strict_layout:
            need(b == at, f"{path}: {k}: data starts at {b}, expected {at} (packed in order)")
        at = e
        fmt = FMT[t["dtype"]]
        got = [struct.unpack_from(fmt, data, b + i * SIZES[t["dtype"]])[0] for i in range(numel)]
        need(got == t["bits"], f"{path}: {k}: values differ: {got[:8]} vs {t['bits'][:8]}")
    need(len(data) == at, f"{path}: {len(data)} data bytes, tensors end at {at}")
    return keys


def check_dir(d, spec, k):
    tensors = spec["tensors"]
    meta = spec.get("metadata", {})
    if k == 1:
        need(not os.path.exists(os.path.join(d, "model.safetensors.index.json")), "stray index")
        check_file(os.path.join(d, "model.safetensors"), tensors, meta)
        return
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f, object_pairs_hook=lambda kv: kv)
    index = dict(index)
    wm = index["weight_map"]
    need([n for n, _ in wm] == [t["name"] for t in tensors], "weight_map order")
    total = sum(math.prod(t["shape"]) * SIZES[t["dtype"]] for t in tensors)
    need(dict(index["metadata"]).get("total_size") == total, f"total_size != {total}")
    names = [f"model-{i:05d}-of-{k:05d}.safetensors" for i in range(1, k + 1)]
    need(sorted(set(f for _, f in wm)) == names, f"shard names {sorted(set(f for _, f in wm))}")
    need(sorted(x for x in os.listdir(d) if x.endswith(".safetensors")) == names, "files in dir")
    for name in names:
        mine = [t for t in tensors if dict(wm)[t["name"]] == name]
        check_file(os.path.join(d, name), mine, meta)


def f32_bits_of(dtype, raw):
    """What an exact reader must return, as f32 bits (NaN: any NaN of that sign, marked by None)."""
    if dtype == "F32":
        return struct.unpack("<I", raw)[0]
    if dtype == "BF16":
        return struct.unpack("<H", raw)[0] << 16
    (x,) = struct.unpack("<e", raw)
    if math.isnan(x):
        return "nan-" if raw[1] & 0x80 else "nan+"
    return struct.unpack("<I", struct.pack("<f", x))[0]


def write(path, expect_path):
    """A file laid out unlike our writer's: keys not sorted, data in reverse key order, a gap-free
    but unpadded header, metadata last."""
    f16 = [0x0000, 0x8000, 0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x0200, 0x8001,
           0x7C00, 0xFC00, 0x7E00, 0xFC01, 0x3555, 0x0400, 0x83FF]
    bf16 = [0x3F80, 0xBF80, 0x4049, 0x0001, 0x7F80, 0x8000]
    f32 = [struct.unpack("<I", struct.pack("<f", v))[0] for v in (1.5, -2.25, 3.0e-39)]
    tensors = [  # name, dtype, shape, element bits
        ("model.h.0.half", "F16", [4, 4], f16),
        ("model.w", "BF16", [2, 3], bf16),
        ("bias", "F32", [3], f32),
        ("scale", "F32", [], [struct.unpack("<I", struct.pack("<f", 0.125))[0]]),
        ("empty", "F16", [0, 4], []),
    ]
    raws = {}
    for name, dtype, shape, bits in tensors:
        raws[name] = b"".join(struct.pack(FMT[dtype], b) for b in bits)
    data, offsets = b"", {}
    for name, dtype, shape, bits in reversed(tensors):
        offsets[name] = (len(data), len(data) + len(raws[name]))
        data += raws[name]
    header = {}
    for name, dtype, shape, bits in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": list(offsets[name])}
    header["__metadata__"] = {"format": "pt", "note": "h\u00e9llo"}
    text = json.dumps(header, ensure_ascii=False).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    expect = {"metadata": header["__metadata__"], "tensors": []}
    for name, dtype, shape, bits in tensors:
        raw = raws[name]
        sz = SIZES[dtype]
        expect["tensors"].append({
            "name": name, "dtype": dtype, "shape": shape, "raw_hex": raw.hex(),
            "f32_bits": [f32_bits_of(dtype, raw[i : i + sz]) for i in range(0, len(raw), sz)],
        })
    with open(expect_path, "w") as f:
        json.dump(expect, f)


def main(argv):
    try:
        if len(argv) == 4 and argv[1] == "check":
            with open(argv[3]) as f:
                spec = json.load(f)
            check_file(argv[2], spec["tensors"], spec.get("metadata", {}))
        elif len(argv) == 5 and argv[1] == "check-dir":
            with open(argv[3]) as f:
                spec = json.load(f)
            check_dir(argv[2], spec, int(argv[4]))
        elif len(argv) == 4 and argv[1] == "write":
            write(argv[2], argv[3])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (Mismatch, KeyError, ValueError, StopIteration) as e:
        print(f"safetensors_check: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
