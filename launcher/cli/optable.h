/* The table of fuyou-launch's options: each option's name, its value's placeholder, the commands
 * that take it, where its value goes in struct fy_options (launcher/cli/options.h) and how it is
 * parsed, and its help (for some commands a help of their own); and the options' defaults. The
 * command line's parser and usage texts read it (launcher/cli/args.h); tests/integration/test_docs
 * checks docs/configuration.md against it. */
#ifndef FY_OPTABLE_H
#define FY_OPTABLE_H

#include <stddef.h>

#include "launcher/cli/options.h"

/* Where an option's value goes: a string, a switch (1), a size or a number, or its parser. */
enum fy_optable_kind { FY_OPT_STRING, FY_OPT_SWITCH, FY_OPT_SIZE, FY_OPT_NUMBER, FY_OPT_PARSE };

/* One option. */
struct fy_optable_spec {
    const char *name, *value;  /* value: its placeholder in the help; NULL for a switch */
    unsigned commands;         /* C(...) of those that take it */
    enum fy_optable_kind kind; /* where it goes: a string, a switch (1), a size or a number */
    size_t field;              /* ... at this offset in struct fy_options */
    size_t noted;              /* NOTED(flag): also set flag to 1; 0: none */
    int (*parse)(struct fy_options *o, const char *value); /* K_PARSE */
    const char *help;
};

/* The options, in the order the usage texts list them: fy_optable_count of them, at most
 * FY_OPTABLE_MAX. */
#define FY_OPTABLE_MAX 128
extern const struct fy_optable_spec fy_optable[];
extern const size_t fy_optable_count;

/* Every option's default (steps: selftest's; train's is 200, fy_cmd_train), the training values the
 * from-scratch set's (fy_options_train_defaults). */
void fy_optable_defaults(struct fy_options *o);
/* Sets option s from its value (NULL for a switch) in *o, and its NOTED flag; 0, or -EINVAL (said
 * on stderr in one line) for a value out of range. */
int fy_optable_set(const struct fy_optable_spec *s, const char *value, struct fy_options *o);
/* The option's help for command cmd: the command's own where it has one. */
const char *fy_optable_help(const struct fy_optable_spec *s, enum fy_command cmd);

#endif
