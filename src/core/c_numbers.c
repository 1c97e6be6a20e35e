// Numbers in files, whatever the locale. A program that calls setlocale(LC_ALL, "") (most
// do) gets the locale's decimal point from printf's "%g" and strtod: "0,001" in de_DE.UTF-8.
// A checkpoint written there would not read back in the C locale (strtod stops at the
// comma), nor one of the C locale there, and a page's JSON would not parse. So what the
// library writes into files and pages, and reads back from them, takes '.' as the C locale
// does: formatted by the C library, then its decimal point swapped for '.'; parsed by
// strtod after the other swap. Plain C11 (localeconv), no per-thread locale API.
#include <errno.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// The locale's decimal point when it is not ".", else NULL.
static const char *other_point(void) {
    const char *point = localeconv()->decimal_point;
    return point && point[0] && strcmp(point, ".") != 0 ? point : NULL;
}

int agi_format_g(char *buf, size_t size, int digits, double v) {
    // "%.*g" needs at most digits + 8 characters ("-1.2345e-308"), and a locale's point
    // a few bytes: digits are at most 17 here.
    char s[96];
    if (digits < 0 || digits > 40) digits = 17;
    snprintf(s, sizeof s, "%.*g", digits, v);
    const char *point = other_point();
    char *at = point ? strstr(s, point) : NULL;  // "%g" writes at most one
    if (at) {
        size_t n = strlen(point);
        *at = '.';
        memmove(at + 1, at + n, strlen(at + n) + 1);
    }
    return snprintf(buf, size, "%s", s);
}

// A byte that strtod may read as part of a number: white space before it, the sign,
// digits, '.', the exponent, hex digits, "inf", "infinity", "nan(chars)". ASCII only:
// isalnum would follow the locale too.
static bool number_byte(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr(" \t\n\v\f\r+-._()", c));
}

double agi_strtod_c(const char *s, char **end) {
    const char *point = other_point();
    if (!point) return strtod(s, end);
    // The bytes that could be the number, up to the locale's point (where the C locale's
    // strtod stops), each '.' as the locale's point.
    size_t pl = strlen(point), n = 0, dots = 0;
    for (; number_byte(s[n]) && strncmp(s + n, point, pl) != 0; n++) dots += s[n] == '.';
    char local[128];
    size_t need = n + dots * (pl - 1) + 1;
    char *copy = need <= sizeof local ? local : agi_malloc(need);
    char *w = copy;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.') memcpy(w, point, pl), w += pl;
        else *w++ = s[i];
    }
    *w = '\0';
    char *stop;
    double v = strtod(copy, &stop);
    int saved = errno;
    if (end) {  // the bytes strtod read, back in s: a point counts as one '.'
        size_t i = 0;
        for (const char *c = copy; c < stop; i++) c += s[i] == '.' ? pl : 1;
        *end = (char *)(s + i);
    }
    if (copy != local) agi_free(copy);
    errno = saved;
    return v;
}
