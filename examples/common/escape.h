// Text a user typed, quoted in a one-line error: printed raw, a newline in it split the
// line in two, and half a UTF-8 character printed as garbage.
#ifndef EXAMPLES_ESCAPE_H
#define EXAMPLES_ESCAPE_H

#include <stddef.h>

// The first `max` bytes of s as a C string literal writes them: a newline as \n, a tab as
// \t, quotes and the backslash escaped, any other byte that is not printable ASCII as
// \xNN. Into buf (`size` bytes, ending early rather than overflowing); returns buf.
const char *escaped(const char *s, size_t max, char *buf, size_t size);

#endif
