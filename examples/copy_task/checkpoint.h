// The copy task's checkpoints: the model, Adam's state and where the run stands,
// under the settings that decide the run's numbers (options_meta), so that --resume
// continues exactly the run that was saved (or refuses).
#ifndef COPY_TASK_CHECKPOINT_H
#define COPY_TASK_CHECKPOINT_H

#include "model.h"
#include "options.h"

// Steps between two early-stopping validations that did not stop; a run starts
// with its last check at -COOLDOWN.
#define COOLDOWN 10

typedef struct {
    int step;        // training steps taken (each one Adam step)
    int last_check;  // the step of the last early-stopping validation
    int pruned;      // heads pruned after training, 0 if none: the run is then over
    int finetuned;   // fine-tuning steps taken after pruning (each one step of a new Adam)
    int heads[MAX_LAYERS];  // when pruned: the heads left in each layer
} run_state;

// Rank 0 writes the checkpoint to --save (atomically: a failure leaves the file as it
// was); the metadata holds the settings and rs. Every rank learns whether it went
// well: a failure ends the run with one line (dist_check).
void run_save(const options *o, const model *m, ag_optim *opt, const run_state *rs);

// Reads what --resume's checkpoint says about its run into rs, before any model is
// built (a pruned model must be built with its heads): the settings must be o's, every
// count an integer in range, a pruned model must fit --prune and --analyze-heads, and a
// learned position table must have the `pos_rows` rows this run needs (0: no table).
// False with one line in err.
bool run_read(const options *o, run_state *rs, int pos_rows, ag_err *err);

// Loads the model and Adam's state that run_read described into m (built with
// rs->heads when pruned) and opt; Adam's step count must be the run's, every value finite.
bool run_load(const char *path, model *m, ag_optim *opt, const run_state *rs, ag_err *err);

#endif
