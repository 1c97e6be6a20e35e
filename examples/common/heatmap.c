// An SVG heatmap of attention weights: one row per query, one column per key, each cell
// shaded by its weight, one character labelling each row and column.
#include "heatmap.h"

#include "escape.h"
#include "staged_file.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { CELL = 16, LABEL = 16, MARGIN = 24, TITLE = 34 };

void heatmap_shade(double w, char out[8]) {
    // A NaN stays visible: fmax(NaN, 0) is 0, and a NaN weight was drawn white, as a
    // weight of 0 (the cell not drawn at all), which it is not.
    if (isnan(w)) {
        snprintf(out, 8, "%s", HEATMAP_NAN_COLOR);
        return;
    }
    const double t = sqrt(fmin(fmax(w, 0.0), 1.0));
    snprintf(out, 8, "#%02x%02x%02x", (int)lround(255 + t * (8 - 255)),
             (int)lround(255 + t * (48 - 255)), (int)lround(255 + t * (107 - 255)));
}

// One character of a label: a space shown as a middle dot.
static void put_label_char(char c, FILE *f) {
    if (c == ' ')
        fputs("&#183;", f);
    else
        put_xml(&c, 1, f);
}

bool heatmap_svg(const char *path, const char *title, const ag_tensor *w, int rows, int cols,
                 const char *row_labels, const char *col_labels, ag_err *err) {
    int width = 2 * MARGIN + LABEL + cols * CELL;
    const int title_width = 2 * MARGIN + 8 * (int)strlen(title);  // 13px monospace: ~8px a glyph
    if (width < title_width) width = title_width;
    const int height = TITLE + LABEL + rows * CELL + MARGIN;
    staged_file out;
    FILE *f = staged_open(&out, path, err);
    if (!f) return false;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"monospace\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"20\" font-size=\"13\">",
            width, height, MARGIN);
    put_xml(title, strlen(title), f);
    fputs("</text>\n", f);
    const int x0 = MARGIN + LABEL, y0 = TITLE + LABEL;
    for (int c = 0; c < cols; c++) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", x0 + c * CELL + CELL / 2,
                y0 - 4);
        put_label_char(col_labels[c], f);
        fputs("</text>\n", f);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#c8c8c8\"/>\n",
            x0, y0, cols * CELL, rows * CELL);
    for (int r = 0; r < rows; r++) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", x0 - 4,
                y0 + r * CELL + CELL - 4);
        put_label_char(row_labels[r], f);
        fputs("</text>\n", f);
        for (int c = 0; c < cols; c++) {
            char color[8];
            heatmap_shade(ag_tensor_item(w, (size_t)r * cols + c), color);
            if (strcmp(color, "#ffffff") != 0)
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>\n",
                        x0 + c * CELL, y0 + r * CELL, CELL, CELL, color);
        }
    }
    fputs("</svg>\n", f);
    return staged_commit(&out, path, err);
}
