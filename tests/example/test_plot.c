// The examples' SVG line plot (examples/common/plot.c): its ticks end, and the file is
// whole, whatever the values' magnitude.
#define _POSIX_C_SOURCE 200809L  // alarm
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plot.h"
#include "testing.h"
#include "testing_files.h"

// Loss curves whose points lie within a few units of 1e16: the tick step (0.5, or 2) is
// below the spacing of doubles there (2), so t += step never moved, and the tick loop
// wrote the file without end (here: up to a limit of 1 MB, then alarm ends the run).
// Each plot is whole, of a few ticks; a curve of one point is drawn about it.
static void test_ticks_end_at_any_magnitude(void) {
    const testing_file_size limit = testing_file_size_limit(1 << 20);
    const double two53 = 9007199254740992.0;  // 2^53
    const double ys[][2] = {{two53, two53},            // one value: the range around it
                            {1e16, 1e16 + 2},          // two, a spacing apart
                            {1e17, 1e17 + 16},
                            {1.5, 2.5}};               // an ordinary curve
    for (size_t c = 0; c < sizeof ys / sizeof *ys; c++) {
        const double x[2] = {1, 2};
        plot_series s = {"train", "#1f77b4", x, ys[c], 2};
        const char *path = testing_path("plot.svg");
        ag_err err;
        alarm(10);
        CHECK(plot_svg(path, "loss", "step", "bits/byte", &s, 1, &err));
        alarm(0);
        size_t len = 0;
        char *text = (char *)testing_read_file(path, &len);
        CHECK(text && len > 0 && len < 20000);
        CHECK(text && strstr(text, "<polyline") && strstr(text, "</svg>\n"));
        int ticks = 0;
        for (const char *p = text; p && (p = strstr(p, "stroke=\"#ddd\"")); p++) ticks++;
        CHECK(ticks >= 2 && ticks <= 32);
        free(text);
    }
    testing_file_size_restore(limit);
}

int main(void) {
    RUN(test_ticks_end_at_any_magnitude);
    testing_remove_tmpdir();
    return testing_summary();
}
