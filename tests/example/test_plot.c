// The examples' training output: the SVG line plot (examples/common/plot.c), whose ticks
// end and whose file is whole whatever the values' magnitude; the attention heatmap
// (heatmap.c), whose title is XML text whatever it holds; and the training log's
// progress line (train_log.c, progress.c), which shows a NaN validation loss as one and
// any time left whole.
#define _POSIX_C_SOURCE 200809L  // alarm, dup, dup2, fileno
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "heatmap.h"
#include "plot.h"
#include "train_log.h"
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

// A validation loss measured as NaN (after one of 5) is shown as nan, on a line of its own:
// NAN meant "not measured", and the line showed the last finite loss, 5.000.
static void test_a_nan_validation_loss_is_shown_as_one(void) {
    const char *path = testing_path("progress.txt");
    fflush(stdout);
    const int saved = dup(fileno(stdout));
    CHECK(saved >= 0 && freopen(path, "w", stdout));
    train_log l;
    ag_err err;
    CHECK(train_log_start(&l, 0, 100, NULL, "bits/byte", &err));  // NULL: no files
    train_log_valid(&l, 0, 5.0);
    train_log_step(&l, 0, 4.0, false, NAN, 1e-3, 1000);   // not measured, not shown
    train_log_step(&l, 1, 3.0, true, NAN, 1e-3, 1000);    // measured: NaN
    train_log_step(&l, 2, 2.0, true, 2.5, 1e-3, 1000);    // measured: 2.5
    CHECK(train_log_end(&l, NULL, &err));
    fflush(stdout);
    CHECK(dup2(saved, fileno(stdout)) >= 0);
    close(saved);
    size_t len = 0;
    char *text = (char *)testing_read_file(path, &len);
    CHECK(text && strstr(text, "step 2/100 | bits/byte: train 3.000, valid nan |"));
    CHECK(text && strstr(text, "step 3/100 | bits/byte: train 2.000, valid 2.500 |"));
    CHECK(text && !strstr(text, "step 1/100"));
    free(text);
}

// The time left of a run of 10^9 steps whose first took 10 s: 10^10 s, printed whole (as
// an int it was undefined, and came out as "-35791394:-08 left").
static void test_a_long_time_left_is_printed_whole(void) {
    const char *path = testing_path("left.txt");
    fflush(stdout);
    const int saved = dup(fileno(stdout));
    CHECK(saved >= 0 && freopen(path, "w", stdout));
    progress p;
    CHECK(progress_start(&p, 0, 1000000001, NULL, "", NULL));
    p.start -= 10;  // the first step took 10 s (and a little more: the time to here)
    progress_line(&p, 0, true, "first");
    progress_end(&p, NULL);
    fflush(stdout);
    CHECK(dup2(saved, fileno(stdout)) >= 0);
    close(saved);
    size_t len = 0;
    char *text = (char *)testing_read_file(path, &len);
    // 10 s x 10^9 steps = 166666666 min 40 s, and 1000 s more for each microsecond more
    // than 10 s the step took here (up to 10 ms: 10^7 s, 166666 min).
    double minutes = 0;
    int seconds = -1;
    CHECK(text &&
          sscanf(text, "step 1/1000000001 | first | %lf:%d left", &minutes, &seconds) == 2);
    CHECK(minutes >= 166666666 && minutes <= 166666666 + 166666 && seconds >= 0 && seconds < 60);
    CHECK(text && !strchr(text, '-'));
    free(text);
}

// A heatmap titled by text holding XML's specials (a source sentence, in dates): written
// raw, "a < b & c" made the SVG no XML a browser shows.
static void test_a_heatmap_title_is_escaped(void) {
    ag_tensor *w = ag_tensor_zeros(AG_F32, 2, (int[]){2, 3});
    ag_tensor_f32(w)[1] = 1;
    const char *path = testing_path("heatmap.svg");
    ag_err err;
    CHECK(heatmap_svg(path, "a < b & c > d", w, 2, 3, "xy", "a&<", &err));
    size_t len = 0;
    char *text = (char *)testing_read_file(path, &len);
    CHECK(text && strstr(text, ">a &lt; b &amp; c &gt; d</text>"));
    CHECK(text && !strstr(text, "a < b") && !strstr(text, "& c"));
    CHECK(text && strstr(text, ">&amp;</text>") && strstr(text, ">&lt;</text>"));
    free(text);
    ag_tensor_free(w);
}

// A NaN attention weight is drawn, in its own colour: fmax(NaN, 0) shaded it as a weight
// of 0, white, and heatmap_svg left its cell out, so a NaN looked like no attention.
static void test_a_nan_weight_is_not_shaded_as_zero(void) {
    char nan_color[8], zero[8], one[8];
    heatmap_shade(NAN, nan_color);
    heatmap_shade(0, zero);
    heatmap_shade(1, one);
    CHECK(strcmp(zero, "#ffffff") == 0 && strcmp(one, "#08306b") == 0);
    CHECK(strcmp(nan_color, HEATMAP_NAN_COLOR) == 0);
    CHECK(strcmp(nan_color, zero) != 0 && strcmp(nan_color, one) != 0);
    ag_tensor *w = ag_tensor_zeros(AG_F32, 2, (int[]){2, 3});
    ag_tensor_f32(w)[4] = NAN;  // row 1, column 1
    const char *path = testing_path("heatmap_nan.svg");
    ag_err err;
    CHECK(heatmap_svg(path, "weights", w, 2, 3, "xy", "abc", &err));
    size_t len = 0;
    char *text = (char *)testing_read_file(path, &len);
    CHECK(text && strstr(text, "fill=\"" HEATMAP_NAN_COLOR "\"/>"));
    free(text);
    ag_tensor_free(w);
}

// A plot or a heatmap whose write fails (here a file size limit of 1 KB; a full disk
// alike) returns false naming the file, and an earlier picture at its path stays whole:
// written in place, it was cut at the limit, and tiny_lm then ended with exit status 0.
static void test_a_failed_write_keeps_the_earlier_picture(void) {
    const char *plot = testing_path("kept_plot.svg"), *heat = testing_path("kept_heat.svg");
    const double x[2] = {1, 2}, y[2] = {3, 2.5};
    plot_series s = {"train", "#1f77b4", x, y, 2};
    ag_tensor *w = ag_tensor_zeros(AG_F32, 2, (int[]){24, 24});
    ag_err err;
    CHECK(plot_svg(plot, "loss", "step", "bits/byte", &s, 1, &err));
    CHECK(heatmap_svg(heat, "weights", w, 24, 24, "abcdefghijklmnopqrstuvwx",
                      "abcdefghijklmnopqrstuvwx", &err));
    size_t plot_len = 0, heat_len = 0;
    char *plot_text = (char *)testing_read_file(plot, &plot_len);
    char *heat_text = (char *)testing_read_file(heat, &heat_len);
    CHECK(plot_len > 1024 && heat_len > 1024);
    const testing_file_size limit = testing_file_size_limit(1024);
    const double y2[2] = {4, 1};
    s.y = y2;
    CHECK(!plot_svg(plot, "loss", "step", "bits/byte", &s, 1, &err));
    CHECK(strstr(err.msg, plot) != NULL);
    CHECK(!heatmap_svg(heat, "other weights", w, 24, 24, "abcdefghijklmnopqrstuvwx",
                       "abcdefghijklmnopqrstuvwx", &err));
    CHECK(strstr(err.msg, heat) != NULL);
    testing_file_size_restore(limit);
    size_t len = 0;
    char *now = (char *)testing_read_file(plot, &len);
    CHECK(now && plot_text && len == plot_len && memcmp(now, plot_text, len) == 0);
    free(now);
    now = (char *)testing_read_file(heat, &len);
    CHECK(now && heat_text && len == heat_len && memcmp(now, heat_text, len) == 0);
    free(now);
    free(plot_text);
    free(heat_text);
    ag_tensor_free(w);
}

// The CSV was opened with fopen(path, "w") (or "r+" to continue it): open for the whole
// run, its descriptor went into every program the process started meanwhile.
static bool closes_on_exec(FILE *f) {
    const int flags = f ? fcntl(fileno(f), F_GETFD) : -1;
    return flags >= 0 && (flags & FD_CLOEXEC);
}

static void test_the_csv_is_open_close_on_exec(void) {
    char prefix[700];
    snprintf(prefix, sizeof prefix, "%s", testing_path("run"));
    progress p;
    ag_err err = {{0}};
    CHECK(progress_start(&p, 0, 10, prefix, "step,loss", &err));
    CHECK(closes_on_exec(p.csv));
    progress_csv(&p, "%d,%g", 1, 0.5);
    CHECK(progress_end(&p, &err));
    CHECK(progress_start(&p, 1, 10, prefix, "step,loss", &err));  // continued
    CHECK(closes_on_exec(p.csv));
    CHECK(progress_end(&p, &err));
    testing_remove_files("run");
}

int main(void) {
    RUN(test_ticks_end_at_any_magnitude);
    RUN(test_a_heatmap_title_is_escaped);
    RUN(test_a_nan_weight_is_not_shaded_as_zero);
    RUN(test_a_nan_validation_loss_is_shown_as_one);
    RUN(test_a_long_time_left_is_printed_whole);
    RUN(test_a_failed_write_keeps_the_earlier_picture);
    RUN(test_the_csv_is_open_close_on_exec);
    testing_remove_tmpdir();
    return testing_summary();
}
