// Text that came from a user (tensor and parameter names, paths) in a line of output: a
// control byte (a newline, a carriage return, a tab, an escape sequence) is written as a C
// escape ("\n", "\x1b"), so that an error stays one line and a listing one line a node.
// Other bytes, UTF-8 included, are written as they are.
#include <stdio.h>
#include <string.h>

#include "internal.h"

// The escape of byte c, or NULL when it is written as it is.
static const char *escape_of(unsigned char c, char buf[5]) {
    if (c >= 0x20 && c != 0x7f) return NULL;
    if (c == '\n') return "\\n";
    if (c == '\r') return "\\r";
    if (c == '\t') return "\\t";
    snprintf(buf, 5, "\\x%02x", c);
    return buf;
}

bool agi_escape_into(char *dst, size_t size, const char *src) {
    if (!size) return !*src;
    size_t at = 0;
    for (; *src; src++) {
        char buf[5];
        const char *e = escape_of((unsigned char)*src, buf);
        const size_t n = e ? strlen(e) : 1;
        if (at + n >= size) {  // a whole escape or none
            dst[at] = 0;
            return false;
        }
        if (e) memcpy(dst + at, e, n);
        else dst[at] = *src;
        at += n;
    }
    dst[at] = 0;
    return true;
}

void agi_fput_escaped(const char *s, FILE *f) {
    for (; *s; s++) {
        char buf[5];
        const char *e = escape_of((unsigned char)*s, buf);
        if (e) fputs(e, f);
        else fputc(*s, f);
    }
}
