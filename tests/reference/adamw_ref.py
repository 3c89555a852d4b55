#!/usr/bin/env python3
"""Reference for opt_worker/adamw's update with fp32, bf16 and block-wise 8-bit moments, written
from the specification in opt_worker/adamw.h with numpy alone (the 8-bit maps and midpoints from
quant8_ref.py). Every operation is a float32 operation (numpy keeps float32 arrays and np.float32
scalars in float32, and its +, -, *, / and sqrt are IEEE), the per-step scalars are computed in
double and rounded once, as fy_adamw_consts does.

    adamw_ref.py IN OUT [IN OUT ...]

IN (little-endian): a header of u32 moments (0 f32, 1 bf16, 2 8-bit), u32 n, u32 steps,
u32 grad_dtype (0 bf16, 1 f32), u64 t0 (step count of the first step), f32 lr, beta1, beta2, eps,
weight_decay, grad_scale; then f32 master[n], the stored m, the stored v (f32[n], u16[n] bf16 bits,
or u8[n] codes followed by f32 absmax[ceil(n/256)]), then the gradients of each step (bf16 bits
u16[n] or f32[n]), steps t0, t0+1, ...
OUT: f32 master[n], u16 bf16 copy of master[n], the stored m, the stored v, as in IN.
"""
import math
import struct
import sys

import numpy as np

import quant8_ref

F32, BF16, Q8 = 0, 1, 2
BLOCK = quant8_ref.BLOCK


def f32(x):
    return np.float32(x)


def powu(b, t):
    """b^t by repeated squaring in double, as fy_adamw_powu."""
    r = 1.0
    while t:
        if t & 1:
            r *= b
        b *= b
        t >>= 1
    return r


def consts(lr, b1, b2, eps, wd, t):
    lr, b1, b2, eps, wd = (float(x) for x in (lr, b1, b2, eps, wd))
    bc1 = 1.0 - powu(b1, t)
    bc2 = 1.0 - powu(b2, t)
    return {
        "decay": f32(1.0 - lr * wd),
        "b1": f32(b1),
        "omb1": f32(1.0 - b1),
        "b2": f32(b2),
        "omb2": f32(1.0 - b2),
        "step": f32(lr / bc1),
        "bc2s": f32(math.sqrt(bc2)),
        "eps": f32(eps),
    }


def bf16_to_f32(h):
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even; NaN keeps its sign and top payload bits with the quiet bit set."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32)
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    q = (b >> np.uint32(16)) | np.uint32(0x40)
    return np.where(nan, q, r).astype(np.uint16)


class Maps:
    def __init__(self):
        self.map = {s: quant8_ref.dynamic_map(s) for s in (True, False)}
        self.mid = {s: quant8_ref.midpoints(self.map[s]) for s in (True, False)}
        self.zero = {s: int(np.searchsorted(self.mid[s], 0.0, side="left")) for s in (True, False)}


def dequantize(codes, absmax, signed, maps):
    scale = np.repeat(absmax, BLOCK)[:codes.size]
    return maps.map[signed][codes] * scale  # float32 * float32


def quantize_blocks(x, signed, maps):
    """quant8's rule per block, except that a block with a NaN or Inf gets absmax NaN and the code
    of 0 everywhere (adamw.h's rule for moments of non-finite gradients)."""
    n = x.size
    nb = (n + BLOCK - 1) // BLOCK
    codes = np.empty(n, dtype=np.uint8)
    absmax = np.zeros(nb, dtype=np.float32)
    for b in range(nb):
        xb = x[b * BLOCK:(b + 1) * BLOCK]
        sl = slice(b * BLOCK, b * BLOCK + xb.size)
        if not np.all(np.isfinite(xb)):
            absmax[b] = np.float32("nan")
            codes[sl] = maps.zero[signed]
            continue
        a = np.max(np.abs(xb))
        absmax[b] = a
        if a == 0:
            codes[sl] = maps.zero[signed]
            continue
        y = (xb / a).astype(np.float32)
        codes[sl] = np.searchsorted(maps.mid[signed], y.astype(np.float64), side="left")
    return codes, absmax


def step(k, p, m, v, g, gscale):
    """One update of float32 arrays, adamw.h's formula in its order; returns p, m, v."""
    if gscale != 0 and gscale != 1:
        g = g * gscale
    p = p * k["decay"]
    m = k["b1"] * m + k["omb1"] * g
    v = k["b2"] * v + k["omb2"] * (g * g)
    den = np.sqrt(v) / k["bc2s"] + k["eps"]
    p = p - (k["step"] * m) / den
    return p, m, v


def run(data):
    hdr = struct.Struct("<IIIIQffffff")
    (mode, n, steps, gdt, t0, lr, b1, b2, eps, wd, gscale) = hdr.unpack_from(data, 0)
    off = hdr.size
    nb = (n + BLOCK - 1) // BLOCK

    def take(dtype, count):
        nonlocal off
        a = np.frombuffer(data, dtype=dtype, count=count, offset=off).copy()
        off += a.nbytes
        return a

    maps = Maps()
    p = take("<f4", n)
    state = []
    for signed in (True, False):
        if mode == F32:
            state.append([take("<f4", n)])
        elif mode == BF16:
            state.append([take("<u2", n)])
        else:
            state.append([take("u1", n), take("<f4", nb)])
    w = np.zeros(n, dtype=np.uint16)
    gs = f32(gscale)
    with np.errstate(all="ignore"):
        for s in range(steps):
            g = bf16_to_f32(take("<u2", n)) if gdt == 0 else take("<f4", n)
            old = []
            for signed, st in zip((True, False), state):
                if mode == F32:
                    old.append(st[0])
                elif mode == BF16:
                    old.append(bf16_to_f32(st[0]))
                else:
                    old.append(dequantize(st[0], st[1], signed, maps))
            k = consts(lr, b1, b2, eps, wd, t0 + s)
            p, m, v = step(k, p, old[0], old[1], g, gs)
            w = f32_to_bf16(p)
            for signed, st, new in zip((True, False), state, (m, v)):
                if mode == F32:
                    st[0] = new.astype(np.float32)
                elif mode == BF16:
                    st[0] = f32_to_bf16(new)
                else:
                    st[0], st[1] = quantize_blocks(new, signed, maps)
    assert off == len(data), "input longer than its header says"
    out = [p.astype("<f4").tobytes(), w.astype("<u2").tobytes()]
    for st in state:
        out += [a.tobytes() for a in st]
    return b"".join(out)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit("usage: adamw_ref.py IN OUT [IN OUT ...]")
    for i in range(0, len(args), 2):
        with open(args[i], "rb") as f:
            data = f.read()
        with open(args[i + 1], "wb") as f:
            f.write(run(data))


if __name__ == "__main__":
    main()
