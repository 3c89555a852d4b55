#!/usr/bin/env python3
"""Documents packed in rows, through transformers one document at a time, for
tests/test_packed_cpu.c.

Builds a small model of a family (GPT2LMHeadModel, or the ForCausalLM of a Llama-like family),
draws its weights from a seed (as llama_ref.py's model command does; GPT-2's biases and LayerNorm
parameters perturbed so that they matter), draws documents of random lengths and packs them in
B rows of T tokens in order (a document that does not fit the rest of a row starts the next row;
a row's leftover is padding: single-token documents of token 0 whose target is -1). Each document
alone goes through the model in float32 (eager attention, positions 0..n-1, the family's sliding
window where it has one); a token's loss is the cross-entropy of its logits against its target
(the next token of the document, or for a document's last token a token drawn for it, or -1:
ignored, for some documents); the loss is the mean over every target >= 0 of the batch, and its
gradient with respect to every parameter is computed by backpropagation. Writes what the C test
needs to OUT.

Usage:
    python3 packed_ref.py OUT --family gpt2|llama|qwen2|qwen3|mistral|phi3 --batch B --seq T
                          --embd C --heads NH --layers L --vocab V [--kv-heads NKV] [--inter I]
                          [--head-dim HD] [--window W] [--tied] [--seed S]
    python3 packed_ref.py run 'OUT ARGS' ...
        several of the above in one process (importing torch and transformers takes seconds)

OUT (little-endian, no padding):
  int32[16]   magic 0x4B505946 ("FYPK"), version 1, family (0 gpt2, 1 llama, 2 qwen2, 3 qwen3,
              4 mistral, 5 phi3), B, T, C, NH, NKV (0 for GPT-2), I (0 for GPT-2), V, L, ctx,
              head_dim (0: C / NH), window (0: none), tied (0/1), P (floats of all units)
  float32     params[P]: the units in Fuyou's order and layouts (GPT-2: [wte | wpe], each block
              [ln1 w, b | qkv w [3C][C], b | attn w [C][C], b | ln2 w, b | fc w [4C][C], b |
              proj w [C][4C], b], [lnf w, b]; a Llama-like family as llama_ref.py's model command)
  int32       tokens[B][T], targets[B][T], positions[B][T]
  float32     token_loss[B][T] (0 where the target is -1), loss, grads[P]

Exit status: 0 on success; 2 on bad arguments; 3 when torch or transformers cannot be imported.
"""
import argparse
import os
import shlex
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MAGIC = 0x4B505946
FAMILY_IDS = {"gpt2": 0, "llama": 1, "qwen2": 2, "qwen3": 3, "mistral": 4, "phi3": 5}


def parse_args(argv):
    p = argparse.ArgumentParser(description="Packed documents through transformers, each alone.")
    p.add_argument("out")
    p.add_argument("--family", choices=sorted(FAMILY_IDS), required=True)
    for name in ("batch", "seq", "embd", "heads", "layers", "vocab"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--inter", type=int, default=0)
    p.add_argument("--head-dim", type=int, default=0)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv):
    cases = [shlex.split(c) for c in argv[1:]] if argv[:1] == ["run"] else [argv]
    parsed = [parse_args(c) for c in cases]
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"packed_ref.py: {e}", file=sys.stderr)
        return 3
    for a in parsed:
        rc = one_case(a)
        if rc != 0:
            return rc
    return 0


def gpt2_model(a, gen):
    """A GPT2LMHeadModel with its weights drawn from gen; returns it and its parameters in Fuyou's
    unit layouts, as a list of (tensor, transposed) to flatten."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.embd, vocab_size=a.vocab,
                     n_positions=a.seq, bos_token_id=0, eos_token_id=a.vocab - 1,
                     attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).float().eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for name, t in model.named_parameters():
            if t.dim() == 1:  # biases 0 and LayerNorm weights 1 at init: make them matter
                base = 1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                    name.endswith("ln_f.weight") else 0.0
                t.copy_(base + 0.1 * torch.randn(t.shape, generator=gen))
            elif name.endswith("wte.weight") or name.endswith("wpe.weight"):
                t.copy_(torch.randn(t.shape, generator=gen))
            else:  # Conv1D weights are [in][out]
                t.copy_(torch.randn(t.shape, generator=gen) * (1.5 / t.shape[0] ** 0.5))
    tr = model.transformer
    order = [(tr.wte.weight, False), (tr.wpe.weight, False)]
    for h in tr.h:
        order += [(h.ln_1.weight, False), (h.ln_1.bias, False),
                  (h.attn.c_attn.weight, True), (h.attn.c_attn.bias, False),
                  (h.attn.c_proj.weight, True), (h.attn.c_proj.bias, False),
                  (h.ln_2.weight, False), (h.ln_2.bias, False),
                  (h.mlp.c_fc.weight, True), (h.mlp.c_fc.bias, False),
                  (h.mlp.c_proj.weight, True), (h.mlp.c_proj.bias, False)]
    order += [(tr.ln_f.weight, False), (tr.ln_f.bias, False)]
    return model, order


def llama_model(a, gen):
    """A Llama-like ForCausalLM as llama_ref.py's model command makes it."""
    import transformers
    from llama_ref import FAMILIES, draw_weights

    module, prefix, block_order = FAMILIES[a.family]
    kw = dict(hidden_size=a.embd, intermediate_size=a.inter, num_attention_heads=a.heads,
              num_key_value_heads=a.kv_heads, num_hidden_layers=a.layers, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
              hidden_act="silu", max_position_embeddings=2048, vocab_size=a.vocab,
              tie_word_embeddings=a.tied, bos_token_id=0, eos_token_id=1,
              pad_token_id=None)  # a padding_idx would zero that token's embedding gradient
    if a.head_dim:
        kw["head_dim"] = a.head_dim
    if a.family in ("mistral", "phi3"):
        kw["sliding_window"] = a.window or None
    cfg = getattr(transformers, f"{prefix}Config")(**kw)
    model = getattr(transformers, f"{prefix}ForCausalLM")(cfg).float().eval()
    model.config._attn_implementation = "eager"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "eager"
    names = ["model.embed_tokens.weight"]
    names += [f"model.layers.{i}.{n}" for i in range(a.layers) for n in block_order]
    names += ["model.norm.weight"] + ([] if a.tied else ["lm_head.weight"])
    params = dict(model.named_parameters())
    if sorted(params) != sorted(names):
        raise SystemExit(f"packed_ref.py: unexpected parameters {sorted(set(params) ^ set(names))}")
    draw_weights(params, names, gen)
    return model, [(params[n], False) for n in names]


def pack(a, gen):
    """Documents of 1..T tokens (mostly shorter than T / 2), packed in rows in order; returns the
    rows' tokens, targets and positions, and each document as (row, start, length)."""
    import torch

    B, T = a.batch, a.seq
    tokens = [[0] * T for _ in range(B)]
    targets = [[-1] * T for _ in range(B)]
    positions = [[0] * T for _ in range(B)]
    docs = []
    row, t = 0, 0
    while row < B:
        n = 1 + int(torch.randint(0, max(1, T // 2), (1,), generator=gen))
        if n > T - t:
            row, t = row + 1, 0  # the rest of the row stays padding
            continue
        ids = torch.randint(0, a.vocab, (n + 1,), generator=gen).tolist()
        last_ignored = int(torch.randint(0, 4, (1,), generator=gen)) == 0
        for i in range(n):
            tokens[row][t + i] = ids[i]
            targets[row][t + i] = ids[i + 1]
            positions[row][t + i] = i
        if last_ignored:
            targets[row][t + n - 1] = -1
        docs.append((row, t, n))
        t += n
        if t == T:
            row, t = row + 1, 0
    return tokens, targets, positions, docs


def one_case(a):
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(a.seed)
    model, order = gpt2_model(a, gen) if a.family == "gpt2" else llama_model(a, gen)
    tokens, targets, positions, docs = pack(a, gen)
    B, T, V = a.batch, a.seq, a.vocab
    count = sum(1 for r in targets for y in r if y >= 0)
    token_loss = [[0.0] * T for _ in range(B)]
    total = None
    for row, start, n in docs:
        ids = torch.tensor([tokens[row][start:start + n]])
        tgt = torch.tensor(targets[row][start:start + n])
        logits = model(input_ids=ids).logits[0].float()
        per = torch.nn.functional.cross_entropy(logits, tgt.clamp(min=0), reduction="none")
        per = torch.where(tgt >= 0, per, torch.zeros_like(per))
        for i in range(n):
            token_loss[row][start + i] = float(per[i])
        total = per.sum() if total is None else total + per.sum()
    loss = total / count
    loss.backward()

    def flat(ts):
        return torch.cat([(t.t() if tr else t).detach().reshape(-1) for t, tr in ts]).float()

    params = flat(order)
    grads = flat([(t.grad, tr) for t, tr in order])
    head_dim = a.head_dim if a.family != "gpt2" else 0
    with open(a.out, "wb") as f:
        f.write(struct.pack("<16i", MAGIC, 1, FAMILY_IDS[a.family], B, T, a.embd, a.heads,
                            a.kv_heads, a.inter, V, a.layers, T, head_dim, a.window,
                            1 if a.tied or a.family == "gpt2" else 0, params.numel()))
        f.write(params.numpy().astype("<f4").tobytes())
        for rows in (tokens, targets, positions):
            f.write(struct.pack(f"<{B * T}i", *[v for r in rows for v in r]))
        f.write(struct.pack(f"<{B * T}f", *[v for r in token_loss for v in r]))
        f.write(struct.pack("<f", float(loss)))
        f.write(grads.numpy().astype("<f4").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
