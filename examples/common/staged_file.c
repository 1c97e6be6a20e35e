// A file written whole or not at all (staged_file.h).
#define _POSIX_C_SOURCE 200809L  // open_memstream
#include "staged_file.h"

#include <stdlib.h>

FILE *staged_open(staged_file *s, const char *path, ag_err *err) {
    s->text = NULL;
    s->len = 0;
    s->f = open_memstream(&s->text, &s->len);
    if (!s->f) snprintf(err->msg, sizeof err->msg, "%.400s: out of memory to draw it", path);
    return s->f;
}

bool staged_commit(staged_file *s, const char *path, ag_err *err) {
    const bool clean = !ferror(s->f), drawn = fclose(s->f) == 0 && clean;
    ag_file_writer *w = drawn ? ag_file_writer_open(path, err) : NULL;
    if (!drawn) snprintf(err->msg, sizeof err->msg, "%.400s: out of memory to draw it", path);
    if (w) ag_file_writer_write(w, s->text, s->len);
    free(s->text);
    s->text = NULL;
    return w && ag_file_writer_commit(w, err) == 0;
}
