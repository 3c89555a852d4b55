/* `fuyou-launch prepare`: text or JSONL inputs -> a token file (common/tokfile.h). Plain text with
 * the built-in byte tokenizer is done here in C (fy_tokfile_prepare_bytes); a Hugging Face
 * tokenizer.json, or JSONL inputs, go through launcher/fuyou_tokenize.py run with python3, whose
 * stream of tokens and mask flags is written through the streaming token writer, so memory stays
 * bounded and nothing appears at the output until the whole input is done. */
#ifndef FY_PREPARE_H
#define FY_PREPARE_H

#include <stdint.h>

struct fy_prepare_opts {
    const char *out;
    const char *tokenizer;      /* a tokenizer.json, or a directory holding one; NULL: bytes */
    int jsonl;                  /* inputs are JSON lines */
    const char *text_field;     /* JSONL: the field trained on whole (default "text") */
    const char *prompt_field;   /* JSONL: prompt (masked) ... */
    const char *response_field; /* ... and response (trained) */
    const char *const *inputs;
    unsigned n_inputs;
    int overwrite;
};

struct fy_prepare_result {
    uint64_t count, masked;
    uint32_t vocab, eos; /* eos: FY_TOKFILE_NO_EOS for none */
    char tokenizer[128]; /* described, for the log */
};

/* Prepares o->out; one line on stderr (through the log) for any failure, and no file left. */
int fy_prepare(const struct fy_prepare_opts *o, struct fy_prepare_result *res);

#endif
