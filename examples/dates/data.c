// The dates task's data: days, the ways people write them, the vocabulary, the split.
#include "data.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/escape.h"

enum { FIRST_YEAR = 1950, YEARS = 100 };

static const char *const MONTHS[12] = {"January", "February", "March",     "April",
                                       "May",     "June",     "July",      "August",
                                       "September", "October", "November", "December"};
static const char *const WEEKDAYS[7] = {"Sunday",   "Monday", "Tuesday", "Wednesday",
                                        "Thursday", "Friday", "Saturday"};

// The ways to write a date: a template and its case. In a template,
//   %W weekday (Thursday)  %w its first three letters (Thu)
//   %M month (November)    %m its first three letters (Nov)
//   %d day (1, 26)         %D two digits (01, 26)      %o ordinal (1st, 26th)
//   %n month number (11)   %N two digits               %Y year (2026)   %y two digits (26)
typedef enum { AS_WRITTEN, LOWER, UPPER } letter_case;
static const struct {
    const char *tmpl;
    letter_case lc;
} FORMATS[] = {
    {"%W, %d %M %Y", AS_WRITTEN},  // Thursday, 26 November 2026
    {"%D/%N/%y", AS_WRITTEN},      // 26/11/26
    {"%m %d %Y", LOWER},           // nov 26 2026
    {"the %o of %M, %Y", AS_WRITTEN},
    {"%d %M %Y", AS_WRITTEN},
    {"%M %d, %Y", AS_WRITTEN},
    {"%d %m %Y", AS_WRITTEN},
    {"%m %d, %Y", AS_WRITTEN},
    {"%D.%N.%Y", AS_WRITTEN},
    {"%D-%N-%Y", AS_WRITTEN},
    {"%d/%n/%y", AS_WRITTEN},     // 3/4/99
    {"%D/%N/%Y", AS_WRITTEN},
    {"%Y/%N/%D", AS_WRITTEN},
    {"%w %d %m %Y", AS_WRITTEN},  // Thu 26 Nov 2026
    {"%w, %m %d, %Y", AS_WRITTEN},
    {"%W %d %M %Y", UPPER},
    {"%d %m %y", LOWER},
    {"%W %M %o %Y", LOWER},       // thursday november 26th 2026
    {"%o %M %Y", AS_WRITTEN},
    {"%M %o, %Y", AS_WRITTEN},
    {"%o of %m %Y", LOWER},
    {"%M %Y, the %o", AS_WRITTEN},
};
enum { N_FORMATS = sizeof FORMATS / sizeof FORMATS[0] };

int dates_vocab(void) { return 3 + (int)strlen(DATES_CHARS); }

int32_t dates_token(char c) {
    const char *p = c ? strchr(DATES_CHARS, c) : NULL;
    return p ? 3 + (int32_t)(p - DATES_CHARS) : -1;
}

char dates_char(int32_t token) {
    return token >= 3 && token < dates_vocab() ? DATES_CHARS[token - 3] : '?';
}

int dates_encode(const char *text, int32_t ids[DATES_SRC_MAX]) {
    const size_t n = strlen(text);
    char shown[4 * (DATES_SRC_MAX + 8) + 1], c[8];
    if (n < 1 || n > DATES_SRC_MAX) {
        // Quoted up to the longest date and a little more, so a pasted page stays one line.
        fprintf(stderr, "dates: \"%s%s\" has %zu characters; a date has 1 to %d\n",
                escaped(text, DATES_SRC_MAX + 8, shown, sizeof shown),
                n > DATES_SRC_MAX + 8 ? "..." : "", n, DATES_SRC_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if ((ids[i] = dates_token(text[i])) < 0) {
            fprintf(stderr, "dates: \"%s\": character '%s' is not in the vocabulary (%s)\n",
                    escaped(text, n, shown, sizeof shown), escaped(text + i, 1, c, sizeof c),
                    DATES_CHARS);
            return -1;
        }
    }
    return (int)n;
}

static bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

static int month_days(int y, int m) {  // m in 1 .. 12
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return days[m - 1] + (m == 2 && leap(y));
}

int dates_days(void) {
    int n = 0;
    for (int y = FIRST_YEAR; y < FIRST_YEAR + YEARS; y++) n += leap(y) ? 366 : 365;
    return n;
}

// Day `day` (0 = 1950-01-01, a Sunday) as year, month, day of month and weekday.
static void civil(int day, int *y, int *m, int *d, int *weekday) {
    *weekday = day % 7;
    *y = FIRST_YEAR;
    while (day >= (leap(*y) ? 366 : 365)) day -= leap((*y)++) ? 366 : 365;
    *m = 1;
    while (day >= month_days(*y, *m)) day -= month_days(*y, (*m)++);
    *d = day + 1;
}

int dates_formats(void) { return N_FORMATS; }

void dates_iso(int day, char out[DATES_ISO_LEN + 1]) {
    int y, m, d, w;
    civil(day, &y, &m, &d, &w);
    snprintf(out, DATES_ISO_LEN + 1, "%04d-%02d-%02d", y, m, d);
}

static const char *ordinal_suffix(int d) {
    if (d >= 11 && d <= 13) return "th";
    return d % 10 == 1 ? "st" : d % 10 == 2 ? "nd" : d % 10 == 3 ? "rd" : "th";
}

void dates_write(int day, int format, char out[DATES_SRC_MAX + 1]) {
    int y, m, d, w;
    civil(day, &y, &m, &d, &w);
    size_t n = 0;
    const size_t cap = DATES_SRC_MAX + 1;
    for (const char *t = FORMATS[format].tmpl; *t && n < cap; t++) {
        if (*t != '%') {
            out[n++] = *t;
            continue;
        }
        char field[16];
        switch (*++t) {
        case 'W': snprintf(field, sizeof field, "%s", WEEKDAYS[w]); break;
        case 'w': snprintf(field, sizeof field, "%.3s", WEEKDAYS[w]); break;
        case 'M': snprintf(field, sizeof field, "%s", MONTHS[m - 1]); break;
        case 'm': snprintf(field, sizeof field, "%.3s", MONTHS[m - 1]); break;
        case 'd': snprintf(field, sizeof field, "%d", d); break;
        case 'D': snprintf(field, sizeof field, "%02d", d); break;
        case 'o': snprintf(field, sizeof field, "%d%s", d, ordinal_suffix(d)); break;
        case 'n': snprintf(field, sizeof field, "%d", m); break;
        case 'N': snprintf(field, sizeof field, "%02d", m); break;
        case 'Y': snprintf(field, sizeof field, "%d", y); break;
        default: snprintf(field, sizeof field, "%02d", y % 100); break;  // 'y'
        }
        for (const char *f = field; *f && n < cap; f++) out[n++] = *f;
    }
    out[n < cap ? n : cap - 1] = 0;
    for (char *c = out; *c; c++) {
        if (FORMATS[format].lc == LOWER) *c = (char)tolower((unsigned char)*c);
        if (FORMATS[format].lc == UPPER) *c = (char)toupper((unsigned char)*c);
    }
}

void dates_split_init(dates_split *s, uint64_t seed, double test_fraction) {
    const int n = dates_days();
    int32_t *order = malloc((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = i;
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    for (int i = n - 1; i > 0; i--) {  // Fisher-Yates
        const int j = (int)ag_pcg32_bounded(&rng, (uint32_t)i + 1);
        const int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    s->n_test = (int)lround(test_fraction * n);
    s->n_train = n - s->n_test;
    s->test = order;
    s->train = order + s->n_test;
}

void dates_split_free(dates_split *s) {
    free(s->test);
    *s = (dates_split){0};
}

void dates_sample(const dates_split *s, bool test, ag_pcg32 *rng, char src[DATES_SRC_MAX + 1],
                  char iso[DATES_ISO_LEN + 1]) {
    const int32_t *days = test ? s->test : s->train;
    const int day = days[ag_pcg32_bounded(rng, (uint32_t)(test ? s->n_test : s->n_train))];
    dates_write(day, (int)ag_pcg32_bounded(rng, N_FORMATS), src);
    dates_iso(day, iso);
}

// Fills b from n written sources and their ISO forms ("": no target); b owns both.
static void batch_fill(dates_batch *b, char (*text)[DATES_SRC_MAX + 1],
                       char (*iso)[DATES_ISO_LEN + 1], int n) {
    dates_batch_free(b);
    b->n = n;
    b->text = text;
    b->iso = iso;
    for (int i = 0; i < n; i++) {
        const int len = (int)strlen(text[i]);
        if (len > b->S) b->S = len;
    }
    b->src = calloc((size_t)n * b->S, sizeof *b->src);  // DATES_PAD is 0
    uint8_t *pad = malloc((size_t)n * b->S);
    b->tgt_in = malloc((size_t)n * DATES_TGT * sizeof *b->tgt_in);
    b->tgt_out = malloc((size_t)n * DATES_TGT * sizeof *b->tgt_out);
    for (int i = 0; i < n; i++) {
        int32_t ids[DATES_SRC_MAX];
        const int len = dates_encode(text[i], ids);
        for (int j = 0; j < b->S; j++) {
            b->src[(size_t)i * b->S + j] = j < len ? ids[j] : DATES_PAD;
            pad[(size_t)i * b->S + j] = j >= len;
        }
        int32_t *in = b->tgt_in + (size_t)i * DATES_TGT, *out = b->tgt_out + (size_t)i * DATES_TGT;
        in[0] = DATES_START;
        out[DATES_ISO_LEN] = DATES_END;
        for (int j = 0; j < DATES_ISO_LEN; j++)
            in[j + 1] = out[j] = iso[i][0] ? dates_token(iso[i][j]) : DATES_PAD;
    }
    b->src_pad = ag_tensor_from(AG_BOOL, 2, (int[]){n, b->S}, pad);
    free(pad);
}

void dates_batch_draw(dates_batch *b, const dates_split *s, bool test, ag_pcg32 *rng, int n) {
    char (*text)[DATES_SRC_MAX + 1] = malloc((size_t)n * sizeof *text);
    char (*iso)[DATES_ISO_LEN + 1] = malloc((size_t)n * sizeof *iso);
    for (int i = 0; i < n; i++) dates_sample(s, test, rng, text[i], iso[i]);
    batch_fill(b, text, iso, n);
}

bool dates_batch_of_text(dates_batch *b, const char *text) {
    int32_t ids[DATES_SRC_MAX];
    if (dates_encode(text, ids) < 0) return false;
    char (*copy)[DATES_SRC_MAX + 1] = malloc(sizeof *copy);
    char (*iso)[DATES_ISO_LEN + 1] = calloc(1, sizeof *iso);
    snprintf(copy[0], sizeof copy[0], "%s", text);
    batch_fill(b, copy, iso, 1);
    return true;
}

void dates_batch_free(dates_batch *b) {
    free(b->src), free(b->tgt_in), free(b->tgt_out), free(b->text), free(b->iso);
    ag_tensor_free(b->src_pad);
    *b = (dates_batch){0};
}
