// The language models' text (examples/common/text.c): where its windows start, over the
// whole of a text longer than 4 GB as over a short one; and how it reads its files.
#define _POSIX_C_SOURCE 200809L  // mkfifo, symlink, fork

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "testing.h"
#include "testing_files.h"
#include "text.h"

// A span up to 2^32 is one bounded draw, as before texts this long were read: a short
// text's windows stay what every recorded run drew.
static void test_a_short_span_is_one_bounded_draw(void) {
    const size_t spans[] = {1, 2, 1000, 237000, UINT32_MAX, (size_t)UINT32_MAX + 1};
    for (size_t i = 0; i < sizeof spans / sizeof *spans; i++) {
        ag_pcg32 a = ag_pcg32_make(7, (uint64_t)i), b = a;
        for (int k = 0; k < 100; k++)
            CHECK(text_window_start(spans[i], &a) ==
                  ag_pcg32_bounded(&b, (uint32_t)spans[i]));  // 2^32 wraps to 0: all of it
    }
}

// A span past 2^32 was cut to its low 32 bits: a text of 8 GB + 12345 bytes drew its
// windows from its first 12345 bytes. Now they cover it: 4000 draws, each below the
// span; their mean within 3% of the middle (the uniform's standard error here is 0.5%),
// and as many past 4 GB and past 6 GB as a uniform draw gives (1/2 and 1/4 of them).
static void test_a_span_past_4_gb_is_drawn_whole(void) {
    const size_t span = ((size_t)1 << 33) + 12345;
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    double sum = 0;
    int past4 = 0, past6 = 0, n = 4000;
    bool below = true;
    for (int k = 0; k < n; k++) {
        const size_t s = text_window_start(span, &rng);
        below &= s < span;
        sum += (double)s;
        past4 += s >= (size_t)1 << 32;
        past6 += s >= (size_t)3 << 31;
    }
    CHECK(below);
    CHECK_NEAR(sum / n / (double)span, 0.5, 0.03);
    CHECK(past4 > n * 45 / 100 && past4 < n * 55 / 100);
    CHECK(past6 > n * 20 / 100 && past6 < n * 30 / 100);
}

// Windows of a text: ids and targets are the text at the drawn start and one past it.
static void test_windows_read_the_text_at_their_start(void) {
    uint8_t bytes[300];
    for (int i = 0; i < 300; i++) bytes[i] = (uint8_t)(i * 7 + 3);
    const text_data t = {.bytes = bytes, .len = 300, .train_len = 200};
    enum { B = 5, T = 16 };
    int32_t ids[B * T], targets[B * T];
    ag_pcg32 rng = ag_pcg32_make(9, 1), again = rng;
    for (int valid = 0; valid < 2; valid++) {
        text_windows(&t, valid, B, T, &rng, ids, targets);
        const size_t lo = valid ? 200 : 0, hi = valid ? 300 : 200;
        for (int b = 0; b < B; b++) {
            const size_t s = lo + ag_pcg32_bounded(&again, (uint32_t)(hi - lo - T));
            for (int i = 0; i < T; i++) {
                CHECK(ids[b * T + i] == bytes[s + (size_t)i]);
                CHECK(targets[b * T + i] == bytes[s + (size_t)i + 1]);
            }
        }
    }
}

// ---- Reading the text --------------------------------------------------------------------
static const char sample[] = "The quick brown fox jumps over the lazy dog.\n";

static int load_expecting(void *arg) {
    const size_t *want = arg;
    text_data t;
    ag_err err = {{0}};
    const bool ok = text_load(&t, testing_path("swapped"), 0.25, 1, &err);
    const bool right = ok && t.len == *want;
    if (ok) text_free(&t);
    return right ? 0 : 1;
}

// The text was checked by name (stat) and then opened by name (fopen): a FIFO put there
// between the two (here right after the stat, through the hook of testing_files.h) hung
// the load in the open, waiting for a writer that never came.
static void test_a_fifo_swapped_in_after_the_check_does_not_hang_the_load(void) {
    char path[700], fifo[700];
    snprintf(path, sizeof path, "%s", testing_path("swapped"));
    snprintf(fifo, sizeof fifo, "%s", testing_path("swapped.fifo"));
    testing_write_file(path, sample, sizeof sample - 1);
    CHECK(mkfifo(fifo, 0600) == 0);
    testing_swap_path = path;
    testing_swap_with = fifo;
    size_t want = sizeof sample - 1;
    int status = -1;
    CHECK(testing_returns_within(load_expecting, &want, 1.0, &status));
    CHECK(status == 0);
    testing_swap_path = testing_swap_with = NULL;
    unlink(path);
    unlink(fifo);
}

// So was each file of a directory (lstat, then fopen): a FIFO put in the place of one of
// them hung the load. The regular files are read, in name order, and a link is skipped.
static void test_a_fifo_swapped_into_the_directory_does_not_hang_the_load(void) {
    char dir[700], a[760], b[760], link[760], fifo[700];
    snprintf(dir, sizeof dir, "%s", testing_path("swapped"));
    snprintf(fifo, sizeof fifo, "%s", testing_path("swapped.fifo"));
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(a, sizeof a, "%s/a.txt", dir);
    snprintf(b, sizeof b, "%s/b.txt", dir);
    snprintf(link, sizeof link, "%s/c.txt", dir);
    testing_write_file(a, sample, sizeof sample - 1);
    testing_write_file(b, sample, sizeof sample - 1);
    CHECK(symlink("a.txt", link) == 0);
    CHECK(mkfifo(fifo, 0600) == 0);
    testing_swap_path = b;
    testing_swap_with = fifo;
    size_t want = 2 * (sizeof sample - 1);  // a.txt and b.txt, as they were when opened
    int status = -1;
    CHECK(testing_returns_within(load_expecting, &want, 1.0, &status));
    testing_swap_path = testing_swap_with = NULL;
    CHECK(status == 0);
    // Unhooked, the files as they are: a.txt and b.txt once each, the link skipped.
    text_data t;
    ag_err err = {{0}};
    unlink(b);
    testing_write_file(b, "0123456789", 10);
    CHECK(text_load(&t, dir, 0.25, 1, &err));
    CHECK(t.len == sizeof sample - 1 + 10);
    CHECK(t.len >= 10 && memcmp(t.bytes + t.len - 10, "0123456789", 10) == 0);
    text_free(&t);
    unlink(a);
    unlink(b);
    unlink(link);
    unlink(fifo);
    rmdir(dir);
}

// The files were opened with fopen(path, "rb"): their descriptors went into every program
// another thread of the process started while the text was read.
static void test_the_load_opens_its_files_close_on_exec(void) {
    char dir[700], name[760];
    snprintf(dir, sizeof dir, "%s", testing_path("cloexec"));
    CHECK(mkdir(dir, 0700) == 0);
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s/%d.txt", dir, i);
        testing_write_file(name, sample, sizeof sample - 1);
    }
    text_data t;
    ag_err err = {{0}};
    testing_fclose_count = testing_fclose_inheritable = 0;
    CHECK(text_load(&t, dir, 0.25, 1, &err));
    CHECK(t.len == 2 * (sizeof sample - 1));
    text_free(&t);
    snprintf(name, sizeof name, "%s/0.txt", dir);
    CHECK(text_load(&t, name, 0.25, 1, &err));
    text_free(&t);
    CHECK(testing_fclose_count == 3);
    CHECK(testing_fclose_inheritable == 0);
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s/%d.txt", dir, i);
        unlink(name);
    }
    rmdir(dir);
}

// A file still being written was read for as long as it grew: here each read first
// appends 64 KiB to it (the hook of testing_files.h), 40 times, and the load took all of
// it, 2.5 MiB more than the file held when opened; a log that never stops, without end.
static void test_a_file_growing_while_read_is_read_as_it_was_when_opened(void) {
    char path[700];
    snprintf(path, sizeof path, "%s", testing_path("growing.txt"));
    testing_write_file(path, sample, sizeof sample - 1);
    testing_grow_path = path;
    testing_grow_bytes = 1 << 16;
    testing_grow_left = 40;
    text_data t;
    ag_err err = {{0}};
    const bool ok = text_load(&t, path, 0.25, 1, &err);
    testing_grow_path = NULL;
    CHECK(ok);
    CHECK(t.len == sizeof sample - 1);
    CHECK(ok && memcmp(t.bytes, sample, sizeof sample - 1) == 0);
    if (ok) text_free(&t);
    unlink(path);
}

// A path longer than the message filled it, and the problem was cut off: --data with a
// path past PATH_MAX said only the path. Past 200 bytes it is shown as its first 80 bytes,
// "...", and its last 100, and the problem follows.
static void test_a_long_path_leaves_room_for_the_problem(void) {
    static char path[5000];
    for (size_t i = 0; i + 1 < sizeof path; i++) path[i] = i % 2 ? '/' : 'd';
    path[sizeof path - 2] = 'f';
    text_data t;
    ag_err err = {{0}};
    CHECK(!text_load(&t, path, 0.25, 1, &err));
    char want[512];
    snprintf(want, sizeof want, "%.80s...%s: %s", path, path + sizeof path - 101,
             strerror(ENAMETOOLONG));
    CHECK(strcmp(err.msg, want) == 0);
}

int main(void) {
    RUN(test_a_short_span_is_one_bounded_draw);
    RUN(test_a_span_past_4_gb_is_drawn_whole);
    RUN(test_windows_read_the_text_at_their_start);
    RUN(test_a_fifo_swapped_in_after_the_check_does_not_hang_the_load);
    RUN(test_a_fifo_swapped_into_the_directory_does_not_hang_the_load);
    RUN(test_the_load_opens_its_files_close_on_exec);
    RUN(test_a_file_growing_while_read_is_read_as_it_was_when_opened);
    RUN(test_a_long_path_leaves_room_for_the_problem);
    testing_remove_tmpdir();
    return testing_summary();
}
