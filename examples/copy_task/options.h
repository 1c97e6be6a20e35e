// copy_task's flags: one table (options.c) gives the parsing, the range checks, --help,
// the settings a checkpoint records and the ones every process of an MPI run must share.
#ifndef COPY_TASK_OPTIONS_H
#define COPY_TASK_OPTIONS_H

#include <stdint.h>

#include <attograd.h>

#include "seqdata.h"

// The most --steps and --finetune-steps allow: a checkpoint's counts too.
#define STEPS_MAX 100000000
// What a run that went wrong exits with (a bad flag: 2).
#define EXIT_FAILED 1
// The room for a file name under --out (options_out_path).
#define OUT_PATH_MAX 1024
// The longest file name the run writes under --out, after "<task>".
#define OUT_LONGEST_SUFFIX "_attention.svg"

typedef struct {
    int task;  // an ag_task
    int length, d_model, heads, layers, batch, steps, threads, eval_every;
    int prune, finetune_steps, test_length, save_every;
    int pos;   // an ag_pos_kind
    double lr, dropout, target_acc;
    bool lr_given;  // --lr on the command line: with --resume, it replaces the checkpoint's
    uint64_t seed;
    bool cross, no_attention, f64, bf16, profile, analyze_heads;
    const char *data, *out, *save, *resume;
} options;

// Reads the flags and checks them together (against the task, the model, each other);
// makes --out and checks that --save can be written (rank 0, which writes them). Exits
// after printing --help (status 0), after one line on a flag it refuses (status 2) or
// on a file it cannot write (status 1), and under mpirun when the ranks were started
// with other flags than rank 0 (dist_agree_flags).
void options_parse(options *o, int argc, char **argv);

// The settings that decide a run's numbers, for a checkpoint's metadata: flags_to_meta
// of them, then `extra`, in static storage.
const char *const *options_meta(const options *o, const char *const extra[]);
// "<--out>/<task><suffix>": where the run's files go. Every name fits OUT_PATH_MAX:
// options_parse refused an --out for which the longest would not (a cut name wrote
// elsewhere: "copy_attention." for "copy_attention.svg").
void options_out_path(const options *o, const char *suffix, char *buf, size_t size);
// Whether the checkpoint `file` (from `path`) was saved under the settings of o; false
// with one line in err naming the first that differs.
bool options_match_file(const options *o, const ag_safetensors *file, const char *path,
                        ag_err *err);

#endif
