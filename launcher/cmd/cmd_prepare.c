/* fuyou-launch prepare: text, JSON lines or Parquet files into a token file
 * (launcher/cmd/prepare.h). */
#include <errno.h>
#include <stdio.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/base/log.h"
#include "common/formats/tokfile.h"
#include "launcher/cmd/cmd.h"
#include "launcher/cmd/prepare.h"

int fy_cmd_prepare(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->out, "--out", "prepare"));
    FY_USAGE(o->n_args > 0, "prepare: give one or more input files after the options");
    struct fy_prepare_opts po = {.out = o->out,
                                 .tokenizer = o->tokenizer,
                                 .jsonl = o->jsonl,
                                 .text_field = o->text_field,
                                 .prompt_field = o->prompt_field,
                                 .response_field = o->response_field,
                                 .messages_field = o->messages_field,
                                 .inputs = (const char *const *)o->args,
                                 .n_inputs = (unsigned)o->n_args,
                                 .overwrite = o->overwrite};
    struct fy_prepare_result res;
    struct fy_made_dirs made; /* --out's missing directories, removed again where it fails */
    FY_TRY(fy_prepare_stop_on_signals());
    FY_TRY(fy_mkdirs_for(o->out, "the directory of the token file", &made));
    int rc = fy_prepare(&po, &res);
    if (rc < 0) {
        fy_made_dirs_undo(&made, NULL, 0);
        return rc;
    }
    char eos[48] = "";
    if (res.eos != FY_TOKFILE_NO_EOS)
        snprintf(eos, sizeof eos, ", end-of-sequence token %u", res.eos);
    char masked[96] = "";
    if (res.masked > 0)
        snprintf(masked, sizeof masked, ", %llu of them masked out of the loss",
                 (unsigned long long)res.masked);
    fy_info("wrote %s: %llu tokens%s (%s, vocabulary %u%s) from %d file(s); %llu document%s, %s",
            o->out, (unsigned long long)res.count, masked, res.tokenizer, res.vocab, eos, o->n_args,
            (unsigned long long)res.documents, res.documents == 1 ? "" : "s",
            res.records ? "each a record (train packs them whole: --packing documents)"
                        : "each a whole text file (train takes windows of the stream: "
                          "--packing windows)");
    return 0;
}

void fy_cmd_prepare_stopped(const struct fy_options *o, const char *removed)
{
    (void)removed; /* prepare makes no run directory */
    fy_warn("stopped by signal before prepare was done: %s is as it was, and nothing of this run "
            "is left (no temporary file, no directory made for it); run it again",
            o->out);
}
