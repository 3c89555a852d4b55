#!/usr/bin/env python3
"""What `fuyou-launch prepare --tokenizer` should write, computed with the `tokenizers` library
directly (one encode call per document, no batching or piecing), for tests/integration/test_prepare.c.

  prepare_ref.py build DIR bpe|wordlevel
      A tiny tokenizer trained on a few sentences, saved as DIR/tokenizer.json. bpe: byte-level BPE
      with special tokens <s> and </s>, a post-processor that puts <s> before every sequence, and
      DIR/tokenizer_config.json naming </s> as eos_token. wordlevel: whitespace words, no special
      token that names an end of sequence (prepare appends none).
  prepare_ref.py expect TOKENIZER_JSON text|jsonl-text|jsonl-pair OUT INPUT...
      OUT gets "vocab V eos E" (E = -1 for none), then one "token mask start" line per token:
      start 1 for the first token of a document (a text file, a JSONL line), else 0.
"""
import json
import os
import sys

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello there: what is two plus two?",
    "It is four. Questions and answers, prompts and responses.",
    "caf\u00e9 na\u00efve \u00fcber \u2014 unicode text is bytes too",
]


def build(d, kind):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(CORPUS * 4, trainer)
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "</s>", "bos_token": "<s>"}, f)
    else:
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(os.path.join(d, "tokenizer.json"))


def eos_of(tok, path):
    cfg = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if os.path.exists(cfg):
        with open(cfg) as f:
            return tok.token_to_id(json.load(f)["eos_token"])
    return tok.token_to_id("</s>")  # None for the word-level one


def expect(path, mode, out, inputs):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    eos = eos_of(tok, path)
    tail = [] if eos is None else [eos]
    rows = []  # (token, mask, start)

    def document(pairs):
        rows.extend((t, m, int(i == 0)) for i, (t, m) in enumerate(pairs))

    for name in inputs:
        with open(name, encoding="utf-8") as f:
            if mode == "text":
                document([(t, 1) for t in tok.encode(f.read()).ids + tail])
                continue
            for line in f:
                if not line.strip():
                    continue
                obj = json.loads(line)
                if mode == "jsonl-text":
                    document([(t, 1) for t in tok.encode(obj["text"]).ids + tail])
                else:
                    p = tok.encode(obj["prompt"]).ids
                    r = tok.encode(obj["response"], add_special_tokens=False).ids + tail
                    document([(t, 0) for t in p] + [(t, 1) for t in r])
    with open(out, "w") as f:
        f.write("vocab %d eos %d\n" % (tok.get_vocab_size(with_added_tokens=True),
                                       -1 if eos is None else eos))
        for t, m, start in rows:
            f.write("%d %d %d\n" % (t, m, start))


def main():
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "build":
        build(a[1], a[2])
    elif len(a) >= 5 and a[0] == "expect":
        expect(a[1], a[2], a[3], a[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
