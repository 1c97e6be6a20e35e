// The position schemes a benchmark's --pos takes: the library's table's (ag_pos_kind_name),
// in its order, read in any case and shown in lower case as the README writes them. Lists
// of the benchmarks' own had lost the schemes added to the table after them.
#ifndef ATTOGRAD_BENCH_SCHEMES_H
#define ATTOGRAD_BENCH_SCHEMES_H

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <strings.h>

#include "attograd.h"

enum { SCHEMES_MOST = 16 };

// The table's names; returns how many (the kinds are 0 .. n - 1).
static inline int schemes_list(const char *names[SCHEMES_MOST]) {
    int n = 0;
    while (n < SCHEMES_MOST && (names[n] = ag_pos_kind_name((ag_pos_kind)n)) != NULL) n++;
    return n;
}

// "none|relative|...|" to f, as a usage line shows the choices.
static inline void schemes_print(FILE *f) {
    const char *names[SCHEMES_MOST];
    const int n = schemes_list(names);
    for (int k = 0; k < n; k++) {
        for (const char *c = names[k]; *c; c++) fputc(tolower((unsigned char)*c), f);
        fputc('|', f);
    }
}

// The name of scheme k in lower case, for a table's column.
static inline const char *schemes_lower(int k, char out[32]) {
    const char *name = ag_pos_kind_name((ag_pos_kind)k);
    int i = 0;
    for (; name && name[i] && i < 31; i++) out[i] = (char)tolower((unsigned char)name[i]);
    out[i] = '\0';
    return out;
}

// Whether `choice` ("all" or a scheme's name in any case) takes scheme k.
static inline bool schemes_takes(const char *choice, int k) {
    const char *name = ag_pos_kind_name((ag_pos_kind)k);
    return strcasecmp(choice, "all") == 0 || (name && strcasecmp(choice, name) == 0);
}

#endif
