#!/usr/bin/env python3
"""The transformers side of the Hugging Face GPT-2 tests (tests/integration/test_hf.c).

Needs torch and transformers (the versions .ci/run installs). Commands:

  make DIR [--dtype f32|bf16|f16] [--seed S] [--layers L --heads H --embd C --vocab V --ctx T]
           [--shard-size BYTES] [--base] [--lm-head] [--buffers] [--device cpu|cuda]
      A tiny GPT2LMHeadModel, random init from the seed (biases and LayerNorm parameters
      perturbed so that their mapping matters), saved by save_pretrained (safetensors). --base
      saves the GPT2Model inside it (names without "transformer."); --lm-head and --buffers
      rewrite model.safetensors with lm_head.weight (a copy of wte) and the attention mask
      buffers that older transformers versions stored. --device cuda initialises on the GPU
      (seconds instead of minutes for a model of a billion parameters).
  tokens FILE --vocab V --count N --seed S [--skew X]
      A token file (the format of common/formats/tokfile.h) of N random tokens below V; --skew X (> 1)
      draws token floor(V u^X), u uniform in [0, 1), so that low ids are frequent and a few
      training steps learn something (1, the default: uniform, as before).
  loss DIR TOKFILE --batch B --seq T --eval-fraction F (--train-step K --seed S | --eval-batches N)
       [--device cpu|cuda]
      Loads DIR with GPT2LMHeadModel.from_pretrained in float32 (refusing missing or unexpected
      keys) and prints "loss X": the mean cross-entropy of the training batch of step K as
      fy_tokfile_batch draws it, or the mean over the first N evaluation batches of the per-batch
      mean, as fuyou-launch train reports eval_loss; computed in float32 on --device.
  compare A B [--f16-as-f32] [--expect-different]
      Tensor by tensor: the same parameter names (mask buffers aside), shapes, and dtypes, and
      the same bytes (with --f16-as-f32, F16 tensors of A may be F32 in B with equal values);
      config.json equal as JSON apart from its dtype entry. --expect-different: the same names,
      shapes and dtypes, but some tensor's values differ (exit 1 when all are equal).
  run 'COMMAND ARGS' ...
      Several of the commands above in one process (importing torch and transformers takes
      seconds), in order, stopping at the first that fails.
Exit status 0 on success, 1 on a failed comparison, 2 on a usage error.
"""
import argparse
import json
import os
import shlex
import struct
import sys

M64 = (1 << 64) - 1


def mix64(z):
    """splitmix64's finaliser, as common/formats/tokfile.c computes it."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    slots = struct.unpack_from("<8I", data, 0)
    if slots[0] != 0x4B4F5446 or slots[1] != 1:
        sys.exit(f"{path}: not a version 1 token file")
    width, count = slots[2], slots[4] | (slots[5] << 32)
    fmt = {1: "B", 2: "H", 4: "I"}[width]
    return list(struct.unpack_from(f"<{count}{fmt}", data, 4096))


def write_tokens(path, tokens, vocab):
    width = 1 if vocab <= 256 else 2 if vocab <= 65536 else 4
    slots = [0x4B4F5446, 1, width, vocab, len(tokens) & 0xFFFFFFFF, len(tokens) >> 32, 0]
    h = 0x811C9DC5
    for b in struct.pack("<7I", *slots):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    header = struct.pack("<8I", *slots, h).ljust(4096, b"\0")
    fmt = {1: "B", 2: "H", 4: "I"}[width]
    body = struct.pack(f"<{len(tokens)}{fmt}", *tokens)
    body += b"\0" * (-len(body) % 4096)
    with open(path, "wb") as f:
        f.write(header + body)


def cmd_make(a):
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.embd, vocab_size=a.vocab,
                     n_positions=a.ctx, bos_token_id=a.vocab - 1, eos_token_id=a.vocab - 1)
    with torch.device(a.device):
        model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # biases 0 and LayerNorm weights 1 at init: make them matter
                p.add_(0.1 * torch.randn_like(p))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    model = model.to(dtype)
    target = model.transformer if a.base else model
    kwargs = {"max_shard_size": a.shard_size} if a.shard_size else {}
    target.save_pretrained(a.dir, **kwargs)
    if a.lm_head or a.buffers:
        path = os.path.join(a.dir, "model.safetensors")
        tensors = load_file(path)
        prefix = "" if a.base else "transformer."
        if a.lm_head:
            tensors["lm_head.weight"] = tensors[prefix + "wte.weight"].clone()
        if a.buffers:
            mask = torch.tril(torch.ones(a.ctx, a.ctx, dtype=dtype)).view(1, 1, a.ctx, a.ctx)
            for i in range(a.layers):
                tensors[f"{prefix}h.{i}.attn.bias"] = mask.clone()
                tensors[f"{prefix}h.{i}.attn.masked_bias"] = torch.tensor(-1e4, dtype=dtype)
        save_file(tensors, path, metadata={"format": "pt"})
    return 0


def cmd_tokens(a):
    import random
    rng = random.Random(a.seed)
    if a.skew == 1.0:
        tokens = [rng.randrange(a.vocab) for _ in range(a.count)]
    else:
        tokens = [min(a.vocab - 1, int(a.vocab * rng.random() ** a.skew)) for _ in range(a.count)]
    write_tokens(a.file, tokens, a.vocab)
    return 0


def train_batch(tokens, eval_start, seed, step, B, T):
    starts = eval_start - T
    key = mix64(mix64(mix64(seed) ^ 0) ^ step)
    rows = []
    for b in range(B):
        s = mix64(key ^ b) % starts
        rows.append(tokens[s:s + T + 1])
    return rows


def eval_batch(tokens, eval_start, index, B, T):
    windows = (len(tokens) - eval_start - 1) // T
    k = (index * B) % windows
    rows = []
    for _ in range(B):
        s = eval_start + k * T
        rows.append(tokens[s:s + T + 1])
        k = 0 if k + 1 == windows else k + 1
    return rows


def cmd_loss(a):
    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    model, info = GPT2LMHeadModel.from_pretrained(a.dir, dtype=torch.float32,
                                                  attn_implementation="eager",
                                                  output_loading_info=True)
    if not loaded_cleanly(a.dir, info):
        return 1
    if not model.config.tie_word_embeddings or \
            model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        print(f"{a.dir}: the LM head is not tied to wte after loading", file=sys.stderr)
        return 1
    return print_loss(model, a)


def loaded_cleanly(path, info):
    """False (said) when from_pretrained reports missing, unexpected or mismatched tensors."""
    problems = {k: v for k, v in info.items() if v and k in
                ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    if problems:
        print(f"{path}: transformers did not load it cleanly: {problems}", file=sys.stderr)
    return not problems


def print_loss(model, a):
    """Prints the model's mean loss on the batches `a` names (the training step's, or the
    held-out ones), as the C side computes them."""
    import torch

    model.eval()
    model.to(a.device)
    tokens = read_tokens(a.tokens)
    count = len(tokens)
    eval_start = count - min(count, int(count * a.eval_fraction + 0.5))
    if a.train_step is not None:
        batches = [train_batch(tokens, eval_start, a.seed, a.train_step, a.batch, a.seq)]
    else:
        batches = [eval_batch(tokens, eval_start, k, a.batch, a.seq) for k in range(a.eval_batches)]
    total = 0.0
    with torch.no_grad():
        for rows in batches:
            w = torch.tensor(rows, dtype=torch.long, device=a.device)
            logits = model(w[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     w[:, 1:].reshape(-1))
            total += float(loss)
    print(f"loss {total / len(batches):.9g}")
    return 0


def is_buffer(name):
    return name.endswith(".attn.bias") or name.endswith(".attn.masked_bias")


def load_config(d):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c.pop("dtype", None)
    c.pop("torch_dtype", None)
    return c


def open_tensors(d):
    from safetensors import safe_open
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        h = safe_open(os.path.join(d, name), framework="pt")
        for k in h.keys():
            out[k] = h
    return out


def cmd_compare(a):
    import torch
    ta, tb = open_tensors(a.a), open_tensors(a.b)
    na = {k for k in ta if not is_buffer(k)}
    nb = set(tb)
    bad = 0
    if na != nb:
        print(f"names differ: only in {a.a}: {sorted(na - nb)}; only in {a.b}: {sorted(nb - na)}")
        return 1
    if load_config(a.a) != load_config(a.b):
        print(f"config.json differs between {a.a} and {a.b}")
        bad += 1
    differing = 0
    for k in sorted(na):
        x, y = ta[k].get_tensor(k), tb[k].get_tensor(k)
        if x.shape != y.shape:
            print(f"{k}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
            bad += 1
            continue
        if x.dtype != y.dtype:
            if a.f16_as_f32 and x.dtype == torch.float16 and y.dtype == torch.float32:
                x = x.float()
            else:
                print(f"{k}: dtype {x.dtype} vs {y.dtype}")
                bad += 1
                continue
        same = torch.equal(x.contiguous().view(torch.uint8) if x.dtype != torch.float16 else x,
                           y.contiguous().view(torch.uint8) if y.dtype != torch.float16 else y)
        if not same:
            differing += 1
            if not a.expect_different:
                diff = (x.double() - y.double()).abs()
                print(f"{k}: values differ ({int((diff > 0).sum())} of {x.numel()} elements, "
                      f"largest {float(diff.max()):.3g})")
                bad += 1
    if a.expect_different:
        if differing == 0:
            print(f"every tensor of {a.b} equals {a.a}'s: expected some to differ")
            return 1
        print(f"{differing} of {len(na)} tensors differ, as expected")
        return 1 if bad else 0
    if bad == 0:
        print(f"{len(na)} tensors equal bit for bit")
    return 1 if bad else 0


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--embd", type=int, default=64)
    m.add_argument("--vocab", type=int, default=300)
    m.add_argument("--ctx", type=int, default=64)
    m.add_argument("--shard-size", type=int, default=0)
    m.add_argument("--base", action="store_true")
    m.add_argument("--lm-head", action="store_true")
    m.add_argument("--buffers", action="store_true")
    m.add_argument("--device", default="cpu")
    add_shared_commands(sub)
    return p


def add_shared_commands(sub):
    """The tokens, loss, compare and run commands, shared with hf_llama.py."""
    t = sub.add_parser("tokens")
    t.add_argument("file")
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--skew", type=float, default=1.0)
    lo = sub.add_parser("loss")
    lo.add_argument("dir")
    lo.add_argument("tokens")
    lo.add_argument("--batch", type=int, required=True)
    lo.add_argument("--seq", type=int, required=True)
    lo.add_argument("--eval-fraction", type=float, required=True)
    lo.add_argument("--train-step", type=int)
    lo.add_argument("--seed", type=int, default=1)
    lo.add_argument("--eval-batches", type=int, default=0)
    lo.add_argument("--device", default="cpu")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--f16-as-f32", action="store_true")
    c.add_argument("--expect-different", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("commands", nargs="+")


def dispatch(p, argv, handlers):
    """Runs one command (handlers: name -> function), or a run of several in order."""
    a = p.parse_args(argv)
    if a.cmd == "loss" and (a.train_step is None) == (a.eval_batches <= 0):
        p.error("loss: give --train-step K or --eval-batches N")
    if a.cmd == "run":
        for command in a.commands:
            rc = dispatch(p, shlex.split(command), handlers)
            if rc != 0:
                print(f"failed: {command}", file=sys.stderr)
                return rc
        return 0
    return handlers[a.cmd](a)


def main():
    handlers = {"make": cmd_make, "tokens": cmd_tokens, "loss": cmd_loss, "compare": cmd_compare}
    return dispatch(parser(), sys.argv[1:], handlers)


if __name__ == "__main__":
    sys.exit(main())
