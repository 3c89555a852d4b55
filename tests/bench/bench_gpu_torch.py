#!/usr/bin/env python3
"""make bench-gpu, PyTorch's side: forward plus backward of the same GPT (bf16 autocast,
scaled_dot_product_attention, tied head, cross-entropy) timed with CUDA events, reported with the
same model TFLOP/s formula as bench_gpu: (6*N*B*T + 6*L*B*T^2*width) / time."""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj_attn = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.nh, c // self.nh)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj_attn(y.transpose(1, 2).reshape(b, t, c))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, nh, vocab, ctx):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(ctx, c)
        self.blocks = nn.ModuleList(Block(c, nh) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", default="custom")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--embd", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu_torch: skipped: no CUDA device")
        return 0
    torch.manual_seed(0)
    dev = "cuda"
    model = GPT(a.layers, a.embd, a.heads, a.vocab, a.seq).to(dev)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, tgt)
        loss.backward()
        for prm in model.parameters():
            prm.grad = None

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        step()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    ms = sorted(times)[len(times) // 2]
    n = sum(prm.numel() for prm in model.parameters())
    flops = 6.0 * n * a.batch * a.seq + 6.0 * a.layers * a.batch * a.seq**2 * a.embd
    mem = torch.cuda.max_memory_allocated() / 2**30
    print(f"pytorch {a.name:<6s} L={a.layers} C={a.embd} NH={a.heads} B={a.batch} T={a.seq} "
          f"V={a.vocab} params={n / 1e9:.3f}B  fwd+bwd {ms:.1f} ms (median of {a.iters})  "
          f"{flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s  peak memory {mem:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
