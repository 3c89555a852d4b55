/* `fuyou-launch prepare`: text, JSONL or Parquet inputs -> a token file (common/formats/tokfile.h). Plain
 * text with the built-in byte tokenizer is done here in C (fy_tokfile_prepare_bytes); a Hugging
 * Face tokenizer.json, JSONL or Parquet inputs go through launcher/fuyou_tokenize.py run with
 * python3, whose stream of tokens and mask flags is written through the streaming token writer, so
 * memory stays bounded and nothing appears at the output until the whole input is done. An input
 * named *.parquet is Parquet; the others are JSONL with jsonl, else text. */
#ifndef FY_PREPARE_H
#define FY_PREPARE_H

#include <stdint.h>

struct fy_prepare_opts {
    const char *out;
    const char *tokenizer;      /* a tokenizer.json, or a directory holding one; NULL: bytes */
    int jsonl;                  /* inputs not named *.parquet are JSON lines */
    const char *text_field;     /* JSONL, Parquet: the field trained on whole (default "text") */
    const char *prompt_field;   /* JSONL, Parquet: prompt (masked) ... */
    const char *response_field; /* ... and response (trained) */
    const char *messages_field; /* JSONL, Parquet: a conversation, through the chat template */
    const char *const *inputs;
    unsigned n_inputs;
    int overwrite;
};

struct fy_prepare_result {
    uint64_t count, masked;
    uint64_t documents;  /* as the token file records them (each non-empty input or record) */
    int records;         /* the documents are records (JSONL lines, Parquet rows), not text files */
    uint32_t vocab, eos; /* eos: FY_TOKFILE_NO_EOS for none (and for conversations) */
    char tokenizer[128]; /* described, for the log */
};

/* Prepares o->out; one line on stderr (through the log) for any failure, and no file left. -EINTR
 * (nothing said) where a signal stopped it after fy_prepare_stop_on_signals. */
int fy_prepare(const struct fy_prepare_opts *o, struct fy_prepare_result *res);
/* From now on SIGINT and SIGTERM stop a preparation (the helper's stream and the token file's
 * writes, which then abort, removing the temporary file) in place of killing the process. -errno,
 * said. */
int fy_prepare_stop_on_signals(void);

#endif
