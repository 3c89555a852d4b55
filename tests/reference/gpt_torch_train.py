#!/usr/bin/env python3
"""Training of the GPT-2 model of Fuyou in PyTorch over S optimizer steps, for checking that the
CUDA backend's training follows PyTorch's (a loss trajectory), in fp32 (the reference) or in bf16
autocast (to calibrate what bf16 costs).

The model is gpt_torch.py's (imported from it: same forward, same fp32 settings); see its top
comment and gpt_ref.py's. From the initial parameters in IN, each step s = 1..S runs the forward
and backward of batch s, records its loss (before the update), then takes one torch.optim.AdamW
step: lr, betas (beta1, beta2), eps and weight_decay from IN, constant lr, no gradient clipping,
the single-tensor implementation (foreach=False, fused=False). Two parameter groups mirror
fy_model_decay_segments (common/model/model.c): weight decay on wte, wpe and the matrices of the blocks
(qkv_w, attn_w, fc_w, proj_w); none on the biases and the LayerNorm parameters (ln1_*, ln2_*,
lnf_*, *_b).

Usage:
    python3 gpt_torch_train.py [--dtype fp32|bf16] [--device auto|cpu|cuda] [--params PARAMS]
                               IN OUT

  --dtype fp32  fp32 everywhere: TF32 off, attention through SDPA's math backend (default).
  --dtype bf16  forward under torch.autocast(device, dtype=torch.bfloat16), as gpt_torch.py does;
                the parameters, their gradients and AdamW's state stay fp32.
  --device      CUDA when available (default auto), else the CPU.
  --params      also write the parameters after the S steps.

File formats (little-endian, no padding). IN is gpt_ref.py's IN extended to S batches and the
optimizer's hyperparameters, under its own magic so that neither script takes the other's file:
  IN:     int32[10]   magic 0x54475946 ("FYGT" as bytes), version 1, B, T, L, NH, C, V, ctx, S
          float64[5]  lr, beta1, beta2, eps, weight_decay
          float32     the initial parameters of units 0..L+1, in gpt_ref.py's layout
          S times:    int32 tokens [B][T] (0 <= token < V), then int32 targets [B][T]
                      (target < V; < 0 ignored) of that step's batch
  OUT:    float64[S]  the loss of each step, before its update
  PARAMS: float32     the parameters after the S steps, in IN's layout

Exit status: 0 on success; 2 with a message on stderr for a malformed input, bad arguments or an
output that cannot be written; 3 when PyTorch cannot be imported or the device asked for is not
there; 1 when a loss comes out NaN or infinite (or PyTorch itself fails, with its traceback).
"""

import argparse
import os
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree by the imports below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ref  # noqa: E402  (the layout)
import gpt_torch  # noqa: E402  (the model, the device and the fp32 settings)

import numpy as np  # noqa: E402

MAGIC = 0x54475946  # "FYGT"
VERSION = 1
HEADER_FIELDS = ("magic", "version", "B", "T", "L", "NH", "C", "V", "ctx", "S")
HPARAM_FIELDS = ("lr", "beta1", "beta2", "eps", "weight_decay")
MAX_STEPS = 1 << 16
# The block tensors that weight decay applies to (fy_model_decay_segments); wte and wpe decay too.
DECAY_BLOCK_TENSORS = ("qkv_w", "attn_w", "fc_w", "proj_w")


def fail(status, msg):
    print(f"gpt_torch_train.py: {msg}", file=sys.stderr)
    sys.exit(status)


def read_train_input(path):
    """(cfg, hparams, units, [(tokens, targets)] * S); raises gpt_ref.InputError."""
    InputError = gpt_ref.InputError
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    hsize = 4 * len(HEADER_FIELDS)
    psize = 8 * len(HPARAM_FIELDS)
    if len(data) < hsize + psize:
        raise InputError(f"{path}: {len(data)} bytes, shorter than the {hsize + psize}-byte "
                         f"header and hyperparameters")
    hdr = dict(zip(HEADER_FIELDS, struct.unpack(f"<{len(HEADER_FIELDS)}i", data[:hsize])))
    if hdr["magic"] != MAGIC:
        hint = "; a gpt_ref.py input (one batch, no optimizer)?" if hdr["magic"] == gpt_ref.MAGIC \
            else "; not a gpt_torch_train.py input file"
        raise InputError(f"{path}: bad magic 0x{hdr['magic'] & 0xffffffff:08x} "
                         f"(expected 0x{MAGIC:08x}){hint}")
    if hdr["version"] != VERSION:
        raise InputError(f"{path}: version {hdr['version']}, this script reads version {VERSION}")
    cfg = {k: hdr[k] for k in HEADER_FIELDS[2:9]}
    for k in cfg:
        if not 1 <= cfg[k] <= gpt_ref.MAX_DIM:
            raise InputError(f"{path}: {k} = {cfg[k]} is out of range [1, {gpt_ref.MAX_DIM}]")
    S = hdr["S"]
    if not 1 <= S <= MAX_STEPS:
        raise InputError(f"{path}: S = {S} is out of range [1, {MAX_STEPS}]")
    if cfg["C"] % cfg["NH"]:
        raise InputError(f"{path}: NH = {cfg['NH']} does not divide C = {cfg['C']}")
    if cfg["V"] < 2:
        raise InputError(f"{path}: V = {cfg['V']} must be at least 2")
    if cfg["T"] > cfg["ctx"]:
        raise InputError(f"{path}: T = {cfg['T']} exceeds ctx = {cfg['ctx']}")
    hp = dict(zip(HPARAM_FIELDS, struct.unpack(f"<{len(HPARAM_FIELDS)}d",
                                               data[hsize:hsize + psize])))
    if not all(np.isfinite(v) for v in hp.values()):
        raise InputError(f"{path}: a hyperparameter is NaN or infinite ({hp})")
    if hp["lr"] < 0 or hp["eps"] < 0 or hp["weight_decay"] < 0:
        raise InputError(f"{path}: lr, eps and weight_decay must be >= 0 ({hp})")
    if not (0 <= hp["beta1"] < 1 and 0 <= hp["beta2"] < 1):
        raise InputError(f"{path}: the betas must be in [0, 1) ({hp})")
    sizes = gpt_ref.unit_sizes(cfg)
    n_params = sum(sizes)
    n_tok = cfg["B"] * cfg["T"]
    expect = hsize + psize + 4 * n_params + S * 2 * 4 * n_tok
    if len(data) != expect:
        raise InputError(f"{path}: {len(data)} bytes, expected {expect} for B={cfg['B']} "
                         f"T={cfg['T']} L={cfg['L']} NH={cfg['NH']} C={cfg['C']} V={cfg['V']} "
                         f"ctx={cfg['ctx']} S={S} ({n_params} parameters)")
    at = hsize + psize
    params = np.frombuffer(data, dtype="<f4", count=n_params, offset=at).astype(np.float64)
    if not np.all(np.isfinite(params)):
        raise InputError(f"{path}: the parameters contain NaN or infinity")
    at += 4 * n_params
    ints = np.frombuffer(data, dtype="<i4", count=S * 2 * n_tok, offset=at)
    ints = ints.reshape(S, 2, cfg["B"], cfg["T"]).astype(np.int64)
    batches = []
    for s in range(S):
        tokens, targets = ints[s, 0], ints[s, 1]
        if tokens.min() < 0 or tokens.max() >= cfg["V"]:
            raise InputError(f"{path}: batch {s + 1}: a token is outside [0, V={cfg['V']})")
        if targets.max() >= cfg["V"]:
            raise InputError(f"{path}: batch {s + 1}: a target is >= V={cfg['V']}")
        batches.append((tokens, np.where(targets < 0, -1, targets)))
    units, at = [], 0
    for n in sizes:
        units.append(params[at:at + n].copy())
        at += n
    return cfg, hp, units, batches


def parse_args(argv):
    p = argparse.ArgumentParser(description="S AdamW steps of the GPT-2 of Fuyou in PyTorch "
                                            "(the loss of each step).")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--params", metavar="PARAMS", help="also write the final parameters, float32")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    return p.parse_args(argv)  # exits 2 with a message on bad arguments


def write_atomic(path, payload):
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main(argv):
    args = parse_args(argv)
    try:
        cfg, hp, units, batches = read_train_input(args.input)
    except gpt_ref.InputError as e:
        fail(2, str(e))
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        fail(3, f"cannot import torch ({e}); install PyTorch (pip install torch)")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail(3, "--device cuda: PyTorch sees no CUDA device")
    dev = gpt_torch.pick_device(torch, args.device)
    gpt_torch.fp32_exact(torch)  # also under bf16: what autocast leaves in fp32 stays fp32-accurate

    cfg_model = dict(cfg)

    P = gpt_torch.model_params(torch, cfg, units, dev)

    # In unit order, each tensor once: (tensor, decays), as fy_model_decay_segments splits the units.
    ordered = [(P["wte"], True), (P["wpe"], True)]
    for p in P["blocks"]:
        ordered += [(p[name], name in DECAY_BLOCK_TENSORS) for name in gpt_ref.BLOCK_TENSORS]
    ordered += [(P["lnf_w"], False), (P["lnf_b"], False)]
    decay = [t for t, d in ordered if d]
    no_decay = [t for t, d in ordered if not d]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            foreach=False, fused=False)

    losses = []
    for s, (tokens_np, targets_np) in enumerate(batches):
        tokens = torch.from_numpy(tokens_np).to(dev)
        targets = torch.from_numpy(targets_np).to(dev)
        opt.zero_grad(set_to_none=True)
        if args.dtype == "fp32":
            with gpt_torch.math_attention(torch):
                loss, _, _ = gpt_torch.forward_loss(torch, F, cfg_model, P, tokens, targets)
                loss.backward()
        else:
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss, _, _ = gpt_torch.forward_loss(torch, F, cfg_model, P, tokens, targets)
            loss.backward()
        value = float(loss.detach().to("cpu", torch.float64).item())
        if not np.isfinite(value):
            fail(1, f"step {s + 1}: the loss is not finite ({value})")
        losses.append(value)
        opt.step()

    # the parameters first: OUT appears only when everything asked for was written
    try:
        if args.params:
            flat = [torch.cat([P["wte"].detach().reshape(-1), P["wpe"].detach().reshape(-1)])]
            for p in P["blocks"]:
                flat.append(torch.cat([p[name].detach().reshape(-1)
                                       for name in gpt_ref.BLOCK_TENSORS]))
            flat.append(torch.cat([P["lnf_w"].detach(), P["lnf_b"].detach()]))
            assert [t.numel() for t in flat] == gpt_ref.unit_sizes(cfg)
            arr = torch.cat(flat).to("cpu", torch.float32).numpy()
            write_atomic(args.params, np.ascontiguousarray(arr, dtype="<f4").tobytes())
        write_atomic(args.output, np.asarray(losses, dtype="<f8").tobytes())
    except OSError as e:
        fail(2, f"cannot write {e.filename}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
