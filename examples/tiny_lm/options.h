// tiny_lm's flags. A checkpoint records every setting (model and training, and the
// text trained on) in its metadata, so --resume and --generate read them back: only
// flags given again on the command line override them.
#ifndef TINY_LM_OPTIONS_H
#define TINY_LM_OPTIONS_H

#include "model.h"

typedef struct {
    lm_config model;
    const char *data, *out, *save, *resume, *generate, *prompt;
    int steps, batch, warmup, eval_every, eval_batches, threads, sample_len;
    double lr, min_lr, weight_decay, clip, beta2, valid_fraction;
    ag_sample_config sampling;
    uint64_t seed;
    bool data_given;  // --data on the command line, not from the checkpoint
    bool bf16;        // products in bfloat16 (autocast)
} options;

// Reads the flags, and the settings of --resume's or --generate's checkpoint (whose
// sizes must be those of the tensors it holds). Exits after printing --help (status
// 0), after one line on what it refuses (status 2), and under mpirun when the ranks
// were started with other flags than rank 0 (dist_agree_flags).
void options_parse(options *o, int argc, char **argv);
// The settings, and `data_text` (text_fingerprint) under "data-text", as
// NULL-terminated key, value pairs for ag_checkpoint_save (static storage, valid
// until the next call).
const char *const *options_meta(const options *o, const char *data_text);

#endif
