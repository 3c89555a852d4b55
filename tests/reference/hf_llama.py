#!/usr/bin/env python3
"""The transformers side of the Hugging Face Llama-like tests (tests/integration/test_hf_llama.c).

Needs torch and transformers (the versions .ci/run installs). Commands:

  make DIR [--seed S] [--layers L --heads H --kv-heads K --embd C --ffn I --vocab V --ctx T]
           [--llama3] [--rope-factor X] [--rope-original-max N] [--tied] [--dtype f32|bf16]
           [--device cpu|cuda] [--family llama|qwen2|qwen3|mistral|phi3] [--head-dim HD]
           [--window W]
      A tiny LlamaForCausalLM (or the --family's Qwen2ForCausalLM, Qwen3ForCausalLM,
      MistralForCausalLM, Phi3ForCausalLM: head_dim HD where given, a sliding window W for Mistral
      and Phi-3, none without), random init from the seed (RMSNorm weights perturbed so that their
      mapping matters), saved by save_pretrained (safetensors, float32 or bfloat16). --llama3: rope_theta
      500000 and llama3 rope scaling (factor --rope-factor, 8 by default) with
      original_max_position_embeddings --rope-original-max (8 by default: below the sequence
      length, so every branch of the scaling is used); --tied: tie_word_embeddings. --device cuda
      initialises on the GPU (for models of a billion parameters).
  tokens FILE --vocab V --count N --seed S
      As hf_gpt2.py's.
  loss DIR TOKFILE --batch B --seq T --eval-fraction F (--train-step K | --eval-batches N) --seed S
       [--device cpu|cuda]
      Loads DIR with AutoModelForCausalLM.from_pretrained in float32 (refusing missing or unexpected
      keys, and a tied config whose head is not embed_tokens) and prints "loss X": the mean
      cross-entropy of the training batch of step K as fy_tokfile_batch draws it, or the mean over
      the first N held-out batches as train's evaluation draws them; computed in float32 on
      --device.
  compare A B [--expect-different]
      As hf_gpt2.py's: the same tensor names, and each tensor equal bit for bit in shape, dtype and
      bytes (or, --expect-different, some differ); config.json equal but for its dtype.
  run 'COMMAND ARGS' ...
      Several of the commands above in one process, in order, stopping at the first that fails.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_gpt2 import (cmd_tokens, cmd_compare, loaded_cleanly, print_loss,  # noqa: E402
                     add_shared_commands, dispatch)


# transformers' config and model class names of each family
FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral",
            "phi3": "Phi3"}


def cmd_make(a):
    import torch
    import transformers

    prefix = FAMILIES[a.family]
    config_class = getattr(transformers, f"{prefix}Config")
    model_class = getattr(transformers, f"{prefix}ForCausalLM")
    torch.manual_seed(a.seed)
    kw = dict(hidden_size=a.embd, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
              intermediate_size=a.ffn, num_hidden_layers=a.layers, vocab_size=a.vocab,
              max_position_embeddings=a.ctx, rms_norm_eps=1e-5, tie_word_embeddings=a.tied,
              bos_token_id=0, eos_token_id=a.vocab - 1, pad_token_id=a.vocab - 1)
    if a.head_dim:
        kw["head_dim"] = a.head_dim
    if a.family in ("mistral", "phi3"):
        kw["sliding_window"] = a.window or None
    if a.llama3:
        kw["rope_theta"] = 500000.0
        kw["rope_scaling"] = {"rope_type": "llama3", "factor": a.rope_factor,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": a.rope_original_max}
    with torch.device(a.device):
        model = model_class(config_class(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    if a.dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(a.dir, safe_serialization=True)
    return 0


def cmd_loss(a):
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32,
                                                   attn_implementation="eager",
                                                   output_loading_info=True)
    if not loaded_cleanly(a.dir, info):
        return 1
    if model.config.tie_word_embeddings and \
            model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        print(f"{a.dir}: the LM head is not tied to embed_tokens after loading", file=sys.stderr)
        return 1
    return print_loss(model, a)


def parser():
    p = argparse.ArgumentParser(prog="hf_llama.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--embd", type=int, default=32)
    m.add_argument("--ffn", type=int, default=48)
    m.add_argument("--vocab", type=int, default=300)
    m.add_argument("--ctx", type=int, default=64)
    m.add_argument("--llama3", action="store_true")
    m.add_argument("--tied", action="store_true")
    m.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    m.add_argument("--rope-factor", type=float, default=8.0)
    m.add_argument("--rope-original-max", type=int, default=8)
    m.add_argument("--device", default="cpu")
    m.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    m.add_argument("--head-dim", type=int, default=0)
    m.add_argument("--window", type=int, default=0)
    add_shared_commands(sub)
    return p


if __name__ == "__main__":
    handlers = {"make": cmd_make, "tokens": cmd_tokens, "loss": cmd_loss, "compare": cmd_compare}
    sys.exit(dispatch(parser(), sys.argv[1:], handlers))
