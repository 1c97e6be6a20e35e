// What every libFuzzer target here shares: a scratch file per process (the
// loaders under test read paths), and the rules every failure must follow.
#ifndef ATTOGRAD_FUZZ_COMMON_H
#define ATTOGRAD_FUZZ_COMMON_H

#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attograd.h"

static inline void fuzz_require(int ok, const char *target, const char *what) {
    if (!ok) {
        fprintf(stderr, "%s: %s\n", target, what);
        abort();
    }
}

// "<TMPDIR or /tmp>/attograd_fuzz_<pid>_<tag>": one per process and purpose,
// so parallel fuzzing jobs do not share files.
static inline const char *fuzz_path(const char *tag) {
    static char paths[4][512];
    static const char *tags[4];
    for (int i = 0; i < 4; i++) {
        if (tags[i] == tag) return paths[i];
        if (!tags[i]) {
            const char *dir = getenv("TMPDIR");
            snprintf(paths[i], sizeof paths[i], "%s/attograd_fuzz_%ld_%s",
                     dir && *dir ? dir : "/tmp", (long)getpid(), tag);
            tags[i] = tag;
            return paths[i];
        }
    }
    abort();
}

// Writes the input to the scratch file `tag` and returns its path.
static inline const char *fuzz_write(const char *tag, const uint8_t *data, size_t size) {
    const char *path = fuzz_path(tag);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

// A load failure: one line, naming the file it was given.
static inline void fuzz_check_message(const char *target, const ag_err *err, const char *path) {
    fuzz_require(strncmp(err->msg, path, strlen(path)) == 0, target,
                 "message does not name the file");
    fuzz_require(strchr(err->msg, '\n') == NULL, target, "message is not one line");
}

#endif
