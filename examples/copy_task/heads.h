// What each attention head of a trained copy-task model does, how much it matters,
// and pruning the least important ones (--analyze-heads, --prune K).
#ifndef COPY_TASK_HEADS_H
#define COPY_TASK_HEADS_H

#include <stdio.h>

#include "checkpoint.h"
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

// Fine-tunes for --finetune-steps steps with `opt`, a new Adam (pruning repacks the
// parameters), batches drawn from --seed on a stream of their own (on several
// processes, each rank trains on its slice of every batch, as in training). A step
// whose loss or gradient is not finite ends the run (step_check).
void heads_finetune(trainer *t, model *m, ag_optim *opt, const ag_seqdata *train,
                    const options *o);

// --analyze-heads and --prune, after training: the head table; then pruning and
// fine-tuning (with a new Adam, in *opt) with the held-out accuracy at each stage, and
// the pruned model saved to --save with its heads (rs, the state of the run, says so).
// `prune` says whether to prune.
void heads_after_training(trainer *t, model *m, ag_optim **opt, const splits *data,
                          const options *o, bool prune, run_state *rs);

#endif
