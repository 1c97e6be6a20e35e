#define _POSIX_C_SOURCE 200809L  // clock_gettime, isatty, fileno
#include "progress.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A resumed run continues the CSV from its checkpoint's step: rows that a run wrote after
// that checkpoint (it was killed, or went on without saving) are dropped, so the file
// reads as if the run had never stopped. NULL if the file cannot be read and written.
static FILE *continue_csv(const char *path, int first_step) {
    FILE *f = fopen(path, "r+");
    if (!f) return NULL;
    char line[256];
    long keep = 0;  // where the first row after first_step begins
    while (fgets(line, sizeof line, f)) {
        bool row = line[0] >= '0' && line[0] <= '9';  // not the header
        // (A killed run may have left half a row.)
        if (!strchr(line, '\n') || (row && strtol(line, NULL, 10) > first_step)) break;
        keep = ftell(f);
    }
    if (keep < 0 || fflush(f) != 0 || ftruncate(fileno(f), keep) != 0 ||
        fseek(f, keep, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    return f;
}

bool progress_start(progress *p, int first_step, int max_steps, const char *csv_path) {
    p->tty = isatty(fileno(stdout));
    p->first_step = first_step;
    p->max_steps = max_steps;
    p->every = 50;
    p->start = now_seconds();
    p->csv = NULL;
    if (csv_path) {
        p->csv = first_step ? continue_csv(csv_path, first_step) : NULL;
        if (!p->csv) {
            if (first_step && errno != ENOENT) return false;
            if (!(p->csv = fopen(csv_path, "w"))) return false;
            fprintf(p->csv, "step,loss,accuracy,valid_accuracy\n");
        }
    }
    return true;
}

void progress_step(progress *p, int step, double loss, double acc, double valid_acc) {
    if (p->csv) {
        fprintf(p->csv, "%d,%.6f,%.6f,", step + 1, loss, acc);
        if (valid_acc >= 0) fprintf(p->csv, "%.6f", valid_acc);
        fputc('\n', p->csv);
    }
    int done = step + 1 - p->first_step;
    double elapsed = now_seconds() - p->start, rate = done / (elapsed > 0 ? elapsed : 1e-9);
    double eta = (p->max_steps - step - 1) / rate;
    if (p->tty) {
        printf("\rstep %5d/%d  loss %.4f  acc %.4f  %6.0f steps/s  ETA %5.1fs (at most) ", step + 1,
               p->max_steps, loss, acc, rate, eta);
        fflush(stdout);
    } else if ((step + 1) % p->every == 0 || valid_acc >= 0) {
        printf("step %d loss %.4f acc %.4f", step + 1, loss, acc);
        if (valid_acc >= 0) printf(" valid_acc %.4f", valid_acc);
        printf(" steps/s %.0f\n", rate);
    }
}

void progress_flush(progress *p) {
    if (p->csv) fflush(p->csv);
}

void progress_end(progress *p) {
    if (p->tty) printf("\n");
    if (p->csv) fclose(p->csv);
    p->csv = NULL;
    p->tty = false;  // ended once: a second call does nothing
}
