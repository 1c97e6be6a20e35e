// The language models' text (examples/common/text.c): where its windows start, over the
// whole of a text longer than 4 GB as over a short one.
#include <stdint.h>
#include <stdlib.h>

#include "testing.h"
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

int main(void) {
    RUN(test_a_short_span_is_one_bounded_draw);
    RUN(test_a_span_past_4_gb_is_drawn_whole);
    RUN(test_windows_read_the_text_at_their_start);
    return testing_summary();
}
