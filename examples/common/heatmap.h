// An SVG heatmap of attention weights: which key each query reads, one character
// labelling each row (query) and each column (key).
#ifndef EXAMPLES_HEATMAP_H
#define EXAMPLES_HEATMAP_H

#include <stdbool.h>

#include <attograd.h>

// w: weights in [0, 1] whose first rows * cols elements are the picture, row-major (the
// first sequence of attention weights [B, T, S]); row_labels and col_labels: one character
// per row and per column. False with one line in err when the file cannot be written.
// A weight's colour as "#rrggbb": white to dark blue, the square root lifting small
// weights so that a spread of attention stays visible next to a sharp one. A NaN is
// HEATMAP_NAN_COLOR (red), never a weight's colour: NaN weights are not hidden as zeros.
#define HEATMAP_NAN_COLOR "#d62728"
void heatmap_shade(double w, char out[8]);

bool heatmap_svg(const char *path, const char *title, const ag_tensor *w, int rows, int cols,
                 const char *row_labels, const char *col_labels, ag_err *err);

#endif
