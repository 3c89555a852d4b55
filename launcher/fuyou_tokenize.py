#!/usr/bin/env python3
"""Tokenizer helper of `fuyou-launch prepare` (launcher/cmd/prepare.c runs it; not meant to be run by hand).

Reads text files, JSONL files or Parquet files, encodes them with a Hugging Face tokenizer.json
(the `tokenizers` package) or as UTF-8 bytes, and writes a binary stream of records to stdout,
which prepare.c turns into a token file (common/formats/tokfile.h). Inputs are streamed: a text file in
pieces of at most PIECE bytes cut after a newline, a JSONL file in batches of lines, a Parquet file
(`pyarrow`) in batches of BATCH_LINES rows of the columns the fields name, one row group decoded
after another; nothing holds the whole corpus.

  fuyou_tokenize.py (--tokenizer FILE | --bytes) [--jsonl] [--text-field F | --prompt-field P
                    --response-field R | --messages-field M] -- INPUT...

An input named *.parquet (in any case) is Parquet; with --jsonl the others are JSONL, else text.
Documents: each text file, each JSONL line or Parquet row (a record; errors name FILE:LINE or
FILE: row N). With a tokenizer, a document is encoded with the tokenizer's special tokens (its
post-processor, e.g. a BOS) and followed by the end-of-sequence token when the tokenizer has one
(tokenizer_config.json's eos_token beside tokenizer.json, else the first of EOS_NAMES in the
vocabulary). A text field is trained on whole; a prompt/response pair is the prompt's tokens (with
special tokens, masked out of the loss) then the response's (without special tokens) and the
end-of-sequence token (trained). The byte tokenizer has no special tokens and no EOS.

A messages field is a conversation, [{"role": ..., "content": "..."}, ...] (keys whose value is
null dropped), rendered with the model's chat template by transformers' apply_chat_template
(AutoTokenizer.from_pretrained of the tokenizer.json's directory: tokenizer_config.json's
chat_template or chat_template.jinja) and tokenized as transformers does (the tokenizer on the
rendered text, without special tokens); nothing is appended. Trained: for each assistant message,
the tokens from the first that overlaps its content (as rendered: as given, or stripped of
surrounding whitespace) through the first special token that starts at or after the content's end
(the end-of-turn token; only whitespace may lie between); the rest is masked. The content is found
by rendering again with a marker in place of each assistant content (ChatTok.render).

Stream (little-endian uint32 words): records of [type, n, payload]:
  BEGIN    1, 3, [version 2, vocabulary size, EOS token or 0xFFFFFFFF]   (first)
  TRAINED  2, n, n tokens whose mask is 1
  MASKED   3, n, n tokens whose mask is 0
  ERROR    4, n, n bytes of UTF-8: one line saying what is wrong and where (then exit 2)
  END      5, 2, total tokens as uint64                                   (last)
  DOCUMENT 6, 1, [1 a record, 0 a text file]: the tokens that follow begin a document (before
                 each document's first tokens; a document that yields no token has none)
"""
import array
import json
import os
import signal
import struct
import sys

BEGIN, TRAINED, MASKED, ERROR, END, DOCUMENT = 1, 2, 3, 4, 5, 6
STREAM_VERSION = 2
NO_EOS = 0xFFFFFFFF
PIECE = 1 << 20         # text bytes per encode call (an Encoding costs ~150x its text)
BATCH_LINES = 1024      # JSONL lines per encode_batch call
BATCH_BYTES = 4 << 20
RECORD_MAX = 1 << 20    # tokens per record
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


class InputError(Exception):
    pass


class Out:
    def __init__(self):
        self.f = sys.stdout.buffer
        self.total = 0

    def record(self, kind, payload):
        self.f.write(struct.pack("<II", kind, len(payload) // (1 if kind == ERROR else 4)))
        self.f.write(payload)

    def document(self, record):
        self.record(DOCUMENT, struct.pack("<I", 1 if record else 0))

    def tokens(self, ids, trained):
        for i in range(0, len(ids), RECORD_MAX):
            part = array.array("I", ids[i:i + RECORD_MAX])
            if sys.byteorder != "little":
                part.byteswap()
            self.record(TRAINED if trained else MASKED, part.tobytes())
            self.total += len(part)


class ByteTok:
    vocab, eos = 256, None

    def encode(self, texts, special):
        return [list(t.encode("utf-8")) for t in texts]


class HFTok:
    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise InputError("python3 (%s) cannot import the package 'tokenizers' (%s): install it "
                             "with: python3 -m pip install tokenizers" % (sys.executable, e))
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # the library raises plain Exception for a malformed file
            raise InputError("%s: not a tokenizer.json the tokenizers library loads: %s"
                             % (path, str(e).splitlines()[0] if str(e) else type(e).__name__))
        self.vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.eos = self.find_eos(path)

    def find_eos(self, path):
        cfg = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
        if os.path.isfile(cfg):
            try:
                with open(cfg, encoding="utf-8") as f:
                    name = json.load(f).get("eos_token")
            except (OSError, ValueError, AttributeError) as e:
                raise InputError("%s: cannot read eos_token: %s" % (cfg, e))
            if isinstance(name, dict):
                name = name.get("content")
            if isinstance(name, str):
                eos = self.tok.token_to_id(name)
                if eos is None:
                    raise InputError("%s: eos_token %r is not in the vocabulary of %s"
                                     % (cfg, name, path))
                return eos
        for name in EOS_NAMES:
            eos = self.tok.token_to_id(name)
            if eos is not None:
                return eos
        return None

    def encode(self, texts, special):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=special)]


def with_eos(tok, ids):
    if tok.eos is not None and (not ids or ids[-1] != tok.eos):
        ids = ids + [tok.eos]
    return ids


def text_file(tok, path, out):
    """A text file is one document, encoded in pieces cut after a newline."""
    piece, size, first, line_no, started = [], 0, True, 0, False

    def flush(last):
        nonlocal piece, size, first, started
        if piece or (last and not first):
            ids = tok.encode(["".join(piece)], first)[0]
            ids = with_eos(tok, ids) if last else ids
            if ids and not started:
                out.document(False)
                started = True
            out.tokens(ids, True)
        piece, size, first = [], 0, False

    with open(path, "rb") as f:
        for raw in f:
            line_no += 1
            try:
                piece.append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise InputError("%s:%d: not valid UTF-8 (byte %d of the line): give UTF-8 text"
                                 % (path, line_no, e.start + 1))
            size += len(raw)
            if size >= PIECE:
                flush(False)
    if line_no > 0:
        flush(True)


def first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def kind(v):
    return "null" if v is None else type(v).__name__


def is_parquet(path):
    return path.lower().endswith(".parquet")


def jsonl_records(path):
    """(where, object) for each JSON line of path; blank lines (a trailing newline) carry
    nothing."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError("%s:%d: not valid UTF-8 (byte %d of the line)"
                                 % (path, line_no, e.start + 1))
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise InputError("%s:%d: invalid JSON: %s" % (path, line_no, e))
            if not isinstance(obj, dict):
                raise InputError("%s:%d: expected a JSON object, got %s"
                                 % (path, line_no, type(obj).__name__))
            yield "%s:%d" % (path, line_no), obj


def parquet_records(path, columns):
    """(where, {column: value}) for each row of a Parquet file: only the columns asked for, read
    BATCH_LINES rows at a time (pyarrow decodes one row group after another), so memory holds a
    row group, not the file."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise InputError("python3 (%s) cannot import the package 'pyarrow' (%s), which reads "
                         "Parquet files: install it with: python3 -m pip install pyarrow"
                         % (sys.executable, e))
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except OSError:
        raise
    except Exception as e:  # pyarrow's ArrowInvalid and kin for a file that is not Parquet
        raise InputError("%s: not a Parquet file pyarrow reads: %s" % (path, first_line(e)))
    for c in columns:
        if c not in names:
            raise InputError("%s: no column '%s' (the file has: %s)"
                             % (path, c, ", ".join(names) or "no columns"))
    batches = pf.iter_batches(batch_size=BATCH_LINES, columns=columns)
    row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except OSError:
            raise
        except Exception as e:
            raise InputError("%s: cannot read the rows after row %d: %s"
                             % (path, row, first_line(e)))
        names = batch.schema.names
        values = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        for rec in zip(*values):
            row += 1
            yield "%s: row %d" % (path, row), dict(zip(names, rec))


def field(obj, name, where):
    if name not in obj:
        raise InputError("%s: no field '%s' (the line has: %s)"
                         % (where, name, ", ".join(sorted(obj)) or "no fields"))
    v = obj[name]
    if not isinstance(v, str):
        raise InputError("%s: field '%s' is %s, not a string" % (where, name, kind(v)))
    return v


def conversation(obj, name, where):
    """The messages of a record: a non-empty list of objects, each with a string role and content,
    at least one of them the assistant's (with some content). A message's keys whose value is null
    are dropped: a Parquet list of structs gives every message every key of the struct type, null
    where the message has none (and a template may test a key's presence)."""
    if name not in obj:
        raise InputError("%s: no field '%s' (the line has: %s)"
                         % (where, name, ", ".join(sorted(obj)) or "no fields"))
    msgs = obj[name]
    if not isinstance(msgs, list) or not msgs:
        raise InputError("%s: field '%s' is %s, not a list of messages"
                         % (where, name, "an empty list" if isinstance(msgs, list) else kind(msgs)))
    assistant = 0
    for i, m in enumerate(msgs, 1):
        if not isinstance(m, dict):
            raise InputError("%s: message %d is %s, not an object with a role and a content"
                             % (where, i, kind(m)))
        m = msgs[i - 1] = {k: v for k, v in m.items() if v is not None}
        for key in ("role", "content"):
            if key not in m:
                raise InputError("%s: message %d has no '%s' (it has: %s)"
                                 % (where, i, key, ", ".join(sorted(m)) or "no fields"))
            if not isinstance(m[key], str):
                raise InputError("%s: message %d: '%s' is %s, not a string"
                                 % (where, i, key, kind(m[key])))
        if m["role"] == "assistant":
            if not m["content"].strip():
                raise InputError("%s: message %d (assistant): the content is empty: nothing to "
                                 "train on" % (where, i))
            assistant += 1
    if assistant == 0:
        raise InputError("%s: the conversation has no assistant message: nothing to train on (the "
                         "loss is on the assistant's messages only)" % where)
    return msgs


class ChatTok:
    """Conversations rendered with the model's chat template through transformers'
    apply_chat_template and tokenized as it tokenizes them (the tokenizer called on the rendered
    text without special tokens), with each assistant message's span in the text; see
    docs/usage.md ("Chat data") for the mask this gives."""

    def __init__(self, path):
        self.dir = os.path.dirname(os.path.abspath(path))
        if os.path.basename(path) != "tokenizer.json":
            raise InputError("%s: --messages-field loads the tokenizer from its directory with "
                             "transformers, which looks for tokenizer.json there: give the model's "
                             "directory, or its file named tokenizer.json" % path)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory; never the network
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise InputError("python3 (%s) cannot import the package 'transformers' (%s), which "
                             "renders chat templates: install it with: python3 -m pip install "
                             "transformers" % (sys.executable, e))
        try:
            self.tok = AutoTokenizer.from_pretrained(self.dir)
        except Exception as e:  # whatever the library raises for a directory it cannot use
            raise InputError("%s: transformers cannot load the tokenizer of this directory: %s"
                             % (self.dir, first_line(e)))
        try:
            self.tok.get_chat_template()
        except ValueError:
            raise InputError("%s: the tokenizer has no chat template (tokenizer_config.json's "
                             "chat_template or chat_template.jinja beside tokenizer.json): "
                             "--messages-field renders conversations with the model's template; "
                             "give an instruct model's tokenizer, or use --prompt-field and "
                             "--response-field" % self.dir)
        if not getattr(self.tok, "is_fast", True):
            raise InputError("%s: transformers loads a tokenizer without character offsets (%s): "
                             "--messages-field needs a fast tokenizer (tokenizer.json)"
                             % (self.dir, type(self.tok).__name__))
        self.special = set(self.tok.all_special_ids)
        self.special |= {i for i, t in self.tok.added_tokens_decoder.items() if t.special}

    def apply(self, msgs, where):
        try:
            return self.tok.apply_chat_template(msgs, tokenize=False)
        except Exception as e:  # the template's raise_exception, or a jinja2 error
            raise InputError("%s: the chat template of %s refuses the conversation: %s"
                             % (where, self.dir, first_line(e)))

    def render(self, msgs, where):
        """The rendered text, and (message number, start, end) of each assistant message's content
        in it. The conversation is rendered again with each assistant content replaced by a
        marker: the text between the markers is the template's own, so the real text must be that
        text with each content in place of its marker, as given or stripped of surrounding
        whitespace (Jinja's trim); anything else is refused."""
        text = self.apply(msgs, where)
        base, seen = "FYCHATMARK", text + json.dumps(msgs)
        while base in seen:
            base += "X"
        turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        marks = {i: "%s%dQ" % (base, n) for n, i in enumerate(turns)}
        marked = self.apply([dict(m, content=marks[i]) if i in marks else m
                             for i, m in enumerate(msgs)], where)
        pieces, at = [], 0
        for i in turns:
            p = marked.find(marks[i], at)
            if p < 0 or marked.find(marks[i], p + len(marks[i])) >= 0:
                raise InputError("%s: message %d (assistant): the chat template does not render "
                                 "its content once, in order: its tokens cannot be told apart"
                                 % (where, i + 1))
            pieces.append(marked[at:p])
            at = p + len(marks[i])
        pieces.append(marked[at:])
        spans, t = [], 0
        for n, i in enumerate(turns):
            c, found = msgs[i]["content"], None
            if text.startswith(pieces[n], t):
                t += len(pieces[n])
                for v in dict.fromkeys((c, c.strip(), c.lstrip(), c.rstrip(), c.strip("\n"),
                                        c.lstrip("\n"), c.rstrip("\n"))):
                    if v and text.startswith(v, t) and text.startswith(pieces[n + 1], t + len(v)):
                        found = v
                        break
            if found is None or (n + 1 == len(turns) and
                                 t + len(found) + len(pieces[-1]) != len(text)):
                raise InputError("%s: near message %d (assistant): the chat template changes the "
                                 "content beyond surrounding whitespace, or renders the turn "
                                 "according to it (a <think> block in the content?): its tokens "
                                 "cannot be told apart; give the content as the template renders "
                                 "it (reasoning in 'reasoning_content')" % (where, i + 1))
            spans.append((i + 1, t, t + len(found)))
            t += len(found)
        return text, spans

    def masked(self, where, text, spans, ids, offsets):
        """1 for the tokens from the first that overlaps an assistant content through the first
        special token after it (the end-of-turn token; only whitespace may lie between), else 0."""
        mask, j, n = [0] * len(ids), 0, len(ids)
        for msg, a, b in spans:
            while j < n and offsets[j][1] <= a:
                j += 1
            k = j
            while k < n and not (offsets[k][0] >= b and ids[k] in self.special):
                k += 1
            gap = text[b:offsets[k][0] if k < n else len(text)]
            if k == n or gap.strip():
                raise InputError("%s: message %d (assistant): the chat template follows its "
                                 "content with %r, not with a special token that ends the turn: "
                                 "there is no end-of-turn token to train (a base model's "
                                 "template?)" % (where, msg, gap[:40]))
            for t in range(j, k + 1):
                mask[t] = 1
            j = k + 1
        return mask

    def encode(self, items):
        """[(where, messages)] -> [(tokens, mask)]."""
        rendered = [self.render(msgs, where) for where, msgs in items]
        enc = self.tok([text for text, _ in rendered], add_special_tokens=False,
                       return_offsets_mapping=True)
        return [(ids, self.masked(where, text, spans, ids, offs))
                for (where, _), (text, spans), ids, offs
                in zip(items, rendered, enc["input_ids"], enc["offset_mapping"])]


def runs(out, ids, mask):
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and mask[j] == mask[i]:
            j += 1
        out.tokens(ids[i:j], mask[i] == 1)
        i = j


class Lazy:
    """A value made when first asked for (transformers takes seconds to import: a malformed first
    batch of records is said before)."""

    def __init__(self, make):
        self.make, self.value = make, None

    def get(self):
        if self.value is None:
            self.value = self.make()
        return self.value


def records_file(tok, chat, path, out, args):
    """A JSONL or Parquet file: each record one document (see the module's docstring); chat: a
    Lazy ChatTok, for --messages-field."""
    if is_parquet(path):
        records = parquet_records(path, args.columns())
    else:
        records = jsonl_records(path)
    batch, size = [], 0

    def flush():
        nonlocal batch, size
        if not batch:
            return
        if args.text_field is not None:
            for (where, _), ids in zip(batch, tok.encode([t for _, (t,) in batch], True)):
                if not ids:
                    raise InputError("%s: field '%s' encodes to no tokens"
                                     % (where, args.text_field))
                out.document(True)
                out.tokens(with_eos(tok, ids), True)
        elif args.prompt_field is not None:
            prompts = tok.encode([p for _, (p, _) in batch], True)
            responses = tok.encode([r for _, (_, r) in batch], False)
            for (where, _), p, r in zip(batch, prompts, responses):
                if not r:
                    raise InputError("%s: field '%s' encodes to no tokens"
                                     % (where, args.response_field))
                if tok.eos is not None and p and p[-1] == tok.eos:
                    p = p[:-1]  # a post-processor's EOS does not end a prompt
                out.document(True)
                out.tokens(p, False)
                out.tokens(with_eos(tok, r), True)
        else:
            for ids, mask in chat.get().encode([(where, m) for where, (m,) in batch]):
                out.document(True)
                runs(out, ids, mask)
        batch, size = [], 0

    for where, obj in records:
        if args.text_field is not None:
            t = field(obj, args.text_field, where)
            if not t:
                raise InputError("%s: field '%s' is empty" % (where, args.text_field))
            rec, n = (t,), len(t)
        elif args.prompt_field is not None:
            p = field(obj, args.prompt_field, where)
            r = field(obj, args.response_field, where)
            if not r:
                raise InputError("%s: field '%s' is empty" % (where, args.response_field))
            rec, n = (p, r), len(p) + len(r)
        else:
            m = conversation(obj, args.messages_field, where)
            rec, n = (m,), sum(len(x["content"]) for x in m)
        batch.append((where, rec))
        size += n
        if len(batch) >= BATCH_LINES or size >= BATCH_BYTES:
            flush()
    flush()


class Args:
    def __init__(self, argv):
        self.tokenizer = self.text_field = self.prompt_field = self.response_field = None
        self.messages_field = None
        self.bytes = self.jsonl = False
        i = 0
        while i < len(argv) and argv[i] != "--":
            a = argv[i]
            if a in ("--tokenizer", "--text-field", "--prompt-field", "--response-field",
                     "--messages-field"):
                if i + 1 >= len(argv):
                    raise InputError("fuyou_tokenize.py: %s needs a value" % a)
                setattr(self, a[2:].replace("-", "_"), argv[i + 1])
                i += 2
                continue
            if a == "--bytes":
                self.bytes = True
            elif a == "--jsonl":
                self.jsonl = True
            else:
                raise InputError("fuyou_tokenize.py: unknown option %s" % a)
            i += 1
        self.inputs = argv[i + 1:]
        if (self.tokenizer is None) == (not self.bytes) or not self.inputs:
            raise InputError("fuyou_tokenize.py: give --tokenizer FILE or --bytes, then -- INPUT...")
        kinds = [self.text_field, self.prompt_field, self.messages_field]
        records = self.jsonl or any(is_parquet(p) for p in self.inputs)
        if records and sum(k is not None for k in kinds) != 1:
            raise InputError("fuyou_tokenize.py: JSONL and Parquet inputs need one of "
                             "--text-field, --prompt-field or --messages-field")
        if (self.prompt_field is None) != (self.response_field is None) or \
                (self.messages_field is not None and self.tokenizer is None):
            raise InputError("fuyou_tokenize.py: --prompt-field needs --response-field, and "
                             "--messages-field needs --tokenizer")

    def columns(self):
        names = [self.text_field, self.prompt_field, self.response_field, self.messages_field]
        return list(dict.fromkeys(n for n in names if n is not None))


def main():
    # a Ctrl-C reaches this helper and the launcher at once: the launcher says it and cleans up, so
    # the helper ends quietly (no traceback)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    out = Out()
    sys.stdout = sys.stderr  # the libraries' prints must not mix into the stream
    try:
        args = Args(sys.argv[1:])
        tok = ByteTok() if args.bytes else HFTok(args.tokenizer)
        chat = Lazy(lambda: ChatTok(args.tokenizer))
        # a conversation ends as its template ends it: no end-of-sequence token is appended
        eos = NO_EOS if args.messages_field is not None or tok.eos is None else tok.eos
        out.record(BEGIN, struct.pack("<III", STREAM_VERSION, tok.vocab, eos))
        for path in args.inputs:
            try:
                if args.jsonl or is_parquet(path):
                    records_file(tok, chat, path, out, args)
                else:
                    text_file(tok, path, out)
            except OSError as e:
                raise InputError("cannot read input %s: %s" % (path, e.strerror or e))
        if out.total == 0:
            raise InputError("%s: the input%s hold no text: nothing to prepare"
                             % (", ".join(args.inputs), "s" if len(args.inputs) > 1 else ""))
        out.record(END, struct.pack("<Q", out.total))
        out.f.flush()
        return 0
    except InputError as e:
        msg = str(e).replace("\n", " ")
        out.record(ERROR, msg.encode("utf-8", "replace"))
        out.f.flush()
        return 2
    except BrokenPipeError:
        return 3  # the reader stopped (it said why)


if __name__ == "__main__":
    sys.exit(main())
