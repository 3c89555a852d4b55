#!/usr/bin/env python3
"""Tokenizer helper of `fuyou-launch prepare` (launcher/prepare.c runs it; not meant to be run by hand).

Reads text files or JSONL files, encodes them with a Hugging Face tokenizer.json (the `tokenizers`
package) or as UTF-8 bytes, and writes a binary stream of records to stdout, which prepare.c turns
into a token file (common/tokfile.h). Inputs are streamed: a text file in pieces of at most PIECE
bytes cut after a newline, a JSONL file in batches of lines; nothing holds the whole corpus.

  fuyou_tokenize.py (--tokenizer FILE | --bytes) [--jsonl (--text-field F | --prompt-field P
                    --response-field R)] -- INPUT...

Documents: each text file, each JSONL line. With a tokenizer, a document is encoded with the
tokenizer's special tokens (its post-processor, e.g. a BOS) and followed by the end-of-sequence token
when the tokenizer has one (tokenizer_config.json's eos_token beside tokenizer.json, else the first
of EOS_NAMES in the vocabulary). A text field is trained on whole; a prompt/response pair is the
prompt's tokens (with special tokens, masked out of the loss) then the response's (without special
tokens) and the end-of-sequence token (trained). The byte tokenizer has no special tokens and no EOS.

Stream (little-endian uint32 words): records of [type, n, payload]:
  BEGIN    1, 3, [version 1, vocabulary size, EOS token or 0xFFFFFFFF]   (first)
  TRAINED  2, n, n tokens whose mask is 1
  MASKED   3, n, n tokens whose mask is 0
  ERROR    4, n, n bytes of UTF-8: one line saying what is wrong and where (then exit 2)
  END      5, 2, total tokens as uint64                                   (last)
"""
import array
import json
import os
import struct
import sys

BEGIN, TRAINED, MASKED, ERROR, END = 1, 2, 3, 4, 5
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
    piece, size, first, line_no = [], 0, True, 0

    def flush(last):
        nonlocal piece, size, first
        if piece or (last and not first):
            ids = tok.encode(["".join(piece)], first)[0]
            out.tokens(with_eos(tok, ids) if last else ids, True)
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


def field(obj, name, path, line_no):
    if name not in obj:
        raise InputError("%s:%d: no field '%s' (the line has: %s)"
                         % (path, line_no, name, ", ".join(sorted(obj)) or "no fields"))
    v = obj[name]
    if not isinstance(v, str):
        raise InputError("%s:%d: field '%s' is %s, not a string"
                         % (path, line_no, name, type(v).__name__))
    return v


def jsonl_file(tok, path, out, args):
    batch, size = [], 0

    def flush():
        nonlocal batch, size
        if not batch:
            return
        if args.text_field is not None:
            for (line_no, _), ids in zip(batch, tok.encode([t for _, (t,) in batch], True)):
                if not ids:
                    raise InputError("%s:%d: field '%s' encodes to no tokens"
                                     % (path, line_no, args.text_field))
                out.tokens(with_eos(tok, ids), True)
        else:
            prompts = tok.encode([p for _, (p, _) in batch], True)
            responses = tok.encode([r for _, (_, r) in batch], False)
            for (line_no, _), p, r in zip(batch, prompts, responses):
                if not r:
                    raise InputError("%s:%d: field '%s' encodes to no tokens"
                                     % (path, line_no, args.response_field))
                if tok.eos is not None and p and p[-1] == tok.eos:
                    p = p[:-1]  # a post-processor's EOS does not end a prompt
                out.tokens(p, False)
                out.tokens(with_eos(tok, r), True)
        batch, size = [], 0

    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError("%s:%d: not valid UTF-8 (byte %d of the line)"
                                 % (path, line_no, e.start + 1))
            if not text.strip():
                continue  # blank lines (a trailing newline) carry nothing
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise InputError("%s:%d: invalid JSON: %s" % (path, line_no, e))
            if not isinstance(obj, dict):
                raise InputError("%s:%d: expected a JSON object, got %s"
                                 % (path, line_no, type(obj).__name__))
            if args.text_field is not None:
                t = field(obj, args.text_field, path, line_no)
                if not t:
                    raise InputError("%s:%d: field '%s' is empty" % (path, line_no, args.text_field))
                rec = (t,)
            else:
                p = field(obj, args.prompt_field, path, line_no)
                r = field(obj, args.response_field, path, line_no)
                if not r:
                    raise InputError("%s:%d: field '%s' is empty"
                                     % (path, line_no, args.response_field))
                rec = (p, r)
            batch.append((line_no, rec))
            size += len(raw)
            if len(batch) >= BATCH_LINES or size >= BATCH_BYTES:
                flush()
    flush()


class Args:
    def __init__(self, argv):
        self.tokenizer = self.text_field = self.prompt_field = self.response_field = None
        self.bytes = self.jsonl = False
        i = 0
        while i < len(argv) and argv[i] != "--":
            a = argv[i]
            if a in ("--tokenizer", "--text-field", "--prompt-field", "--response-field"):
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
        if self.jsonl and (self.text_field is None) == (self.prompt_field is None):
            raise InputError("fuyou_tokenize.py: --jsonl needs --text-field or --prompt-field")


def main():
    out = Out()
    try:
        args = Args(sys.argv[1:])
        tok = ByteTok() if args.bytes else HFTok(args.tokenizer)
        out.record(BEGIN, struct.pack("<III", 1, tok.vocab, NO_EOS if tok.eos is None else tok.eos))
        for path in args.inputs:
            try:
                if args.jsonl:
                    jsonl_file(tok, path, out, args)
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
