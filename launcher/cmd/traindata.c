/* A train command's data: launcher/cmd/traindata.h. */
#include "launcher/cmd/traindata.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "launcher/step/progress.h"

/* The data's tokenizer against the run's. The run's is RUN/hf/tokenizer.json, kept by init
 * --from-hf: a token file must record that file's hash; a byte-level one is refused, and one that
 * records no tokenizer (a version 1 file of another vocabulary than 256, written by another tool)
 * is said unchecked. A version 1 file of vocabulary 256 is what prepare writes for plain text with
 * the byte-level tokenizer. A run without that file (a model made by init) has only its vocabulary
 * to go by (fy_tokfile_open checks it), but a byte-level model (vocabulary 256) refuses a Hugging
 * Face token file. */
static int check_data_tokenizer(const struct fy_options *o, const struct fy_model_config *model,
                                const struct fy_tokfile *data)
{
    struct fy_tokfile_source src = fy_tokfile_source(data);
    const char *made_with =
        src.name != NULL ? src.name : "a tokenizer.json (its path not recorded)";
    int bytes = src.tokenizer == FY_TOKENIZER_BYTES ||
                (src.tokenizer == FY_TOKENIZER_UNSPECIFIED && fy_tokfile_version(data) == 1 &&
                 fy_tokfile_vocab(data) == FY_TOKFILE_BYTE_VOCAB);
    char run_tok[PATH_MAX];
    snprintf(run_tok, sizeof run_tok, "%s/hf/tokenizer.json", o->run_dir);
    if (access(run_tok, F_OK) != 0) {
        int e = errno;
        FY_REQUIRE(e == ENOENT, -e, "cannot read %s: %s", run_tok, strerror(e));
        if (model->vocab == FY_TOKFILE_BYTE_VOCAB && src.tokenizer == FY_TOKENIZER_HF) {
            fy_error("train: the token file %s was made with the Hugging Face tokenizer %s (hash "
                     "%016llx), and the run's model has the byte-level vocabulary of 256 (a model "
                     "made by init, no %s): prepare the data without --tokenizer, or init the run "
                     "from that tokenizer's model (init --from-hf)",
                     o->data, made_with, (unsigned long long)src.hash, run_tok);
            return -EINVAL;
        }
        return 0;
    }
    uint64_t hash;
    FY_TRY(fy_tokfile_hash_file(run_tok, &hash));
    if (src.tokenizer == FY_TOKENIZER_HF && src.hash == hash)
        return 0;
    if (src.tokenizer == FY_TOKENIZER_HF) {
        fy_error("train: the token file %s was made with another tokenizer than the run's: with %s "
                 "(hash %016llx), the run's is %s (hash %016llx): prepare the data again with "
                 "--tokenizer %s",
                 o->data, made_with, (unsigned long long)src.hash, run_tok,
                 (unsigned long long)hash, run_tok);
        return -EINVAL;
    }
    if (bytes) {
        fy_error("train: the token file %s was made with the byte-level tokenizer (prepare "
                 "without --tokenizer), the run's model with %s (hash %016llx): prepare the data "
                 "again with --tokenizer %s",
                 o->data, run_tok, (unsigned long long)hash, run_tok);
        return -EINVAL;
    }
    fy_warn("train: the token file %s does not record its tokenizer (a version 1 file of "
            "vocabulary %u): it is not checked against the run's %s; prepare it with --tokenizer "
            "%s to have it checked",
            o->data, fy_tokfile_vocab(data), run_tok, run_tok);
    return 0;
}

int fy_traindata_open(struct fy_options *o, const struct fy_model_config *model,
                      struct fy_tokfile **data, struct fy_sampler **batches)
{
    FY_TRY(fy_tokfile_open(data, o->data, model->vocab));
    FY_TRY(check_data_tokenizer(o, model, *data));
    if (o->packing == FY_PACKING_DOCUMENTS && fy_tokfile_documents(*data) == 0) {
        fy_error("train --packing documents: %s records no documents (a version %u token file, "
                 "from before documents were recorded, or another tool's): prepare it again with "
                 "this build's fuyou-launch prepare, or train with --packing windows",
                 o->data, fy_tokfile_version(*data));
        return -FY_EUSAGE;
    }
    struct fy_sampler_opts so = {.packing = o->packing,
                                 .long_docs = o->long_docs,
                                 .B = (int)o->batch,
                                 .T = (int)o->seq,
                                 .seed = o->seed,
                                 .eval_fraction = o->eval_fraction};
    FY_TRY(fy_sampler_new(batches, *data, &so));
    /* Refuse a batch larger than the data now, before any worker starts. */
    size_t n = (size_t)o->batch * o->seq;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg), *pos = malloc(n * 4);
    int rc = in && tg && pos ? 0 : -ENOMEM;
    if (rc == 0)
        rc = fy_sampler_train_batch(*batches, 1, in, tg, pos, NULL);
    if (rc == 0 && o->eval_batches > 0)
        rc = fy_sampler_eval_batch(*batches, 0, in, tg, pos, NULL);
    free(in);
    free(tg);
    free(pos);
    FY_TRY(rc);
    uint64_t per = fy_sampler_epoch_steps(*batches);
    if (o->epochs_set) {
        FY_REQUIRE(o->epochs <= UINT64_MAX / per, -FY_EUSAGE,
                   "train --epochs %llu: %llu steps an epoch make too many steps",
                   (unsigned long long)o->epochs, (unsigned long long)per);
        o->steps = o->epochs * per;
    }
    if (fy_sampler_packing(*batches) == FY_PACKING_DOCUMENTS) {
        uint64_t pass = fy_sampler_split_of(*batches, FY_TOKFILE_EVAL)->batches;
        if (!o->eval_batches_set || o->eval_batches > pass)
            o->eval_batches = pass; /* every held-out document once */
    }
    return 0;
}

void fy_traindata_describe(const struct fy_options *o, const struct fy_tokfile *data,
                           const struct fy_sampler *b)
{
    const struct fy_sampler_split *tr = fy_sampler_split_of(b, FY_TOKFILE_TRAIN);
    const struct fy_sampler_split *ev = fy_sampler_split_of(b, FY_TOKFILE_EVAL);
    uint64_t per = fy_sampler_epoch_steps(b);
    char epochs[96] = "";
    if (o->epochs_set)
        snprintf(epochs, sizeof epochs, "; --epochs %llu: %llu steps",
                 (unsigned long long)o->epochs, (unsigned long long)o->steps);
    if (fy_sampler_packing(b) == FY_PACKING_WINDOWS) {
        const char *why = o->packing == FY_PACKING_WINDOWS ? "--packing windows"
                          : fy_tokfile_documents(data) == 0
                              ? "the data records no documents: one stream"
                              : "the data's documents are whole text files (--packing documents "
                                "packs each alone)";
        fy_info("batches: windows of %llu + 1 tokens of the token stream at random (%s); an "
                "epoch (as many windows as the training split holds side by side) is %llu "
                "step%s%s; evaluation: %llu batch%s of consecutive held-out windows",
                (unsigned long long)o->seq, why, (unsigned long long)per, per == 1 ? "" : "s",
                epochs, (unsigned long long)o->eval_batches, o->eval_batches == 1 ? "" : "es");
        fy_progress_data(NULL);
        return;
    }
    double fill = (double)tr->tokens / ((double)per * (double)o->batch * (double)o->seq);
    char cut[320] = "";
    size_t at = 0;
    if (tr->truncated > 0)
        at +=
            (size_t)snprintf(cut + at, sizeof cut - at,
                             "; %llu document%s longer than %llu + 1 tokens cut to %llu + 1 (%llu "
                             "predictions left out an epoch; --long-docs split keeps them)",
                             (unsigned long long)tr->truncated, tr->truncated == 1 ? "" : "s",
                             (unsigned long long)o->seq, (unsigned long long)o->seq,
                             (unsigned long long)tr->dropped);
    if (tr->split > 0 && at < sizeof cut)
        at += (size_t)snprintf(cut + at, sizeof cut - at,
                               "; %llu document%s longer than %llu + 1 tokens split into pieces",
                               (unsigned long long)tr->split, tr->split == 1 ? "" : "s",
                               (unsigned long long)o->seq);
    if (tr->single > 0 && at < sizeof cut)
        snprintf(cut + at, sizeof cut - at, "; %llu document%s of one token left out",
                 (unsigned long long)tr->single, tr->single == 1 ? "" : "s");
    fy_info("batches: documents packed whole, each alone (%s): %llu training documents in %llu "
            "rows of %llu, %llu step%s an epoch, fill %.1f%% (trained tokens over B x T)%s%s; "
            "evaluation: %llu of the %llu batch%s that hold the %llu held-out documents (%llu "
            "rows; a pass evaluates each once)",
            o->packing == FY_PACKING_DOCUMENTS ? "--packing documents"
                                               : "the data's documents are records",
            (unsigned long long)tr->documents, (unsigned long long)tr->rows,
            (unsigned long long)o->seq, (unsigned long long)per, per == 1 ? "" : "s", 100.0 * fill,
            cut, epochs, (unsigned long long)o->eval_batches, (unsigned long long)ev->batches,
            ev->batches == 1 ? "" : "es", (unsigned long long)ev->documents,
            (unsigned long long)ev->rows);
    char summary[200];
    if (o->long_docs == FY_LONG_DOCS_SPLIT)
        snprintf(summary, sizeof summary, "packed documents: %llu of %llu split into pieces",
                 (unsigned long long)tr->split, (unsigned long long)tr->documents);
    else
        snprintf(summary, sizeof summary,
                 "packed documents: %llu of %llu truncated to %llu + 1 "
                 "tokens",
                 (unsigned long long)tr->truncated, (unsigned long long)tr->documents,
                 (unsigned long long)o->seq);
    fy_progress_data(summary);
}
