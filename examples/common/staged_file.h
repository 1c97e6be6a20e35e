// A file written whole or not at all: its text is drawn into memory, then replaces the
// file in one rename (ag_file_writer, io.h). A write that fails (a full disk, a size
// limit) leaves the file as it was, an earlier run's picture included, where writing in
// place left it cut short.
#ifndef EXAMPLES_STAGED_FILE_H
#define EXAMPLES_STAGED_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <attograd.h>

typedef struct {
    FILE *f;  // where the text is drawn (a memory stream)
    char *text;
    size_t len;
} staged_file;

// Opens the memory stream: s->f, or NULL (out of memory, said in err, naming path).
FILE *staged_open(staged_file *s, const char *path, ag_err *err);
// Closes the stream and writes its text to path, replacing the file. Returns false
// with err naming path when either failed (the file then unchanged).
bool staged_commit(staged_file *s, const char *path, ag_err *err);

#endif
