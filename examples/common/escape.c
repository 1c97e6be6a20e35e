#include "escape.h"

#include <stdio.h>

// The length of the UTF-8 character at c (2 to 4 bytes), 0 if c does not start one.
static int utf8_length(const unsigned char *c) {
    const int n = *c >= 0xc2 && *c <= 0xdf ? 2 : *c >= 0xe0 && *c <= 0xef ? 3
                : *c >= 0xf0 && *c <= 0xf4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((c[i] & 0xc0) != 0x80) return 0;  // (the end, 0, is not a continuation)
    return n;
}

void put_line(const char *s, FILE *f) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        const int n = *c >= 0x80 ? utf8_length(c) : 1;
        if (*c == '\n') {
            fputs("\\n", f);
        } else if (*c == '\t') {
            fputs("\\t", f);
        } else if (*c < 0x20 || *c == 0x7f || n == 0) {
            fprintf(f, "\\x%02x", *c);
        } else {
            fwrite(c, 1, (size_t)n, f);
            c += n - 1;  // past the rest of the character
        }
    }
    fputc('\n', f);
}

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

void put_xml(const char *s, size_t n, FILE *f) {
    for (size_t i = 0; i < n && s[i]; i++) {
        const char c = s[i];
        if (c == '<')
            fputs("&lt;", f);
        else if (c == '>')
            fputs("&gt;", f);
        else if (c == '&')
            fputs("&amp;", f);
        else
            fputc(c, f);
    }
}
