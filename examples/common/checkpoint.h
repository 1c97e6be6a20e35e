// Training checkpoints for the examples. Loading one to go on from, refusing what
// would not continue the run: a parameter that is not finite (it would turn every
// step into NaN, or abort a sampler), a step count outside [0, last_step] (a schedule
// cannot take it). Saving one from a data-parallel run: rank 0 writes it, and every
// rank learns whether it could.
#ifndef EXAMPLES_CHECKPOINT_H
#define EXAMPLES_CHECKPOINT_H

#include <attograd.h>

// Loads `path` into ps and, when opt is not NULL, into the optimizer (its step count
// in [0, last_step]); *file (when file is not NULL) receives the file, for its
// metadata (free it). False with one line in err (after a refusal, ps and opt hold
// the file's values: do not train on), and *file NULL.
bool checkpoint_load_checked(ag_params *ps, ag_optim *opt, const char *path, int last_step,
                             ag_safetensors **file, ag_err *err);

// ag_checkpoint_save on rank 0 (atomic: a failure leaves the file as it was), checked
// on every rank (dist_check): a failure ends the run with one line and `status`.
void checkpoint_save_everywhere(const ag_params *ps, ag_optim *opt, const char *path,
                                const char *const meta[], int status);

// Whether a checkpoint (or any file a run writes at its end) can be written at `path`:
// its directory exists and takes a new file, and the name is not a directory or a
// device. False with one line in err naming `flag` ("--save x/y: the directory x: No
// such file or directory"). Asked before training, so that a run does not train for
// an hour to find out.
bool checkpoint_path_usable(const char *flag, const char *path, ag_err *err);

#endif
