// The one-line messages of the dataset functions: "<path>:<line>: <problem>"
// (or "<path>: <problem>" when no line is involved), cut to fit an ag_err.
#include <stdarg.h>
#include <stdio.h>

#include "seqdata_internal.h"

int agi_seq_vfail(ag_err *err, const char *path, long line, const char *fmt, va_list ap) {
    if (!err) return -1;
    char what[sizeof err->msg];
    vsnprintf(what, sizeof what, fmt, ap);
    const char *p = path ? path : "(null)";
    int n = line > 0 ? snprintf(err->msg, sizeof err->msg, "%s:%ld: ", p, line)
                     : snprintf(err->msg, sizeof err->msg, "%s: ", p);
    if (n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, "%s", what);
    return -1;
}

int agi_seq_fail(ag_err *err, const char *path, long line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    agi_seq_vfail(err, path, line, fmt, ap);
    va_end(ap);
    return -1;
}
