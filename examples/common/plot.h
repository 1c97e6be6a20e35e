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

// A training run's train and validation curves, grown point by point, and
// their plot (train in blue, validation in red).
typedef struct {
    double *x[2], *y[2];  // [0] train, [1] validation
    int n[2], cap[2];
} loss_curves;

void loss_curves_add(loss_curves *c, int which, double x, double y);
// Writes <prefix>.svg.
bool loss_curves_svg(const loss_curves *c, const char *prefix, const char *title,
                     const char *ylabel, ag_err *err);
void loss_curves_free(loss_curves *c);

#endif
