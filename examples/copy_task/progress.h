// Training progress: a live line on a terminal, plain periodic lines
// otherwise, and a CSV of every step.
#ifndef COPY_TASK_PROGRESS_H
#define COPY_TASK_PROGRESS_H

#include <stdbool.h>
#include <stdio.h>

typedef struct {
    bool tty;
    int first_step, max_steps, every;
    double start;  // seconds
    FILE *csv;
} progress;

double now_seconds(void);
// csv_path may be NULL (no CSV). A resumed run (first_step > 0) continues the CSV,
// dropping any rows after first_step. Returns false if the CSV cannot be written.
bool progress_start(progress *p, int first_step, int max_steps, const char *csv_path);
// valid_acc < 0 means "not evaluated at this step".
void progress_step(progress *p, int step, double loss, double acc, double valid_acc);
// Writes out the CSV's rows so far: before a checkpoint, so that the file holds every
// step up to it even if the run is killed afterwards.
void progress_flush(progress *p);
// Safe to call twice.
void progress_end(progress *p);

#endif
