#define _POSIX_C_SOURCE 200809L  // fileno, ftruncate
#include "progress.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "path.h"

// The CSV at path, cut after the row of step first_step, open for the rows after it;
// NULL if it cannot be read and written (errno says why: ENOENT, there is none). A file
// that held nothing to keep (a run killed before its first rows were flushed leaves it
// empty) starts again with its header: the rows were continued under none.
static FILE *continue_csv(const char *path, int first_step, const char *csv_header) {
    FILE *f = fopen(path, "r+e");  // close-on-exec, as below
    if (!f) return NULL;
    char line[256];
    long keep = 0;  // where the first row after first_step begins
    while (fgets(line, sizeof line, f)) {
        bool row = line[0] >= '0' && line[0] <= '9';  // not the header
        bool whole = strchr(line, '\n') != NULL;      // a killed run may have left half a row
        if (!whole || (row && strtol(line, NULL, 10) > first_step)) break;
        keep = ftell(f);
    }
    if (keep < 0 || fflush(f) != 0 || ftruncate(fileno(f), keep) != 0 ||
        fseek(f, keep, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    if (keep == 0) fprintf(f, "%s\n", csv_header);
    return f;
}

// The one message of both ends: the file, and why (errno). A path too long for the line
// keeps its beginning and its end, the file's name.
static bool csv_error(const progress *p, ag_err *err) {
    if (!err) return false;
    const char *path = p->csv_path;
    const size_t n = strlen(path);
    if (n <= 400)
        snprintf(err->msg, sizeof err->msg, "cannot write %.400s: %s", path, strerror(errno));
    else
        snprintf(err->msg, sizeof err->msg, "cannot write %.200s...%.200s: %s", path,
                 path + n - 200, strerror(errno));
    return false;
}

bool progress_start(progress *p, int first_step, int last_step, const char *prefix,
                    const char *csv_header, ag_err *err) {
    *p = (progress){.first_step = first_step, .last_step = last_step, .start = now_seconds(),
                    .tty = isatty(fileno(stdout)) == 1};
    if (!prefix) return true;
    if (!path_beside(p->csv_path, sizeof p->csv_path, prefix, "", ".csv")) {
        // cut, it would have written elsewhere: named as asked, as far as it goes
        snprintf(p->csv_path, sizeof p->csv_path, "%.*s.csv", (int)sizeof p->csv_path - 5,
                 prefix);
        errno = ENAMETOOLONG;
        return csv_error(p, err);
    }
    if (first_step > 0) {
        p->csv = continue_csv(p->csv_path, first_step, csv_header);
        if (p->csv) return true;
        if (errno != ENOENT) return csv_error(p, err);
    }
    // Close-on-exec ("e"): open for the whole run, the CSV went into every program the
    // process started meanwhile, which could hold it open (or write it) past the run.
    p->csv = fopen(p->csv_path, "we");
    if (!p->csv) return csv_error(p, err);
    fprintf(p->csv, "%s\n", csv_header);
    return true;
}

void progress_line(progress *p, int step, bool force, const char *fmt, ...) {
    int done = step + 1 - p->first_step, todo = p->last_step - p->first_step;
    int every = todo >= 10 ? todo / 10 : 1;
    if (!p->tty && !force && done % every != 0 && step + 1 != p->last_step) return;
    double elapsed = now_seconds() - p->start;
    double left = done > 0 ? elapsed / done * (p->last_step - step - 1) : 0;
    printf("%sstep %d/%d | ", p->tty ? "\r\033[K" : "", step + 1, p->last_step);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    // In double: (int)left was undefined past 2^31 s (a long run of slow steps), and x86
    // printed INT_MIN's minutes, "-35791394:-08 left".
    printf(" | %.0f:%02d left%s", floor(left / 60), (int)fmod(left, 60),
           p->tty && !force ? "" : "\n");
    fflush(stdout);
}

// Keeps the first write error of the CSV (its errno) for progress_end.
static void csv_failed(progress *p) {
    if (!p->csv_errno) p->csv_errno = errno ? errno : EIO;
}

void progress_csv(progress *p, const char *fmt, ...) {
    if (!p->csv) return;
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    const bool ok = vfprintf(p->csv, fmt, ap) >= 0 && fputc('\n', p->csv) != EOF;
    va_end(ap);
    if (!ok) csv_failed(p);
}

void progress_flush(progress *p) {
    errno = 0;
    if (p->csv && fflush(p->csv) != 0) csv_failed(p);
}

bool progress_end(progress *p, ag_err *err) {
    if (p->tty) printf("\n");
    p->tty = false;  // ended once: a second call does nothing
    if (p->csv) {
        // The stream's error flag too: a row whose buffer met the full disk in an
        // earlier call leaves fclose nothing to fail on.
        const bool failed = ferror(p->csv) != 0;
        errno = 0;
        if (fclose(p->csv) != 0 || failed) csv_failed(p);
    }
    p->csv = NULL;
    if (!p->csv_errno) return true;
    errno = p->csv_errno;
    return csv_error(p, err);
}
