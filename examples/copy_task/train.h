// Data, batches, training steps and evaluation for the copy-task example.
#ifndef COPY_TASK_TRAIN_H
#define COPY_TASK_TRAIN_H

#include <stdio.h>

#include "model.h"
#include "options.h"
#include "seqdata.h"

// The pcg32 streams of --seed, one for each use, so that none draws another's numbers:
// ASCII names ("batch"), with room below for a step's own stream.
#define STREAM_BATCH UINT64_C(0x6261746368000000)     // "batch" + step: its training batch
#define STREAM_FINETUNE UINT64_C(0x66696e65000000)    // "fine" + step: a fine-tuning batch
#define STREAM_SPLITS 100  // + 0, 1, 2: the generated train, valid and test splits
#define STREAM_LONGER 103  // the generated test split of --test-length
// A step's dropout seed is --seed times a prime, plus the step: another seed at every
// step and for every --seed; training and fine-tuning use two primes.
#define DROPOUT_PRIME_TRAIN 1000003u
#define DROPOUT_PRIME_FINETUNE 7919u

typedef struct {
    ag_seqdata *train, *valid, *test;
    ag_seqdata *longer;  // --test-length: a test split of that length, or NULL
    bool generated;      // generated from --seed, at another length than the committed one
} splits;

// Loads <o->data>/<task>/{train,valid,test}.txt when their length is --length, and
// otherwise generates the three splits from --seed (one pcg32 stream each); with
// --test-length, generates a longer test split too. Returns false with one line in err.
bool splits_load(splits *s, const options *o, ag_err *err);
void splits_free(splits *s);
// Under mpirun: every rank read the same sequences (dist_agree_data).
void splits_agree(const splits *s);

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

// Room for `cap` sequences of d; false, with nothing allocated, when the memory cannot be
// had.
bool batch_init(batch *b, const ag_seqdata *d, int cap, bool cross);
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
    bool blame;                  // this rank is one to report a non-finite loss or gradient
                                 // (see dist_combine)
} step_result;

// Whether the step's loss or gradient was not finite: the same on every rank.
bool step_failed(const step_result *r);
// After a step on every rank: a failed step ends the run (exit status 1) with one line
// ("step 12: the loss is inf; stopped without saving"; `which` and `n` name the step,
// `saving` whether a save was due).
void step_check(const step_result *r, const char *which, int n, bool saving);

// What training and fine-tuning steps and evaluations need, made once.
typedef struct {
    ag_data_parallel *dp;  // --threads: each takes a slice of this rank's sequences
    ag_tape *tp;           // evaluation's (the steps' threads have tapes of their own)
    batch b;               // this rank's sequences of a training batch
    int *indices;          // the whole batch's sequences
    int batch_size;        // the whole batch (all ranks)
    int first, count;      // this rank's part of it
    bool cross;
    ag_autocast autocast;  // --bf16: every tape's, evaluation's included
} trainer;

trainer trainer_new(model *m, const ag_seqdata *train, int batch_size, ag_autocast autocast);
void trainer_free(trainer *t);

// A training step on a batch of `train` drawn from rng (every rank draws the whole
// batch and takes its part): forward, cross-entropy, backward on the threads, the
// gradients combined over the ranks, then the Adam step. The result is the whole
// batch's on every rank. A non-finite loss or gradient skips the Adam step: the
// parameters stay as they were.
step_result trainer_step(trainer *t, model *m, ag_optim *opt, const ag_seqdata *train,
                         ag_pcg32 *rng, uint64_t dropout_seed);

// Times a forward and backward on t's training batch op by op and prints the table;
// leaves the parameters and the optimizer as they were.
void profile_step(trainer *t, model *m, FILE *f);

typedef struct {
    double token_acc, seq_acc;
} eval_result;

// Accuracy on a whole split, in no-grad mode on tp, in batches of EVAL_BATCH (on several
// processes, each evaluates its part and the counts are summed).
#define EVAL_BATCH 256
eval_result evaluate(ag_tape *tp, const model *m, const ag_seqdata *d);

#endif
