/* fuyou-launch's command line: the commands by name, the parser that fills struct fy_options
 * (launcher/cli/options.h) from the command line for one command, refusing an option that command
 * does not take (the table of options: launcher/cli/optable.h), and the usage texts (the
 * overview, and each command's own). */
#ifndef FY_ARGS_H
#define FY_ARGS_H

#include <stdio.h>

#include "launcher/cli/options.h"

/* fy_args_parse's result where --help was asked for (and printed). */
#define FY_ARGS_HELP 1

/* The command of that name (enum fy_command), or -1. */
int fy_args_command(const char *name);
const char *fy_args_command_name(enum fy_command cmd);
/* Whether argv[2..] (argv[1] the command) asks for --help or -h, before a "--". */
int fy_args_asks_help(int argc, char **argv);
/* Parses argv (argv[0] the command's name) into *o for `cmd`: the options that command takes,
 * with their defaults; the arguments after them in o->args. An option that `cmd` does not take,
 * an unknown one, or a value out of range is said on stderr in one line: -EINVAL. --help prints
 * the command's usage on stdout: FY_ARGS_HELP. */
int fy_args_parse(enum fy_command cmd, int argc, char **argv, struct fy_options *o);
/* The overview: the commands, and where their options are described (fuyou-launch help). */
void fy_args_usage(FILE *f);
/* One command's usage and options, only those it takes (fuyou-launch CMD --help). */
void fy_args_help(enum fy_command cmd, FILE *f);
/* Every option's name, one "--name" a line (fuyou-launch help --options). */
void fy_args_list(FILE *f);

#endif
