// What a training run reports, one call per step: the progress line (train and
// validation loss in one unit, tokens/s, time left), a CSV row, and the points of
// the loss curves; at the end, their SVG plot. With prefix NULL (the other processes
// of a data-parallel run) nothing is written to files.
#ifndef EXAMPLES_TRAIN_LOG_H
#define EXAMPLES_TRAIN_LOG_H

#include "plot.h"
#include "progress.h"

typedef struct {
    progress p;
    loss_curves curves;
    const char *prefix, *unit;
    double valid;  // the last validation loss, shown until the next
    bool ended;
} train_log;

// Steps [first, last); writes <prefix>.csv: step,train_<u>,valid_<u>,lr,tokens_per_s
// (u: `unit` up to its '/': "bits/byte" gives train_bits). False with one line in err
// if the CSV cannot be made.
bool train_log_start(train_log *l, int first, int last, const char *prefix, const char *unit,
                     ag_err *err);
// A validation loss measured before step `first` trains (the curve's starting point).
void train_log_valid(train_log *l, int first, double valid);
// After step `step` (0-based): its training loss, whether a validation loss was measured
// after it and which (a NaN measured is shown as one), the learning rate and the training
// tokens/s.
void train_log_step(train_log *l, int step, double train, bool validated, double valid,
                    double lr, double tps);
// Ends the line and the CSV; with a title, writes <prefix>.svg. Frees the curves. Once
// (later calls do nothing and return true). Returns false, with err naming the file, when
// a row of the CSV (a full disk) or the plot could not be written (an earlier plot then
// stays as it was); the plot is drawn either way.
bool train_log_end(train_log *l, const char *title, ag_err *err);

#endif
