// The copy task's checkpoints: the model, Adam's state and where the run stands,
// under the description of the run's settings, so that --resume continues exactly
// the run that was saved (or refuses).
#ifndef COPY_TASK_CHECKPOINT_H
#define COPY_TASK_CHECKPOINT_H

#include "model.h"

// Steps between two early-stopping validations that did not stop; a run starts
// with its last check at -COOLDOWN.
#define COOLDOWN 10
// The most --steps and --finetune-steps allow: a checkpoint's counts too.
#define STEPS_MAX 100000000

// Decimal digits with an optional '-', all of s, in [lo, hi] (into *out): no spaces,
// no '+', no trailing text, nothing strtol would quietly clamp. For flags and metadata.
bool int_in_range(const char *s, long lo, long hi, int *out);

typedef struct {
    int step;        // training steps taken (each one Adam step)
    int last_check;  // the step of the last early-stopping validation
    int pruned;      // heads pruned after training, 0 if none: the run is then over
    int finetuned;   // fine-tuning steps taken after pruning (each one step of a new Adam)
    int heads[MAX_LAYERS];  // when pruned: the heads left in each layer
} run_state;

// Writes the checkpoint (atomically: a failure leaves the file as it was). `run`
// describes the settings ("task=copy length=16 ..."); the metadata holds it and rs.
bool run_save(const char *path, const model *m, ag_optim *opt, const char *run,
              const run_state *rs, ag_err *err);

// Reads what a checkpoint says about its run into rs, before any model is built (a
// pruned model must be built with its heads): the settings must be `run`, every count an
// integer in range; layers and heads are the settings' own.
bool run_read(const char *path, const char *run, int layers, int heads, run_state *rs,
              ag_err *err);

// Loads the model and Adam's state that run_read described into m (built with
// rs->heads when pruned) and opt; Adam's step count must be the run's, every value finite.
bool run_load(const char *path, model *m, ag_optim *opt, const run_state *rs, ag_err *err);

#endif
