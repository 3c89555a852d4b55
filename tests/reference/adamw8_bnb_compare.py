#!/usr/bin/env python3
"""Compares Fuyou's AdamW with 8-bit block-wise moments (as adamw_ref.py computes it, which the C
kernels match bit for bit: tests/test_adamw) with bitsandbytes' AdamW8bit on the CPU, step by step
from the zero state with the same fp32 gradients. Not a CI test: bitsandbytes and torch are not
dependencies. Prints, per step, how far apart the weights, the moments' codes and the absmax are.

    adamw8_bnb_compare.py [N [STEPS]]      (default 65536 parameters, 5 steps)
"""
import struct
import sys

import numpy as np
import torch
import bitsandbytes as bnb

import adamw_ref
import quant8_ref

LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.1


def ours_step(p, mc, ma, vc, va, g, t):
    n = p.size
    hdr = struct.pack("<IIIIQffffff", adamw_ref.Q8, n, 1, 1, t, LR, B1, B2, EPS, WD, 0.0)
    data = b"".join([hdr, p.astype("<f4").tobytes(), mc.tobytes(), ma.astype("<f4").tobytes(),
                     vc.tobytes(), va.astype("<f4").tobytes(), g.astype("<f4").tobytes()])
    out = adamw_ref.run(data)
    nb = ma.size
    off = 0

    def take(dtype, count):
        nonlocal off
        a = np.frombuffer(out, dtype=dtype, count=count, offset=off).copy()
        off += a.nbytes
        return a

    p = take("<f4", n)
    take("<u2", n)
    mc, ma = take("u1", n), take("<f4", nb)
    vc, va = take("u1", n), take("<f4", nb)
    return p, mc, ma, vc, va


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 65536
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rng = np.random.default_rng(1)
    p0 = rng.uniform(-1, 1, n).astype(np.float32)
    grads = [(rng.standard_normal(n) * 0.01).astype(np.float32) for _ in range(steps)]

    maps = adamw_ref.Maps()
    nb = (n + quant8_ref.BLOCK - 1) // quant8_ref.BLOCK
    p = p0.copy()
    mc = np.full(n, maps.zero[True], dtype=np.uint8)
    vc = np.full(n, maps.zero[False], dtype=np.uint8)
    ma = np.zeros(nb, dtype=np.float32)
    va = np.zeros(nb, dtype=np.float32)

    tp = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = bnb.optim.AdamW8bit([tp], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD,
                              min_8bit_size=0)
    print(f"bitsandbytes {bnb.__version__}, torch {torch.__version__}: AdamW8bit on the CPU, "
          f"{n} parameters, lr {LR} betas ({B1}, {B2}) eps {EPS} weight decay {WD}")
    for s in range(steps):
        g = grads[s]
        p, mc, ma, vc, va = ours_step(p, mc, ma, vc, va, g, s + 1)
        tp.grad = torch.from_numpy(g.copy())
        opt.step()
        st = opt.state[tp]
        if s == 0:
            for k, signed in (("qmap1", True), ("qmap2", False)):
                theirs = st[k].cpu().numpy().astype(np.float32)
                mine = maps.map[signed]
                print(f"  {k} ({'signed' if signed else 'unsigned'} map): "
                      f"{int(np.sum(theirs != mine))} of 256 entries differ, largest by "
                      f"{float(np.max(np.abs(theirs - mine))):.3g}")
        bp = tp.detach().cpu().numpy()
        b1c, b1a = st["state1"].cpu().numpy().ravel(), st["absmax1"].cpu().numpy().ravel()
        b2c, b2a = st["state2"].cpu().numpy().ravel(), st["absmax2"].cpu().numpy().ravel()
        dp = np.abs(bp - p)
        print(f"step {s + 1}: weights: {int(np.sum(bp != p))} of {n} differ, max |diff| "
              f"{float(np.max(dp)):.3g} ({float(np.max(dp)) / LR:.3g} lr), differ by more than "
              f"0.01 lr at {int(np.sum(dp > 0.01 * LR))}; "
              f"m codes differ at {int(np.sum(b1c != mc))} (by more than 1 at "
              f"{int(np.sum(np.abs(b1c.astype(int) - mc.astype(int)) > 1))}), v codes at "
              f"{int(np.sum(b2c != vc))} (>1: {int(np.sum(np.abs(b2c.astype(int) - vc.astype(int)) > 1))}); "
              f"absmax m max rel diff {float(np.max(np.abs(b1a - ma) / (np.abs(ma) + 1e-30))):.3g}, "
              f"v {float(np.max(np.abs(b2a - va) / (np.abs(va) + 1e-30))):.3g}")


if __name__ == "__main__":
    main()
