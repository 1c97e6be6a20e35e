// The one-line messages of the dataset functions: "<path>:<line>: <problem>"
// (or "<path>: <problem>" when no line is involved), cut to fit an ag_err;
// and memory, whose exhaustion ends the program as it does in attograd.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "seqdata_internal.h"

int seq_vfail(ag_err *err, const char *path, long line, const char *fmt, va_list ap) {
    if (!err) return -1;
    char what[sizeof err->msg];
    vsnprintf(what, sizeof what, fmt, ap);
    const char *p = path ? path : "(null)";
    // A long path (up to PATH_MAX, or past it) filled the line, and the problem was cut
    // off: past 200 bytes its first 80 and its last 100, the file's name, are kept (the
    // library's loaders show a path so too).
    const size_t len = strlen(p);
    const int head = len > 200 ? 80 : (int)len;
    const char *tail = len > 200 ? p + len - 100 : "", *cut = len > 200 ? "..." : "";
    int n = line > 0 ? snprintf(err->msg, sizeof err->msg, "%.*s%s%s:%ld: ", head, p, cut, tail,
                                line)
                     : snprintf(err->msg, sizeof err->msg, "%.*s%s%s: ", head, p, cut, tail);
    if (n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, "%s", what);
    return -1;
}

int seq_fail(ag_err *err, const char *path, long line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    seq_vfail(err, path, line, fmt, ap);
    va_end(ap);
    return -1;
}

static void *check_alloc(void *p, size_t bytes) {
    if (!p) {
        fprintf(stderr, "seqdata: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

void *seq_malloc(size_t bytes) { return check_alloc(malloc(bytes ? bytes : 1), bytes); }
void *seq_calloc(size_t bytes) { return check_alloc(calloc(1, bytes ? bytes : 1), bytes); }
