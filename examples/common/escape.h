// Text a user typed, quoted in a one-line error: printed raw, a newline in it split the
// line in two, and half a UTF-8 character printed as garbage. And text in an SVG.
#ifndef EXAMPLES_ESCAPE_H
#define EXAMPLES_ESCAPE_H

#include <stddef.h>
#include <stdio.h>

// The first `max` bytes of s as a C string literal writes them: a newline as \n, a tab as
// \t, quotes and the backslash escaped, any other byte that is not printable ASCII as
// \xNN. Into buf (`size` bytes, ending early rather than overflowing); returns buf.
const char *escaped(const char *s, size_t max, char *buf, size_t size);

// Writes s and a newline to f, its control characters (below 0x20, and 0x7f) and the bytes
// that are not UTF-8 as \n, \t or \xNN, its UTF-8 characters as they are: an error line
// that holds a path or a name from a file stays one line of text.
void put_line(const char *s, FILE *f);

// Writes the first n bytes of s (up to its end) to f as XML text, for an SVG: <, > and &
// as entities, every other byte as it is.
void put_xml(const char *s, size_t n, FILE *f);

#endif
