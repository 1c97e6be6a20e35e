// Training progress: one live line on a terminal (rewritten in place), plain
// lines otherwise, each ending with the time left (ETA) at the rate so far;
// and a CSV file the program writes rows to, one a step, which a resumed run
// continues.
#ifndef EXAMPLES_PROGRESS_H
#define EXAMPLES_PROGRESS_H

#include <stdbool.h>
#include <stdio.h>

#include <attograd.h>

typedef struct {
    int first_step, last_step;  // the steps this run takes: [first_step, last_step)
    double start;               // seconds (now_seconds)
    bool tty;
    FILE *csv;
    int csv_errno;  // the first failed write of the CSV's (0: none)
    char csv_path[1024];
} progress;

// Writes the CSV to <prefix>.csv (prefix NULL: no CSV), whose rows start with the
// 1-based step. A resumed run (first_step > 0) continues the CSV it finds there: the
// rows after first_step (a run killed, or one that went on without saving) are
// dropped, so that the file reads as if the run had never stopped. Returns false,
// with err ("cannot write <prefix>.csv: <why>"), if the CSV cannot be made.
bool progress_start(progress *p, int first_step, int last_step, const char *prefix,
                    const char *csv_header, ag_err *err);
// "step 120/2000 | <fmt...> | 0:42 left"; on a terminal the line is rewritten,
// elsewhere it is printed when `force` or every 10% of the run.
void progress_line(progress *p, int step, bool force, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
void progress_csv(progress *p, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
// Writes out the CSV's rows so far: before a checkpoint, so that the file holds every
// step up to it even if the run is killed afterwards.
void progress_flush(progress *p);
// Ends the live line and closes the CSV (once: a second call does nothing and returns
// true). False, with err as progress_start's (err NULL: no message wanted), if a row of
// the CSV was not written in full: a full disk lost the rows without a word, and the run
// said it wrote the file and exited 0.
bool progress_end(progress *p, ag_err *err);

#endif
