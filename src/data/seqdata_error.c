// The one-line messages of the dataset functions: "<path>:<line>: <problem>"
// (or "<path>: <problem>" when no line is involved), cut to fit an ag_err.
#include <stdarg.h>
#include <stdio.h>

#include "task.h"

int agi_seq_fail(ag_err *err, const char *path, long line, const char *fmt, ...) {
    if (!err) return -1;
    char what[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *p = path ? path : "(null)";
    int n = line > 0 ? snprintf(err->msg, sizeof err->msg, "%s:%ld: ", p, line)
                     : snprintf(err->msg, sizeof err->msg, "%s: ", p);
    if (n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, "%s", what);
    return -1;
}
