// The dates task: dates as people write them ("Thursday, 26 November 2026", "26/11/26",
// "nov 26 2026", "the 26th of November, 2026", ...) and their ISO form, 2026-11-26.
//
// Dates run from 1950-01-01 to 2049-12-31, so a two-digit year is unambiguous (50-99 are
// the 1900s, 00-49 the 2000s); numeric formats put the day first (26/11/26), so 03/04/99
// is the 3rd of April. A split, drawn from a seeded pcg32, holds out a fraction of the
// days: no held-out day appears in training, in any format.
//
// Characters are tokens: 0 pad, 1 start, 2 end, then DATES_CHARS in order.
#ifndef DATES_DATA_H
#define DATES_DATA_H

#include <attograd.h>

enum {
    DATES_PAD = 0,
    DATES_START = 1,
    DATES_END = 2,
    DATES_SRC_MAX = 32,  // characters of the longest written date
    DATES_ISO_LEN = 10,  // yyyy-mm-dd
};
#define DATES_CHARS " ,-./0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

int dates_vocab(void);           // 3 + strlen(DATES_CHARS)
int32_t dates_token(char c);     // -1 for a character outside the vocabulary
char dates_char(int32_t token);  // '?' for pad, start, end and unknown tokens
// The tokens of text into ids; its length, or -1 (after a one-line message to stderr)
// for a character outside the vocabulary or text longer than DATES_SRC_MAX.
int dates_encode(const char *text, int32_t ids[DATES_SRC_MAX]);

int dates_days(void);     // days from 1950-01-01 to 2049-12-31
int dates_formats(void);  // how many ways to write a date
// Day `day` (0 = 1950-01-01) written the `format`-th way, and in ISO.
void dates_write(int day, int format, char out[DATES_SRC_MAX + 1]);
void dates_iso(int day, char out[DATES_ISO_LEN + 1]);

typedef struct dates_split {
    int32_t *train, *test;  // the days of each part
    int n_train, n_test;
} dates_split;

// Holds out round(test_fraction * dates_days()) days, drawn from pcg32 (seed, stream 1).
void dates_split_init(dates_split *s, uint64_t seed, double test_fraction);
void dates_split_free(dates_split *s);
// A day of the part (training or held out) and a format, both uniform, from rng:
// the written date and its ISO form.
void dates_sample(const dates_split *s, bool test, ag_pcg32 *rng, char src[DATES_SRC_MAX + 1],
                  char iso[DATES_ISO_LEN + 1]);

#endif
