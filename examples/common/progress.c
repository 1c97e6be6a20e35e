#define _POSIX_C_SOURCE 200809L  // clock_gettime, fileno
#include "progress.h"

#include <stdarg.h>
#include <time.h>
#include <unistd.h>

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool progress_start(progress *p, int first_step, int last_step, const char *prefix,
                    const char *csv_header) {
    *p = (progress){first_step, last_step, now_seconds(), isatty(fileno(stdout)) == 1, NULL};
    if (!prefix) return true;
    char csv_path[1024];
    snprintf(csv_path, sizeof csv_path, "%s.csv", prefix);
    p->csv = fopen(csv_path, "w");
    if (!p->csv) return false;
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
    printf(" | %d:%02d left%s", (int)left / 60, (int)left % 60, p->tty && !force ? "" : "\n");
    fflush(stdout);
}

void progress_csv(progress *p, const char *fmt, ...) {
    if (!p->csv) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->csv, fmt, ap);
    va_end(ap);
    fputc('\n', p->csv);
}

void progress_end(progress *p) {
    if (p->tty) printf("\n");
    if (p->csv) fclose(p->csv);
    p->csv = NULL;
}
