#!/usr/bin/env python3
"""The peer baseline for make bench-pipeline: whole training steps of the same GPT-3-sized GPT under
PyTorch FSDP2 (fully_shard, world size 1) with its fp32 parameters and gradients in pinned host
memory and torch's AdamW stepping them on the CPU (CPUOffloadPolicy), bf16 compute
(MixedPrecisionPolicy), each block its own FSDP unit and recomputed in the backward (--no-ckpt keeps
its activations), random tokens from a fixed seed. The first step warms up and is left out; the last
line is the summary bench_pipeline.sh parses:
  fsdp2 config=1.3B B=16 T=1024 step_s=<median> tflops=<model TFLOP/s> peak_gpu_gib=<x>
(or `fsdp2 config=1.3B B=16 error=OOM`, exit 0), model TFLOP/s = (6*N*B*T + 6*L*B*T^2*width) / step_s,
the formula of bench_gpu. Usage:
  python3 tests/bench/fsdp2_offload.py --config 1.3B --batch 16 --seq 1024 --steps 3 [--no-ckpt]
--steps counts the timed steps (one more runs first). Smoke test without a GPU (gloo; unpinned
offload, or no fully_shard at all where FSDP2 needs CUDA, as in PyTorch 2.5):
  python3 tests/bench/fsdp2_offload.py --device cpu --config tiny --batch 2 --seq 64 --steps 2"""
import argparse
import contextlib
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.checkpoint import checkpoint

try:  # PyTorch >= 2.6
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
except ImportError:  # 2.4, 2.5
    from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

CONFIGS = {"tiny": (2, 128, 4), "1.3B": (24, 2048, 16), "2.7B": (32, 2560, 32)}  # layers, width, heads
VOCAB = 50304


class Block(nn.Module):
    def __init__(self, c, nh, ckpt):
        super().__init__()
        self.nh, self.ckpt = nh, ckpt
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj_attn = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)

    def body(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj_attn(y.transpose(1, 2).reshape(b, t, c))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def forward(self, x):  # recomputed inside the FSDP unit (its weights unsharded in backward)
        return checkpoint(self.body, x, use_reentrant=False) if self.ckpt else self.body(x)


class GPT(nn.Module):
    def __init__(self, layers, c, nh, ctx, ckpt):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, c)
        self.wpe = nn.Embedding(ctx, c)
        self.blocks = nn.ModuleList(Block(c, nh, ckpt) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # head tied to wte
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def init_weights(model, layers):
    """GPT-2 initialisation, in place on each parameter's local shard (the whole tensor here)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("bias"):
                t.zero_()
            elif ".ln" in name or name.startswith("lnf."):
                t.fill_(1.0)
            else:
                resid = name.endswith(("proj.weight", "proj_attn.weight"))  # into the residual
                t.normal_(0.0, 0.02 / (2 * layers) ** 0.5 if resid else 0.02)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=CONFIGS, default="1.3B")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up step")
    ap.add_argument("--no-ckpt", action="store_true", help="keep block activations (no recompute)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = ap.parse_args()
    L, C, NH = CONFIGS[a.config]
    B, T, cuda = a.batch, a.seq, a.device == "cuda"
    tag = f"fsdp2 config={a.config} B={B}"

    backend = "nccl" if cuda else "gloo"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    try:
        if cuda and not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise RuntimeError("no CUDA device or no NCCL in this PyTorch")
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method="env://", rank=0, world_size=1)
    except Exception as e:  # noqa: BLE001 -- one clear line, whatever the cause
        print(f"fsdp2_offload: cannot start a {backend} process group on {a.device}: {e}".replace("\n", " "))
        return 2

    try:
        return train(a, L, C, NH, B, T, cuda, tag)
    finally:
        dist.destroy_process_group()


def fsdp2_runs_on_cpu(mesh):  # 2.5's FSDP2 cannot: "FSDP requires CUDA for streams"
    try:
        lin = fully_shard(nn.Linear(2, 2), mesh=mesh)
        lin(torch.ones(1, 2)).sum().backward()
        return True
    except RuntimeError:
        return False


def train(a, L, C, NH, B, T, cuda, tag):
    torch.manual_seed(1234)
    with torch.device("meta"):  # no memory until to_empty, after sharding
        model = GPT(L, C, NH, T, not a.no_ckpt)
    n = sum(p.numel() for p in model.parameters())
    assert n == VOCAB * C + T * C + L * (12 * C * C + 13 * C) + 2 * C, n
    mesh = init_device_mesh(a.device, (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    shard, amp, offload = True, contextlib.nullcontext(), "cpu pinned"
    if not cuda and fsdp2_runs_on_cpu(mesh):  # pinning needs CUDA
        print("fsdp2_offload: cpu device: CPUOffloadPolicy(pin_memory=False)")
        offload = "cpu unpinned"
    elif not cuda:
        print(f"fsdp2_offload: cpu device: FSDP2 of PyTorch {torch.__version__} needs CUDA; "
              "training without fully_shard, under bf16 autocast")
        shard, amp, offload = False, torch.autocast("cpu", dtype=torch.bfloat16), "none"
    if shard:
        policy = CPUOffloadPolicy(pin_memory=cuda)
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, mp_policy=mp, offload_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=policy)
    model.to_empty(device="cpu")  # the fp32 master weights, in host memory; FSDP pins them
    init_weights(model, L)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), fused=False)
    print(f"fsdp2 {a.config}: L={L} C={C} NH={NH} V={VOCAB} B={B} T={T} params={n / 1e9:.3f}B "
          f"ckpt={'off' if a.no_ckpt else 'on'} offload={offload} torch={torch.__version__}", flush=True)

    gen = torch.Generator().manual_seed(1)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    flops = 6.0 * n * B * T + 6.0 * L * B * T * T * C
    times = []
    try:
        for step in range(a.steps + 1):
            tok = torch.randint(0, VOCAB, (B, T + 1), generator=gen).to(dev)
            sync()
            t0 = time.perf_counter()
            with amp:
                loss = model(tok[:, :-1], tok[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            dt = time.perf_counter() - t0
            if step > 0:
                times.append(dt)
            print(f"step {step}{' (warm-up)' if step == 0 else ''}: loss {loss.item():.4f} "
                  f"{dt:.3f} s {flops / dt / 1e12:.4g} TFLOP/s", flush=True)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        if not isinstance(e, torch.cuda.OutOfMemoryError) and "out of memory" not in str(e).lower():
            raise
        print(f"fsdp2_offload: out of memory: {str(e).splitlines()[0][:200]}")
        print(f"{tag} error=OOM", flush=True)
        return 0
    step_s = statistics.median(times) if times else float("nan")
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"fsdp2_offload: peak host RSS {rss:.1f} GiB")
    print(f"{tag} T={T} step_s={step_s:.3f} tflops={flops / step_s / 1e12:.4g} peak_gpu_gib={peak:.2f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
