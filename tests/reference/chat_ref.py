#!/usr/bin/env python3
"""What `fuyou-launch prepare --messages-field` should write, computed with transformers directly,
and the Parquet files of the Parquet tests; for tests/integration/test_prepare_chat.c.

  chat_ref.py build FIXTURE OUT CORPUS.jsonl
      FIXTURE is tests/fixtures/chat/FAMILY (qwen2.5, qwen3, llama3, llama3.2 or mistral): its
      tokenizer_config.json (and chat_template.jinja) are copied to OUT beside a tiny tokenizer.json
      built here with the `tokenizers` library: a BPE trained on the conversations of CORPUS and
      the template's own text, with the family's special tokens (byte-level like Qwen's and Llama
      3's, or sentencepiece-like with a metaspace like Mistral's).
  chat_ref.py expect TOKDIR FAMILY FIELD OUT INPUT.jsonl...
      OUT gets "vocab V eos -1", then one "token mask start" line per token (start 1 for a
      conversation's first token, else 0): for each line's
      conversation, the tokens of AutoTokenizer.from_pretrained(TOKDIR).apply_chat_template, and
      as mask the assistant tokens transformers itself finds (return_assistant_tokens_mask) with
      the family's template marked by hand with {% generation %} around each assistant message's
      content and the end-of-turn token after it. The marked template must render exactly the
      text of the original, and tokenize to the same tokens, for every conversation.
  chat_ref.py parquet IN.jsonl OUT.parquet ROWS_PER_GROUP
      The JSON lines as a Parquet table (columns inferred by pyarrow: a list of messages becomes a
      list of structs), ROWS_PER_GROUP rows per row group; fails unless that makes several.
"""
import json
import os
import shutil
import sys

BYTE_LEVEL, METASPACE = "byte-level", "metaspace"
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# family: (pre-tokenizer, special tokens, other added tokens, the BOS a post-processor adds)
FAMILIES = {
    "qwen2.5": (BYTE_LEVEL, QWEN_SPECIAL, [], None),
    "qwen3": (BYTE_LEVEL, QWEN_SPECIAL, ["<think>", "</think>"], None),
    "llama3": (BYTE_LEVEL, LLAMA3_SPECIAL, [], "<|begin_of_text|>"),
    "llama3.2": (BYTE_LEVEL, LLAMA3_SPECIAL, [], "<|begin_of_text|>"),
    "mistral": (METASPACE, ["<unk>", "<s>", "</s>"], [], "<s>"),
}
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, what is two plus two?",
          "You are a helpful assistant. system user assistant"]

# The families' templates with {% generation %} ... {% endgeneration %} around what is trained:
# (original text, marked text) replacements; each must match once.
MARKS = {
    "qwen2.5": [(
        """{%- if (message.role == "user") or (message.role == "system" and not loop.first) or """
        """(message.role == "assistant" and not message.tool_calls) %}\n"""
        """        {{- '<|im_start|>' + message.role + '\\n' """
        """+ message.content + '<|im_end|>' + '\\n' }}""",
        """{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n"""
        """        {{- '<|im_start|>' + message.role + '\\n' """
        """+ message.content + '<|im_end|>' + '\\n' }}\n"""
        """    {%- elif message.role == "assistant" and not message.tool_calls %}\n"""
        """        {{- '<|im_start|>' + message.role + '\\n' }}{%- generation %}"""
        """{{- message.content + '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}""")],
    "qwen3": [(
        """{{- '<|im_start|>' + message.role + '\\n<think>\\n' """
        """+ reasoning_content.strip('\\n') + """
        """'\\n</think>\\n\\n' + content.lstrip('\\n') }}""",
        """{{- '<|im_start|>' + message.role + '\\n<think>\\n' """
        """+ reasoning_content.strip('\\n') + """
        """'\\n</think>\\n\\n' }}{%- set content = content.lstrip('\\n') %}"""), (
        """            {%- else %}\n                {{- '<|im_start|>' """
        """+ message.role + '\\n' + content }}""",
        """            {%- else %}\n                {{- '<|im_start|>' """
        """+ message.role + '\\n' }}"""), (
        """        {%- else %}\n            {{- '<|im_start|>' """
        """+ message.role + '\\n' + content }}\n"""
        """        {%- endif %}\n        {%- if message.tool_calls %}""",
        """        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' }}\n"""
        """        {%- endif %}\n        {%- generation %}{{- content }}\n"""
        """        {%- if message.tool_calls %}"""), (
        """        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == "tool" %}""",
        """        {{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}\n"""
        """    {%- elif message.role == "tool" %}""")],
    "llama3": [(
        """{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ """
        """message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = """
        """bos_token + content %}{% endif %}{{ content }}""",
        """{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}{% if """
        """message['role'] == 'assistant' %}"""
        """{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% generation %}"""
        """{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}"""
        """{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ """
        """message['content'] | trim + '<|eot_id|>' }}{% endif %}""")],
    "llama3.2": [(
        """        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ """
        """message['content'] | trim + '<|eot_id|>' }}""",
        """        {%- if message['role'] == 'assistant' %}"""
        """{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- generation %}"""
        """{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}{%- else %}"""
        """{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ """
        """message['content'] | trim + '<|eot_id|>' }}{%- endif %}""")],
    "mistral": [(
        """{{- ' ' + message['content'] + eos_token}}""",
        """{{- ' ' }}{%- generation %}{{- message['content'] """
        """+ eos_token }}{%- endgeneration %}""")],
}


def conversations(path, field):
    """Each line's messages, without their keys whose value is null (as prepare drops them)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield [{k: v for k, v in m.items() if v is not None}
                       for m in json.loads(line)[field]]


def template_of(d):
    jinja = os.path.join(d, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def build(fixture, out, corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    family = os.path.basename(os.path.normpath(fixture))
    kind, special, added, bos = FAMILIES[family]
    os.makedirs(out, exist_ok=True)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(fixture, name)):
            shutil.copy(os.path.join(fixture, name), os.path.join(out, name))
    texts = list(CORPUS) + [template_of(fixture)]
    for conv in conversations(corpus, "messages"):
        texts += [m["content"] for m in conv] + [m.get("reasoning_content", "") for m in conv]
    if kind == BYTE_LEVEL:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        alphabet = []
    tok.train_from_iterator(texts * 3, trainers.BpeTrainer(vocab_size=600, special_tokens=special,
                                                           initial_alphabet=alphabet))
    if added:
        tok.add_tokens(added)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=bos + " $A", pair=bos + " $A " + bos + " $B",
            special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(os.path.join(out, "tokenizer.json"))


def marked_template(family, template):
    for old, new in MARKS[family]:
        if template.count(old) != 1:
            sys.exit("chat_ref.py: the %s template has %d copies of the text to mark: %r"
                     % (family, template.count(old), old[:60]))
        template = template.replace(old, new)
    return template


def expect(tokdir, family, field, out, inputs):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokdir)
    marked = marked_template(family, template_of(tokdir))
    vocab = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json")).get_vocab_size(True)
    rows = []
    for path in inputs:
        for conv in conversations(path, field):
            ids = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
            text = tok.apply_chat_template(conv, tokenize=False)
            if tok.apply_chat_template(conv, tokenize=False, chat_template=marked) != text:
                sys.exit("chat_ref.py: the marked %s template renders another text" % family)
            m = tok.apply_chat_template(conv, chat_template=marked, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
            if list(m["input_ids"]) != list(ids):
                sys.exit("chat_ref.py: the marked %s template gives other tokens" % family)
            mask = list(m["assistant_masks"])
            if sum(mask) == 0:
                sys.exit("chat_ref.py: no assistant token in a %s conversation" % family)
            rows += [(t, k, int(i == 0)) for i, (t, k) in enumerate(zip(ids, mask))]
    with open(out, "w") as f:
        f.write("vocab %d eos -1\n" % vocab)
        for t, k, start in rows:
            f.write("%d %d %d\n" % (t, k, start))


def parquet(src, out, rows_per_group):
    import pyarrow as pa
    import pyarrow.parquet as pq
    with open(src, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=rows_per_group)
    groups = pq.ParquetFile(out).num_row_groups
    if groups < 2 or groups != -(-len(rows) // rows_per_group):
        sys.exit("chat_ref.py: %s has %d row groups of %d rows" % (out, groups, len(rows)))


def main():
    a = sys.argv[1:]
    if len(a) == 4 and a[0] == "build":
        build(a[1], a[2], a[3])
    elif len(a) >= 6 and a[0] == "expect":
        expect(a[1], a[2], a[3], a[4], a[5:])
    elif len(a) == 4 and a[0] == "parquet":
        parquet(a[1], a[2], int(a[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
