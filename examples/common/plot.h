// A line plot of a few series as a standalone SVG file (a loss curve, say):
// axes with tick labels, a legend, no dependencies.
#ifndef EXAMPLES_PLOT_H
#define EXAMPLES_PLOT_H

#include <stdbool.h>

#include <attograd.h>

typedef struct {
    const char *label, *color;  // color as SVG takes it ("#1f77b4")
    const double *x, *y;
    int n;
} plot_series;

// Non-finite points are left out. Returns false with one line in err when the
// file cannot be written.
bool plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
              const plot_series *series, int n_series, ag_err *err);

#endif
