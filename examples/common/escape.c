#include "escape.h"

#include <stdio.h>

const char *escaped(const char *s, size_t max, char *buf, size_t size) {
    size_t at = 0;
    if (size == 0) return buf;
    buf[0] = '\0';
    for (size_t i = 0; s[i] && i < max && at + 5 <= size; i++) {  // \xNN and the end
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') at += (size_t)snprintf(buf + at, size - at, "\\n");
        else if (c == '\t') at += (size_t)snprintf(buf + at, size - at, "\\t");
        else if (c == '"' || c == '\'' || c == '\\')
            at += (size_t)snprintf(buf + at, size - at, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f) at += (size_t)snprintf(buf + at, size - at, "\\x%02x", c);
        else buf[at++] = (char)c, buf[at] = '\0';
    }
    return buf;
}
