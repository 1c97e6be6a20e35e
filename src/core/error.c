// Programming errors: one line naming the op and the shapes, to a handler that
// prints and aborts unless the user installed another. Failures on user data
// are not errors of the program: they go into an ag_err for the caller.
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void default_handler(const char *message, void *user) {
    (void)user;
    fprintf(stderr, "attograd: %s\n", message);
    abort();
}

// The process's handler and its user pointer, read and written as a pair under the lock:
// a user thread may install one while another (or a worker) reports.
static pthread_mutex_t handler_lock = PTHREAD_MUTEX_INITIALIZER;
static ag_error_handler handler = default_handler;
static void *handler_user;
// The calling thread's own handler, in place of the process's while set (agi_error_scope):
// ag_op_check records its ops' refusals there, and another thread's errors, reported
// meanwhile, still reach the process's handler and not that check's record.
static _Thread_local agi_error_scope scope;
// Errors reported on this thread, and by the pool's workers in the jobs this thread
// posted (agi_errors_credit): another thread's errors are not this one's.
static _Thread_local unsigned long reported;

unsigned long agi_errors_reported(void) { return reported; }

void agi_errors_credit(unsigned long n) { reported += n; }

agi_error_scope agi_error_scope_set(agi_error_scope s) {
    const agi_error_scope old = scope;
    scope = s;
    return old;
}

agi_error_scope agi_error_scope_now(void) { return scope; }

ag_error_handler ag_error_handler_set(ag_error_handler h, void *user) {
    pthread_mutex_lock(&handler_lock);
    ag_error_handler old = handler;
    handler = h ? h : default_handler;
    handler_user = h ? user : NULL;
    pthread_mutex_unlock(&handler_lock);
    return old == default_handler ? NULL : old;
}

// A name or a path holding a newline would split the message: it is escaped.
void ag_verror(const char *fmt, va_list ap) {
    char raw[512], msg[512];
    vsnprintf(raw, sizeof raw, fmt, ap);
    agi_escape_into(msg, sizeof msg, raw);
    reported++;
    ag_error_handler h = scope.fn;
    void *user = scope.user;
    if (!h) {
        pthread_mutex_lock(&handler_lock);
        h = handler;
        user = handler_user;
        pthread_mutex_unlock(&handler_lock);
    }
    h(msg, user);
}

void ag_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ag_verror(fmt, ap);
    va_end(ap);
}

bool agi_err_set(ag_err *err, const char *fmt, ...) {
    if (!err) return false;
    char raw[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    return agi_escape_into(err->msg, sizeof err->msg, raw) && n >= 0 && (size_t)n < sizeof raw;
}

const char *agi_path_shown(const char *path, char buf[AGI_PATH_SHOWN_SIZE]) {
    const size_t n = strlen(path);
    if (n <= 200) return path;
    snprintf(buf, AGI_PATH_SHOWN_SIZE, "%.80s...%s", path, path + n - 100);
    return buf;
}

bool agi_given(const void *p, const char *fn, const char *what) {
    if (!p) ag_error("%s: the %s is NULL", fn, what);
    return p != NULL;
}
