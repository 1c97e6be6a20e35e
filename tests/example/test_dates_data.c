// The dates task's data (examples/dates/data.c): every day is written right in every
// format, the vocabulary covers them, and the held-out days never reach training.
#define _POSIX_C_SOURCE 200809L  // dup, dup2, fileno
#include <stdlib.h>
#include <unistd.h>

#include "data.h"
#include "testing.h"

// The day index of an ISO date, by counting: the reference for dates_iso.
static int day_of(const char *iso) {
    int y, m, d;
    if (sscanf(iso, "%d-%d-%d", &y, &m, &d) != 3) return -1;
    for (int i = 0; i < dates_days(); i++) {
        char s[DATES_ISO_LEN + 1];
        dates_iso(i, s);
        if (strcmp(s, iso) == 0) return i;
    }
    return -1;
}

// Whether the day of `iso` written the `format`-th way reads `want`.
static bool written_as(const char *iso, int format, const char *want) {
    char s[DATES_SRC_MAX + 1];
    dates_write(day_of(iso), format, s);
    if (strcmp(s, want) != 0) fprintf(stderr, "  %s, format %d: \"%s\", expected \"%s\"\n",
                                      iso, format, s, want);
    return strcmp(s, want) == 0;
}

static void test_the_calendar_runs_from_1950_to_2049(void) {
    CHECK(dates_days() == 36525);  // 100 years, 25 of them leap (2000 is one)
    char iso[DATES_ISO_LEN + 1];
    dates_iso(0, iso);
    CHECK(strcmp(iso, "1950-01-01") == 0);
    dates_iso(dates_days() - 1, iso);
    CHECK(strcmp(iso, "2049-12-31") == 0);
    CHECK(day_of("2000-02-29") == day_of("2000-02-28") + 1);
    CHECK(day_of("2000-03-01") == day_of("2000-02-29") + 1);
    CHECK(day_of("1900-02-29") == -1 && day_of("2049-02-29") == -1);
}

static void test_the_examples_of_the_issue_are_written_as_people_write_them(void) {
    CHECK(written_as("2026-11-26", 0, "Thursday, 26 November 2026"));
    CHECK(written_as("2026-11-26", 1, "26/11/26"));
    CHECK(written_as("2026-11-26", 2, "nov 26 2026"));
    CHECK(written_as("2026-11-26", 3, "the 26th of November, 2026"));
    CHECK(written_as("1999-04-03", 10, "3/4/99"));  // day first, unpadded
    CHECK(written_as("2011-12-22", 18, "22nd December 2011"));
    CHECK(written_as("2013-03-13", 18, "13th March 2013"));
    CHECK(written_as("2021-05-01", 19, "May 1st, 2021"));
}

// Every day in every format fits, encodes, and names its day: the day of month, the
// month and the year can be read back from the written date (numbers or names).
static void test_every_day_in_every_format_encodes_and_carries_its_date(void) {
    bool ok = true;
    int longest = 0;
    for (int day = 0; day < dates_days(); day += 7) {
        for (int f = 0; f < dates_formats(); f++) {
            char s[DATES_SRC_MAX + 1], iso[DATES_ISO_LEN + 1];
            int32_t ids[DATES_SRC_MAX];
            dates_write(day, f, s);
            dates_iso(day, iso);
            const int n = dates_encode(s, ids);
            ok &= n == (int)strlen(s) && n > 0;
            if (n > longest) longest = n;
            for (int i = 0; i < n; i++) ok &= dates_char(ids[i]) == s[i];
            // The year's last two digits appear in every format.
            ok &= strstr(s, (char[]){iso[2], iso[3], 0}) != NULL;
        }
    }
    CHECK(ok);
    CHECK(longest <= DATES_SRC_MAX && longest >= 25);
    CHECK(dates_formats() >= 20);
}

static void test_weekdays_follow_the_calendar(void) {
    CHECK(written_as("1950-01-01", 0, "Sunday, 1 January 1950"));
    CHECK(written_as("2000-01-01", 0, "Saturday, 1 January 2000"));
    CHECK(written_as("2049-12-31", 0, "Friday, 31 December 2049"));
    CHECK(written_as("1969-07-20", 13, "Sun 20 Jul 1969"));
}

static void test_the_vocabulary_refuses_what_it_cannot_say(void) {
    int32_t ids[DATES_SRC_MAX];
    CHECK(dates_vocab() == 3 + (int)strlen(DATES_CHARS));
    CHECK(dates_encode("26/11/26", ids) == 8 && ids[0] == dates_token('2'));
    CHECK(dates_encode("26_11_26", ids) == -1);
    CHECK(dates_encode("", ids) == -1);
    CHECK(dates_encode("123456789012345678901234567890123", ids) == -1);
    CHECK(dates_char(DATES_END) == '?' && dates_token(0) == -1);
}

// A text far too long to be a date is quoted by its start only: the whole of it, echoed,
// made a pasted page one screen-wide error line.
static void test_a_long_text_is_quoted_by_its_start(void) {
    char text[301], line[512] = {0};
    memset(text, 'x', 300);
    text[300] = '\0';
    fflush(stderr);
    FILE *tmp = tmpfile();
    const int saved = dup(2);
    dup2(fileno(tmp), 2);
    int32_t ids[DATES_SRC_MAX];
    CHECK(dates_encode(text, ids) == -1);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    CHECK(fgets(line, sizeof line, tmp) != NULL);
    fclose(tmp);
    CHECK(strstr(line, "...\" has 300 characters; a date has 1 to 32") != NULL);
    CHECK(strlen(line) < 100);
}

// The held-out days are a tenth of all days, never drawn for training; the split and
// the draws follow the seed.
static void test_held_out_days_never_reach_training(void) {
    dates_split s;
    dates_split_init(&s, 7, 0.1);
    CHECK(s.n_test == 3653 && s.n_train + s.n_test == dates_days());
    char *held = calloc((size_t)dates_days(), 1);
    for (int i = 0; i < s.n_test; i++) held[s.test[i]] = 1;
    for (int i = 0; i < s.n_train; i++) CHECK(!held[s.train[i]]);
    ag_pcg32 rng = ag_pcg32_make(1, 2);
    bool disjoint = true;
    for (int i = 0; i < 300; i++) {  // day_of counts days: a few hundred draws
        char src[DATES_SRC_MAX + 1], iso[DATES_ISO_LEN + 1];
        dates_sample(&s, false, &rng, src, iso);
        disjoint &= !held[day_of(iso)];
    }
    CHECK(disjoint);
    dates_split t;
    dates_split_init(&t, 7, 0.1);
    CHECK(memcmp(s.test, t.test, (size_t)s.n_test * sizeof *s.test) == 0);
    dates_split_free(&t);
    dates_split_init(&t, 8, 0.1);
    CHECK(memcmp(s.test, t.test, (size_t)s.n_test * sizeof *s.test) != 0);
    dates_split_free(&t);
    free(held);
    dates_split_free(&s);
}

int main(void) {
    RUN(test_the_calendar_runs_from_1950_to_2049);
    RUN(test_the_examples_of_the_issue_are_written_as_people_write_them);
    RUN(test_every_day_in_every_format_encodes_and_carries_its_date);
    RUN(test_weekdays_follow_the_calendar);
    RUN(test_the_vocabulary_refuses_what_it_cannot_say);
    RUN(test_a_long_text_is_quoted_by_its_start);
    RUN(test_held_out_days_never_reach_training);
    return testing_summary();
}
