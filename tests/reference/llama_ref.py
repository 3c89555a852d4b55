#!/usr/bin/env python3
"""One decoder block of a Llama-like family through transformers, for tests/test_llama_cpu.c.

Builds the family's decoder layer (LlamaDecoderLayer, Qwen2DecoderLayer, Qwen3DecoderLayer,
MistralDecoderLayer or Phi3DecoderLayer, --family) from its config (silu, eager attention, the
family's own biases and norms), draws its weights, an input x and an output gradient dy from a seed, runs
the forward and the backward in float32 on the CPU with position_ids 0..T-1, the rotary embeddings
of the family's RotaryEmbedding (rope_type "default", or "llama3" with --llama3) and an additive
causal mask (with --window W, transformers' sliding_window_causal_mask_function(W)), and writes everything the C test compares to OUT.

Usage:
    python3 llama_ref.py OUT --batch B --seq T --embd C --heads NH --kv-heads NKV --inter I
                         [--eps E] [--theta THETA] [--seed S]
                         [--llama3 FACTOR LOW_FREQ_FACTOR HIGH_FREQ_FACTOR ORIGINAL_MAX_POS]
                         [--family llama|qwen2|qwen3|mistral|phi3] [--head-dim HD] [--window W]
    python3 llama_ref.py model OUT --batch B --seq T --embd C --heads NH --kv-heads NKV --inter I
                         --layers L --vocab V [--tied] [--family F] [--head-dim HD] [--window W]
                         [--seed S]
        the whole model instead (the family's ForCausalLM, eps 1e-5, rope theta 500000): weights
        redrawn as for a block (embeddings N(0, 1)), tokens [B][T + 1] drawn from the seed, the
        mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :T] and every parameter's
        gradient; written as MODEL OUT below
    python3 llama_ref.py run 'OUT ARGS' ...
        several of the above in one process (importing torch and transformers takes seconds)

OUT (little-endian, no padding):
  int32[16]   magic 0x4C4C5946 ("FYLL"), version 2, B, T, C, NH, NKV, I, rope type (0 default,
              1 llama3), original_max_position_embeddings (0 without llama3), P (floats of the
              block's parameters), head_dim (0: C / NH), q/k/v biases (0/1), q/k norms (0/1),
              sliding window (0: none), then 1 zero
  float64[8]  rms_norm_eps, rope_theta, factor, low_freq_factor, high_freq_factor (0 without
              llama3), then 3 zeros
  float32     params[P]: the block's parameters in the Llama-like block layout (struct
              fy_llama_unit_layout: input_layernorm, q_proj, k_proj, v_proj, the q, k, v biases
              (qwen2), o_proj, q_norm, k_norm (qwen3), post_attention_layernorm, gate_proj,
              up_proj, down_proj; Phi-3's fused qkv_proj and gate_up_proj lie so already; each
              weight [out][in] as transformers stores it);
              x[B][T][C]; dy[B][T][C]; y[B][T][C]; dx[B][T][C]; dparams[P] (gradient of sum(y*dy))

MODEL OUT (little-endian, no padding):
  int32[16]   magic 0x4D4C5946 ("FYLM"), version 1, B, T, C, NH, NKV, I, V, L, head_dim (0: C / NH),
              q/k/v biases (0/1), q/k norms (0/1), sliding window (0: none), tied (0/1), P (floats
              of all units)
  float32     params[P]: the units in order (embed_tokens; each block in the block layout above;
              norm, then lm_head unless tied); int32 tokens[B][T + 1]; float32 loss; grads[P]

Exit status: 0 on success; 2 on bad arguments; 3 when torch or transformers cannot be imported.
"""
import argparse
import math
import shlex
import struct
import sys

sys.dont_write_bytecode = True

MAGIC = 0x4C4C5946
MODEL_MAGIC = 0x4D4C5946
VERSION = 2
ORDER = [  # the Llama block layout (common/model/arch/llama.c): LlamaDecoderLayer's parameters, in this order
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]

# Each family's parameters in the block layout, and the module and class prefix of transformers.
FAMILIES = {
    "llama": ("llama", "Llama", ORDER),
    "mistral": ("mistral", "Mistral", ORDER),
    "qwen2": ("qwen2", "Qwen2", ORDER[:4] + ["self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                            "self_attn.v_proj.bias"] + ORDER[4:]),
    "qwen3": ("qwen3", "Qwen3", ORDER[:5] + ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
              + ORDER[5:]),
    "phi3": ("phi3", "Phi3", ["input_layernorm.weight", "self_attn.qkv_proj.weight",
                              "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                              "mlp.gate_up_proj.weight", "mlp.down_proj.weight"]),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description="A Llama decoder block through transformers.")
    p.add_argument("out")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--embd", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--inter", type=int, required=True)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--theta", type=float, default=500000.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--llama3", type=float, nargs=4, metavar=("FACTOR", "LOW", "HIGH", "ORIG"))
    p.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    p.add_argument("--head-dim", type=int, default=0)
    p.add_argument("--window", type=int, default=0)
    a = p.parse_args(argv)
    hd = a.head_dim or a.embd // a.heads
    if (not a.head_dim and a.embd % a.heads) or a.heads % a.kv_heads or hd % 2:
        p.error("heads must divide embd (or --head-dim given), kv-heads heads, and head_dim must "
                "be even")
    return a


def main(argv):
    cases = [shlex.split(c) for c in argv[1:]] if argv[:1] == ["run"] else [argv]
    parsed = [("model", parse_model_args(c[1:])) if c[:1] == ["model"] else ("block", parse_args(c))
              for c in cases]
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"llama_ref.py: {e}", file=sys.stderr)
        return 3
    for kind, a in parsed:
        rc = model_case(a) if kind == "model" else one_case(a)
        if rc != 0:
            return rc
    return 0


def draw_weights(params, names, gen):
    """Weights of a size that keeps activations of order one and the attention far from uniform;
    norm weights near 1 but not 1, so that their gradients and paths matter; embeddings N(0, 1)."""
    import torch

    with torch.no_grad():
        for name in names:
            t = params[name]
            if name.endswith("embed_tokens.weight"):
                t.copy_(torch.randn(t.shape, generator=gen))
            elif t.dim() == 1 and name.endswith(".bias"):
                t.copy_(0.5 * torch.randn(t.shape, generator=gen))
            elif t.dim() == 1:
                t.copy_(1.0 + 0.2 * torch.randn(t.shape, generator=gen))
            else:
                t.copy_(torch.randn(t.shape, generator=gen) * (1.5 / math.sqrt(t.shape[1])))


def parse_model_args(argv):
    p = argparse.ArgumentParser(description="A Llama-like model through transformers.")
    p.add_argument("out")
    for name in ("batch", "seq", "embd", "heads", "kv-heads", "inter", "layers", "vocab"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    p.add_argument("--head-dim", type=int, default=0)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def model_case(a):
    import torch
    import transformers

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    module, prefix, order = FAMILIES[a.family]
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

    units = [["model.embed_tokens.weight"]]
    units += [[f"model.layers.{i}.{n}" for n in order] for i in range(a.layers)]
    units += [["model.norm.weight"] + ([] if a.tied else ["lm_head.weight"])]
    names = [n for u in units for n in u]
    params = dict(model.named_parameters())
    if sorted(params) != sorted(names):
        print(f"llama_ref.py: unexpected parameters {sorted(set(params) ^ set(names))}",
              file=sys.stderr)
        return 1
    gen = torch.Generator().manual_seed(a.seed)
    draw_weights(params, names, gen)
    B, T = a.batch, a.seq
    ids = torch.randint(0, a.vocab, (B, T + 1), generator=gen)
    logits = model(input_ids=ids[:, :T]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab), ids[:, 1:].reshape(-1))
    loss.backward()

    P = sum(params[n].numel() for n in names)
    flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts]).float().numpy()  # noqa: E731
    with open(a.out, "wb") as f:
        f.write(struct.pack("<16i", MODEL_MAGIC, 1, B, T, a.embd, a.heads, a.kv_heads, a.inter,
                            a.vocab, a.layers, a.head_dim, 1 if a.family == "qwen2" else 0,
                            1 if a.family == "qwen3" else 0, a.window, 1 if a.tied else 0, P))
        f.write(flat([params[n] for n in names]).astype("<f4").tobytes())
        f.write(ids.numpy().astype("<i4").tobytes())
        f.write(struct.pack("<f", float(loss)))
        f.write(flat([params[n].grad for n in names]).astype("<f4").tobytes())
    return 0


def one_case(a):
    import importlib
    import torch
    from transformers.masking_utils import sliding_window_causal_mask_function

    module, prefix, order = FAMILIES[a.family]
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config_class = getattr(mod, f"{prefix}Config", None) or \
        getattr(importlib.import_module(f"transformers.models.{module}.configuration_{module}"),
                f"{prefix}Config")
    layer_class = getattr(mod, f"{prefix}DecoderLayer")
    rotary_class = getattr(mod, f"{prefix}RotaryEmbedding")

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rope = {"rope_type": "default", "rope_theta": a.theta}
    orig = 0
    factor = low = high = 0.0
    if a.llama3:
        factor, low, high, orig_f = a.llama3
        orig = int(orig_f)
        rope = {"rope_type": "llama3", "rope_theta": a.theta, "factor": factor,
                "low_freq_factor": low, "high_freq_factor": high,
                "original_max_position_embeddings": orig}
    kw = dict(hidden_size=a.embd, intermediate_size=a.inter, num_attention_heads=a.heads,
              num_key_value_heads=a.kv_heads, num_hidden_layers=1, rms_norm_eps=a.eps,
              rope_parameters=rope, hidden_act="silu", max_position_embeddings=max(4 * orig, 2048),
              vocab_size=16, pad_token_id=0, bos_token_id=0, eos_token_id=1)
    if a.family == "llama":
        kw.update(attention_bias=False, mlp_bias=False)
    if a.head_dim:
        kw["head_dim"] = a.head_dim
    if a.window:
        kw["sliding_window"] = a.window
    elif a.family in ("mistral", "phi3"):
        kw["sliding_window"] = None
    cfg = config_class(**kw)
    cfg._attn_implementation = "eager"
    layer = layer_class(cfg, layer_idx=0).float().eval()
    rotary = rotary_class(cfg)

    gen = torch.Generator().manual_seed(a.seed)
    params = dict(layer.named_parameters())
    if sorted(params) != sorted(order):
        print(f"llama_ref.py: unexpected parameters {sorted(params)}", file=sys.stderr)
        return 1
    draw_weights(params, order, gen)
    B, T, C = a.batch, a.seq, a.embd
    x = torch.randn(B, T, C, generator=gen).requires_grad_(True)
    dy = torch.randn(B, T, C, generator=gen)

    pos = torch.arange(T).unsqueeze(0).expand(B, T)
    cos, sin = rotary(x, pos)
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    if a.window:
        i = torch.arange(T)
        keep = sliding_window_causal_mask_function(a.window)(0, 0, i[:, None], i[None, :])
        mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    mask = mask[None, None].expand(B, 1, T, T)
    y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
    if isinstance(y, tuple):
        y = y[0]
    y.backward(dy)

    P = sum(params[n].numel() for n in order)
    flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts]).float().numpy()  # noqa: E731
    with open(a.out, "wb") as f:
        f.write(struct.pack("<16i", MAGIC, VERSION, B, T, C, a.heads, a.kv_heads, a.inter,
                            1 if a.llama3 else 0, orig, P, a.head_dim,
                            1 if a.family == "qwen2" else 0, 1 if a.family == "qwen3" else 0,
                            a.window, 0))
        f.write(struct.pack("<8d", a.eps, a.theta, factor, low, high, 0, 0, 0))
        f.write(flat([params[n] for n in order]).astype("<f4").tobytes())
        for t in (x, dy, y, x.grad):
            f.write(flat([t]).astype("<f4").tobytes())
        f.write(flat([params[n].grad for n in order]).astype("<f4").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
