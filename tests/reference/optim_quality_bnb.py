#!/usr/bin/env python3
"""The held-out loss of Fuyou's GPT-2 model (gpt_torch.py's forward) fine-tuned in PyTorch on the
CPU with torch.optim.AdamW (fp32 moments) and with bitsandbytes' AdamW8bit (block-wise 8-bit
moments, its defaults: tensors under 4096 values keep fp32 moments), from the same initialisation
on the same batches: what the 8-bit format costs in bitsandbytes' own implementation, to read
beside tests/integration/test_optim_quality (docs/benchmarks.md, "Optimizer state formats:
quality"). Not a CI test: bitsandbytes and torch are not dependencies.

The run follows test_optim_quality's: byte-level tokens of the text, its last 10% held out; 2
layers, 4 heads, context 32; batch 8 x 32; lr 3e-3, 20 steps of linear warmup, then cosine decay to
3e-4 at the last step; betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on wte, wpe and the blocks'
matrices; 8 held-out batches at the end. GPT-2's initialisation (normal 0.02, the projections into
the residual 0.02 / sqrt(2 L), biases 0, LayerNorm weights 1) drawn by numpy from the seed; the
batches too, so the two optimizers see the same ones (not Fuyou's batches: its figures and these
are each compared within their own rows).

    optim_quality_bnb.py TEXT [WIDTH [SEED [STEPS]]]     (default 128 1 300)
"""
import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree by the imports below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ref  # noqa: E402
import gpt_torch  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import bitsandbytes as bnb  # noqa: E402

B, T, L, NH, V, CTX = 8, 32, 2, 4, 256, 32
LR, LR_MIN, WARMUP, BETAS, EPS, WD = 3e-3, 3e-4, 20, (0.9, 0.95), 1e-8, 0.1
EVAL_BATCHES = 8


def init_units(C, rng):
    units = [rng.normal(0.0, 0.02, V * C + CTX * C)]
    for _ in range(L):
        p = {}
        for name, shape in gpt_ref.block_shapes(C).items():
            if name in ("ln1_w", "ln2_w"):
                p[name] = np.ones(shape)
            elif name.endswith("_b"):
                p[name] = np.zeros(shape)
            elif name in ("attn_w", "proj_w"):
                p[name] = rng.normal(0.0, 0.02 / math.sqrt(2 * L), shape)
            else:
                p[name] = rng.normal(0.0, 0.02, shape)
        units.append(gpt_ref.flatten_block(p))
    units.append(np.concatenate([np.ones(C), np.zeros(C)]))
    return units


def lr_at(step, steps):
    if step <= WARMUP:
        return LR * step / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + (LR - LR_MIN) * 0.5 * (1 + math.cos(math.pi * progress))


def batch(tokens, rng):
    starts = rng.integers(0, tokens.size - T - 1, B)
    x = np.stack([tokens[s:s + T] for s in starts])
    y = np.stack([tokens[s + 1:s + T + 1] for s in starts])
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def run(opt_name, C, seed, steps, train, held):
    cfg = {"B": B, "T": T, "L": L, "NH": NH, "C": C, "V": V, "ctx": CTX}
    P = gpt_torch.model_params(torch, cfg, init_units(C, np.random.default_rng(seed)), "cpu")
    decay = [P["wte"], P["wpe"]] + [b[n] for b in P["blocks"] for n in gpt_ref.DECAY_BLOCK_TENSORS]
    rest = [P["lnf_w"], P["lnf_b"]] + [b[n] for b in P["blocks"] for n in gpt_ref.BLOCK_TENSORS
                                       if n not in gpt_ref.DECAY_BLOCK_TENSORS]
    groups = [{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}]
    if opt_name == "fp32":
        opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, foreach=False)
    else:
        opt = bnb.optim.AdamW8bit(groups, lr=LR, betas=BETAS, eps=EPS)
    rng = np.random.default_rng(seed + 1000)
    for step in range(1, steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        x, y = batch(train, rng)
        loss, _, _ = gpt_torch.forward_loss(torch, F, cfg, P, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    erng = np.random.default_rng(seed + 2000)
    with torch.no_grad():
        losses = [gpt_torch.forward_loss(torch, F, cfg, P, *batch(held, erng))[0].item()
                  for _ in range(EVAL_BATCHES)]
    return float(np.mean(losses))


def main():
    text = sys.argv[1]
    C = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    torch.set_num_threads(1)
    gpt_torch.fp32_exact(torch)
    tokens = np.frombuffer(open(text, "rb").read(), dtype=np.uint8)
    cut = tokens.size - tokens.size // 10
    train, held = tokens[:cut], tokens[cut:]
    fp32 = run("fp32", C, seed, steps, train, held)
    int8 = run("int8", C, seed, steps, train, held)
    print(f"bitsandbytes {bnb.__version__}, torch {torch.__version__}: 2 x {C}, seed {seed}, "
          f"{steps} steps: held-out loss AdamW (fp32) {fp32:.4f}, AdamW8bit {int8:.4f} "
          f"({100 * (int8 - fp32) / fp32:+.2f}%)")


if __name__ == "__main__":
    main()
