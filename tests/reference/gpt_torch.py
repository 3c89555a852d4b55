#!/usr/bin/env python3
"""The GPT-2 model of Fuyou in PyTorch, for checking the CUDA backend against an independent
implementation, in fp32 (the reference) or in bf16 autocast (to calibrate what bf16 costs).

Same model as gpt_ref.py (see its top comment and common/model/model.h): x = wte[token] + wpe[t]; L
pre-LN blocks (LayerNorm eps 1e-5, causal attention through scaled_dot_product_attention, GELU
with the tanh approximation); final LayerNorm; logits = lnf(x) wte^T (the head is tied to wte);
loss = mean cross-entropy over the targets >= 0 (targets < 0 are ignored; with no target at all
the loss and the gradients are 0). Gradients come from autograd.

Usage:
    python3 gpt_torch.py [--dtype fp32|bf16] [--device auto|cpu|cuda] [--logits LOGITS] IN OUT

  --dtype fp32  fp32 everywhere: TF32 is switched off and attention uses SDPA's math backend, so
                this is an fp32-accurate reference (default).
  --dtype bf16  torch.autocast(device, dtype=torch.bfloat16): matrix products and attention in
                bf16 (SDPA picks its own kernel), LayerNorm and the loss in fp32, as autocast does.
                The parameters and their gradients stay fp32.
  --device      CUDA when available (default auto), else the CPU.

File formats (little-endian, no padding):
  IN, OUT  exactly those of gpt_ref.py (this script reads IN and writes OUT with its functions):
           OUT is float64: the loss, then the gradient of every unit in the layout of IN's
           parameters.
  LOGITS   float32 [B*T][V]: the logits of the forward pass (bf16 values under --dtype bf16),
           rows in the order of the tokens.

Exit status: 0 on success; 2 with a message on stderr for a malformed input, bad arguments or an
output that cannot be written; 3 when PyTorch cannot be imported or the device asked for is not
there; 1 when the loss comes out NaN or infinite (or PyTorch itself fails, with its traceback).
"""

import argparse
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree by the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ref  # noqa: E402  (the file format, shared)

import numpy as np  # noqa: E402


def fail(status, msg):
    print(f"gpt_torch.py: {msg}", file=sys.stderr)
    sys.exit(status)


def parse_args(argv):
    p = argparse.ArgumentParser(description="GPT-2 of Fuyou in PyTorch (loss, gradients, logits).")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--logits", metavar="LOGITS", help="also write the logits, float32 [B*T][V]")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    return p.parse_args(argv)  # exits 2 with a message on bad arguments


def pick_device(torch, which):
    if which == "cuda" or (which == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            fail(3, "--device cuda: PyTorch sees no CUDA device")
        return torch.device("cuda")
    return torch.device("cpu")


def fp32_exact(torch):
    """No TF32 anywhere (fp32 products must be fp32-accurate for the reference). PyTorch >= 2.9
    has the fp32_precision settings and warns about (and may refuse a mix with) the older ones."""
    if hasattr(torch.backends, "fp32_precision"):
        for owner in ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "cuda.math_sdp"):
            obj = torch.backends
            try:
                for part in filter(None, owner.split(".")):
                    obj = getattr(obj, part)
                if hasattr(obj, "fp32_precision"):
                    obj.fp32_precision = "ieee"
            except (AttributeError, RuntimeError, ValueError):
                pass
    else:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def math_attention(torch):
    """Context forcing SDPA's math backend (fp32-accurate, no TF32 tricks)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.MATH)
    except ImportError:  # PyTorch < 2.3
        return torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True,
                                              enable_mem_efficient=False)


def model_params(torch, cfg, units, dev):
    """The model's parameters as leaf tensors on dev, from the units in gpt_ref.py's layout:
    {"wte", "wpe", "blocks": [{name: tensor}] per block, "lnf_w", "lnf_b"}."""
    L, C, V, ctx = (cfg[k] for k in ("L", "C", "V", "ctx"))

    def leaf(a, shape):
        # the file's parameters are fp32, read as float64: converting back is exact
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(shape)).to(dev)
        return t.requires_grad_(True)

    P = {"wte": leaf(units[0][:V * C], (V, C)), "wpe": leaf(units[0][V * C:], (ctx, C)),
         "blocks": [], "lnf_w": leaf(units[L + 1][:C], (C,)), "lnf_b": leaf(units[L + 1][C:], (C,))}
    for layer in range(L):
        views = gpt_ref.split_block(units[1 + layer], C)
        P["blocks"].append({name: leaf(views[name], views[name].shape)
                            for name in gpt_ref.BLOCK_TENSORS})
    return P


def forward_loss(torch, F, cfg, P, tokens, targets):
    """P: dict of leaf tensors. Returns (loss, logits [B,T,V], number of valid targets)."""
    B, T, L, NH, C, V = (cfg[k] for k in ("B", "T", "L", "NH", "C", "V"))
    hs = C // NH
    eps = gpt_ref.LN_EPS
    x = P["wte"][tokens] + P["wpe"][:T].unsqueeze(0)
    for layer in range(L):
        p = P["blocks"][layer]
        h = F.layer_norm(x, (C,), p["ln1_w"], p["ln1_b"], eps)
        qkv = F.linear(h, p["qkv_w"], p["qkv_b"])
        q, k, v = (t.reshape(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(hs)
        a = a.transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(a, p["attn_w"], p["attn_b"])
        h = F.layer_norm(x, (C,), p["ln2_w"], p["ln2_b"], eps)
        f = F.gelu(F.linear(h, p["fc_w"], p["fc_b"]), approximate="tanh")
        x = x + F.linear(f, p["proj_w"], p["proj_b"])
    xf = F.layer_norm(x, (C,), P["lnf_w"], P["lnf_b"], eps)
    logits = F.linear(xf, P["wte"])  # tied head
    n_valid = int((targets >= 0).sum().item())
    if n_valid:
        loss = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1), ignore_index=-1,
                               reduction="mean")
    else:  # cross_entropy's mean over nothing is NaN; the model's loss is 0, gradients 0
        loss = (logits.float() * 0.0).sum()
    return loss, logits, n_valid


def main(argv):
    args = parse_args(argv)
    try:
        cfg, units, tokens_np, targets_np = gpt_ref.read_input(args.input)
    except gpt_ref.InputError as e:
        fail(2, str(e))
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        fail(3, f"cannot import torch ({e}); install PyTorch (pip install torch)")
    dev = pick_device(torch, args.device)
    fp32_exact(torch)  # also under bf16: what autocast leaves in fp32 stays fp32-accurate

    B, T, V = (cfg[k] for k in ("B", "T", "V"))

    P = model_params(torch, cfg, units, dev)
    tokens = torch.from_numpy(tokens_np).to(dev)
    targets = torch.from_numpy(np.where(targets_np < 0, -1, targets_np)).to(dev)

    if args.dtype == "fp32":
        with math_attention(torch):
            loss, logits, _ = forward_loss(torch, F, cfg, P, tokens, targets)
            loss.backward()
    else:
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss, logits, _ = forward_loss(torch, F, cfg, P, tokens, targets)
        loss.backward()

    def grad(t):
        g = t.grad
        if g is None:  # a tensor with no path to the loss
            return np.zeros(tuple(t.shape), dtype=np.float64).reshape(-1)
        return g.detach().to("cpu", torch.float64).numpy().reshape(-1)

    grads = [np.concatenate([grad(P["wte"]), grad(P["wpe"])])]
    for p in P["blocks"]:
        grads.append(np.concatenate([grad(p[name]) for name in gpt_ref.BLOCK_TENSORS]))
    grads.append(np.concatenate([grad(P["lnf_w"]), grad(P["lnf_b"])]))
    sizes = gpt_ref.unit_sizes(cfg)
    assert [g.size for g in grads] == sizes, ([g.size for g in grads], sizes)
    loss_value = float(loss.detach().to("cpu", torch.float64).item())
    if not np.isfinite(loss_value):
        fail(1, f"the loss is not finite ({loss_value})")

    # the logits first: OUT appears only when everything asked for was written
    try:
        if args.logits:
            lg = logits.detach().to("cpu", torch.float32).numpy().reshape(B * T, V)
            tmp = args.logits + ".tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(np.ascontiguousarray(lg, dtype="<f4").tobytes())
                os.replace(tmp, args.logits)
            except OSError:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
        gpt_ref.write_output(args.output, loss_value, grads)
    except OSError as e:
        fail(2, f"cannot write {e.filename}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
