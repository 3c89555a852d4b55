/* A train command's data: the token file checked against the run's model (its vocabulary, and the
 * tokenizer it was made with against the run's RUN/hf/tokenizer.json), its batches
 * (common/data/sampler.h), and what they are, said at start. */
#ifndef FY_TRAINDATA_H
#define FY_TRAINDATA_H

#include "common/model/model.h"
#include "common/data/sampler.h"
#include "common/formats/tokfile.h"
#include "launcher/cli/options.h"

/* The token file and its batches (common/data/sampler.h): --epochs becomes the steps they take, and
 * with packed documents the evaluation a whole pass over the held-out ones (unless --eval-batches
 * says less). */
int fy_traindata_open(struct fy_options *o, const struct fy_model_config *model,
                      struct fy_tokfile **data, struct fy_sampler **batches);
/* The batches, said at start: how they are made from the data, an epoch's steps, and with packed
 * documents the fill and what was cut; the summary's part of it. */
void fy_traindata_describe(const struct fy_options *o, const struct fy_tokfile *data,
                           const struct fy_sampler *b);

#endif
