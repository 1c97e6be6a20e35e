// A file written beside another: out.dot's page is out.html, its picture out.svg.
#ifndef EXAMPLES_PATH_H
#define EXAMPLES_PATH_H

#include <stdbool.h>
#include <stddef.h>

// out = path without its extension `ext` (when it ends in it) followed by `suffix`:
// path_beside(out, n, "run/a.dot", ".dot", ".html") gives "run/a.html". False, with out
// empty, when the result would not fit in `size` bytes (a cut name would write elsewhere).
bool path_beside(char *out, size_t size, const char *path, const char *ext, const char *suffix);

#endif
