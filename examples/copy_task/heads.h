// What each attention head of a trained copy-task model does, how much it matters,
// and pruning the least important ones (--analyze-heads, --prune K).
#ifndef COPY_TASK_HEADS_H
#define COPY_TASK_HEADS_H

#include <stdio.h>

#include "train.h"

// Prints, for each layer's (decoder) attention, the head table (entropy, distance,
// strongest pair, on the first validation sequences) with both importance scores over
// the validation split. gradient and ablation receive layers * heads scores.
bool heads_analyze(ag_tape *tp, model *m, const ag_seqdata *valid, FILE *f, double *gradient,
                   double *ablation);

// Prunes the k heads with the lowest ablation importance (every layer keeps one) and
// prints which; false (printing nothing) if k would leave a layer with no head, or if
// pruning fails.
bool heads_prune(model *m, const double *ablation, int k, FILE *f);

// Fine-tunes for `steps` steps with `opt`, a new Adam (pruning repacks the parameters),
// batches drawn from `seed` on a stream of their own (on several processes, each rank
// trains on its slice of every batch, as in training). Returns the steps done: `steps`,
// or fewer if a step's loss or gradient was not finite, whose result is then in *failed
// (that step was not taken: the parameters are the ones before it).
int heads_finetune(ag_data_parallel *dp, model *m, ag_optim *opt, const ag_seqdata *train,
                   int batch_size, int steps, uint64_t seed, step_result *failed);

#endif
