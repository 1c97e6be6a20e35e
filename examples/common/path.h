// A file written beside another (out.dot's page is out.html, its picture out.svg), and
// the files of a run told apart.
#ifndef EXAMPLES_PATH_H
#define EXAMPLES_PATH_H

#include <stdbool.h>
#include <stddef.h>

#include <attograd.h>

// out = path without its extension `ext` (when it ends in it) followed by `suffix`:
// path_beside(out, n, "run/a.dot", ".dot", ".html") gives "run/a.html". False, with out
// empty, when the result would not fit in `size` bytes (a cut name would write elsewhere).
bool path_beside(char *out, size_t size, const char *path, const char *ext, const char *suffix);

// A file a run reads or writes, named by the flag that gives it (path NULL: not given).
// `may_be` names the one flag whose file it may be: --save of --resume's checkpoint,
// which continues a run in place.
typedef struct {
    const char *flag, *path;
    bool writes;
    const char *may_be;
} run_file;

// False, with one line in err, when a file the run writes is also a file it reads or
// another it writes, by the same name or another ("./a", a link): writing it would destroy
// the other ("tiny_lm --data d.txt --save d.txt" put a checkpoint where the text was).
bool run_files_distinct(const run_file *files, int n, ag_err *err);

// False, with one line in err, when a file the run writes goes in `dir` (given by
// `dir_flag`), a directory whose every file the run reads: "tiny_lm --data . --save
// lm.st" made its checkpoint, CSV and plot text of the next run, and --resume lm.st
// refused that text as changed. True when dir is NULL or not a directory.
bool run_files_outside(const run_file *files, int n, const char *dir_flag, const char *dir,
                       ag_err *err);

#endif
