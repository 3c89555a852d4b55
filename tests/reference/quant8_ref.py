#!/usr/bin/env python3
"""Reference for opt_worker/quant8: the dynamic maps of Dettmers et al. (bitsandbytes'
create_dynamic_map with 7 exponent bits, 8 bits in all) and block-wise 8-bit quantization, written
from the specification in opt_worker/quant8.h with numpy alone.

    quant8_ref.py map SIGNED OUT            OUT: the 256 fp32 map values
    quant8_ref.py quantize SIGNED IN OUT    IN: raw little-endian fp32 values;
                                            OUT: uint32 n, then n uint8 codes, then the fp32 absmax
"""
import sys

import numpy as np

BLOCK = 256


def dynamic_map(signed):
    values = []
    for e in range(7):
        fracs = 2 ** e if signed else 2 ** (e + 1)
        decade = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)[e]
        for j in range(fracs):
            frac = 0.1 + 0.9 * float(2 * j + 1) / float(2 * fracs)  # python floats: IEEE double
            v = np.float32(frac * decade)
            values.append(v)
            if signed:
                values.append(-v)
    values += [np.float32(0.0), np.float32(1.0)]
    assert len(values) == 256
    return np.sort(np.array(values, dtype=np.float32))


def midpoints(m):
    d = m.astype(np.float64)
    return (d[:-1] + d[1:]) / 2.0


def quantize(x, signed):
    x = np.asarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)) or (not signed and np.any(x < 0)):
        raise ValueError("NaN, Inf, or a negative value for the unsigned map")
    m = dynamic_map(signed)
    mid = midpoints(m)
    nblocks = (x.size + BLOCK - 1) // BLOCK
    codes = np.empty(x.size, dtype=np.uint8)
    absmax = np.zeros(nblocks, dtype=np.float32)
    zero_code = np.searchsorted(mid, 0.0, side="left")
    for b in range(nblocks):
        xb = x[b * BLOCK:(b + 1) * BLOCK]
        a = np.max(np.abs(xb))
        absmax[b] = a
        if a == 0:
            codes[b * BLOCK:b * BLOCK + xb.size] = zero_code
            continue
        y = (xb / a).astype(np.float32)  # fp32 division
        # number of midpoints < y: nearest map value, a tie to the lower index
        codes[b * BLOCK:b * BLOCK + xb.size] = np.searchsorted(mid, y.astype(np.float64), side="left")
    return codes, absmax


def dequantize(codes, absmax, signed):
    m = dynamic_map(signed)
    scale = np.repeat(absmax, BLOCK)[:codes.size]
    return (m[codes] * scale).astype(np.float32)


def main():
    cmd, signed = sys.argv[1], int(sys.argv[2]) != 0
    if cmd == "map":
        dynamic_map(signed).astype("<f4").tofile(sys.argv[3])
    elif cmd == "quantize":
        x = np.fromfile(sys.argv[3], dtype="<f4")
        codes, absmax = quantize(x, signed)
        with open(sys.argv[4], "wb") as f:
            f.write(np.array([x.size], dtype="<u4").tobytes())
            f.write(codes.tobytes())
            f.write(absmax.astype("<f4").tobytes())
    else:
        sys.exit("usage: quant8_ref.py map SIGNED OUT | quantize SIGNED IN OUT")


if __name__ == "__main__":
    main()
