// Data, batches, training steps and evaluation for the copy-task example.
#ifndef COPY_TASK_TRAIN_H
#define COPY_TASK_TRAIN_H

#include <stdio.h>

#include "dist_hooks.h"
#include "model.h"
#include "seqdata.h"

typedef struct {
    ag_seqdata *train, *valid, *test;
} splits;

// Loads dir/<task>/{train,valid,test}.txt when their length matches `length`,
// and otherwise generates the three splits from `seed` (one pcg32 stream
// each). Returns false with a message in err.
bool splits_load(splits *s, const char *dir, ag_task task, int length, uint64_t seed,
                 bool *generated, ag_err *err);
void splits_free(splits *s);

// One batch of next-token pairs, in the layout the model wants.
typedef struct {
    int cap;           // sequences the buffers hold
    int B, T, S;       // B: sequences filled; T: positions predicted; S: source positions
    int32_t *ids;      // [B, T] decoder-only inputs, or the decoder inputs (cross)
    int32_t *targets;  // [B, T], AG_IGNORE_INDEX where not scored
    int32_t *source;   // [B, S] (cross only)
    int32_t *gather;   // scratch: the batch's sequences
    long *seq_stats;   // scratch: per sequence, scored positions, correct ones, all right
} batch;

void batch_init(batch *b, const ag_seqdata *d, int cap, bool cross);
void batch_free(batch *b);
// Fills b with n <= cap sequences of d: first..first+n-1, or the ones listed
// in `indices` when it is not NULL.
void batch_fill(batch *b, const ag_seqdata *d, int first, const int *indices, int n, bool cross);

// Counts scored positions and correct argmax predictions in logits [B, T, V].
void count_correct(const ag_tensor *logits, const batch *b, long *scored, long *correct,
                   long *seqs_right);

typedef struct {
    double loss;
    double accuracy;             // token accuracy on the batch's scored positions
    const ag_tensor *bad_grad;   // the first parameter with a NaN or inf gradient
    bool mine;                   // on several processes: this rank reports a non-finite
                                 // loss or gradient (see dist_combine_step)
} step_result;

// Forward, cross-entropy, backward on the threads of dp (made for m's parameters; each
// thread a slice of the batch on a tape of its own, see attograd/data_parallel.h), then
// the Adam step. On several processes b is this rank's slice, and the result is the whole
// batch's. A non-finite loss or gradient (bad_grad) skips the Adam step: the parameters
// stay as they were.
step_result train_step(ag_data_parallel *dp, model *m, ag_optim *opt, const batch *b,
                       uint64_t dropout_seed);

// Times a forward and backward on b op by op and prints the table; leaves the
// parameters and the optimizer as they were.
void profile_step(ag_tape *tp, model *m, const batch *b, FILE *f);

typedef struct {
    double token_acc, seq_acc;
} eval_result;

// Accuracy on a whole split, in no-grad mode, in batches of scratch->cap
// (on several processes, each evaluates its part and the counts are summed).
eval_result evaluate(ag_tape *tp, const model *m, const ag_seqdata *d, batch *scratch);

#endif
