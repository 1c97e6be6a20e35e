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
// prints which; false if k leaves a layer nothing or pruning fails.
bool heads_prune(model *m, const double *ablation, int k, FILE *f);

// Fine-tunes for `steps` steps with a new Adam (pruning repacks the parameters), batches
// drawn from `seed` on a stream of their own.
void heads_finetune(ag_tape *tp, model *m, const ag_seqdata *train, int batch_size, int steps,
                    double lr, uint64_t seed);

#endif
