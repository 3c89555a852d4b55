#!/usr/bin/env python3
"""The transformers side of the Hugging Face Llama tests (tests/integration/test_hf_llama.c).

Needs torch and transformers (the versions .ci/run installs). Commands:

  make DIR [--seed S] [--layers L --heads H --kv-heads K --embd C --ffn I --vocab V --ctx T]
           [--llama3] [--tied]
      A tiny LlamaForCausalLM, random init from the seed (RMSNorm weights perturbed so that their
      mapping matters), saved by save_pretrained (safetensors, float32). --llama3: rope_theta
      500000 and llama3 rope scaling with original_max_position_embeddings below the sequence
      length, so every branch of the scaling is used; --tied: tie_word_embeddings.
  tokens FILE --vocab V --count N --seed S
      As hf_gpt2.py's.
  loss DIR TOKFILE --batch B --seq T --eval-fraction F --train-step K --seed S
      Loads DIR with LlamaForCausalLM.from_pretrained in float32 (refusing missing or unexpected
      keys) and prints "loss X": the mean cross-entropy of the training batch of step K as
      fy_tokfile_batch draws it.
  run 'COMMAND ARGS' ...
      Several of the commands above in one process, in order, stopping at the first that fails.
"""
import argparse
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_gpt2 import read_tokens, train_batch, cmd_tokens  # noqa: E402


def cmd_make(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    kw = dict(hidden_size=a.embd, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
              intermediate_size=a.ffn, num_hidden_layers=a.layers, vocab_size=a.vocab,
              max_position_embeddings=a.ctx, rms_norm_eps=1e-5, tie_word_embeddings=a.tied,
              bos_token_id=0, eos_token_id=a.vocab - 1)
    if a.llama3:
        kw["rope_theta"] = 500000.0
        kw["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    model = LlamaForCausalLM(LlamaConfig(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(a.dir, safe_serialization=True)
    return 0


def cmd_loss(a):
    import torch
    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(a.dir, dtype=torch.float32,
                                                   attn_implementation="eager",
                                                   output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in
                ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    if problems:
        print(f"{a.dir}: transformers did not load it cleanly: {problems}", file=sys.stderr)
        return 1
    model.eval()
    tokens = read_tokens(a.tokens)
    count = len(tokens)
    eval_start = count - min(count, int(count * a.eval_fraction + 0.5))
    rows = train_batch(tokens, eval_start, a.seed, a.train_step, a.batch, a.seq)
    with torch.no_grad():
        w = torch.tensor(rows, dtype=torch.long)
        logits = model(w[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 w[:, 1:].reshape(-1))
    print(f"loss {float(loss):.9g}")
    return 0


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
    t = sub.add_parser("tokens")
    t.add_argument("file")
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--seed", type=int, default=1)
    lo = sub.add_parser("loss")
    lo.add_argument("dir")
    lo.add_argument("tokens")
    lo.add_argument("--batch", type=int, required=True)
    lo.add_argument("--seq", type=int, required=True)
    lo.add_argument("--eval-fraction", type=float, required=True)
    lo.add_argument("--train-step", type=int, required=True)
    lo.add_argument("--seed", type=int, default=1)
    r = sub.add_parser("run")
    r.add_argument("commands", nargs="+")
    return p


def dispatch(p, argv):
    a = p.parse_args(argv)
    if a.cmd == "run":
        for c in a.commands:
            rc = dispatch(p, shlex.split(c))
            if rc != 0:
                return rc
        return 0
    return {"make": cmd_make, "tokens": cmd_tokens, "loss": cmd_loss}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(dispatch(parser(), sys.argv[1:]))
