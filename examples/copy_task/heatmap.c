// One panel per (layer, head): rows are queries, columns are keys, each cell
// shaded by its attention weight, tokens on both axes.
#include "heatmap.h"

#include "../common/escape.h"
#include "../common/heatmap.h"
#include "../common/staged_file.h"

#include <stdio.h>
#include <string.h>

#define CELL 12   // px per cell
#define LABEL 14  // px for the token labels
#define GAP 28    // px between panels
#define TITLE 34  // px for the picture's title

static void label(FILE *f, double x, double y, const char *anchor, char c) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">", x, y, anchor);
    put_xml(&c, 1, f);
    fputs("</text>\n", f);
}

bool heatmap_write(const char *path, const char *title, ag_tensor *const weights[], int layers,
                   const int32_t *query_tokens, const int32_t *key_tokens,
                   const ag_seqdata *d, ag_err *err) {
    int heads = weights[0]->shape[1], T = weights[0]->shape[2], S = weights[0]->shape[3];
    for (int l = 1; l < layers; l++)  // after --prune, layers may differ
        if (weights[l]->shape[1] > heads) heads = weights[l]->shape[1];
    int panel_w = LABEL + S * CELL, panel_h = LABEL + T * CELL;
    int width = heads * panel_w + (heads - 1) * GAP + 2 * GAP;
    int height = TITLE + layers * (panel_h + GAP + 16) + GAP;
    staged_file out;  // an earlier run's picture stays whole if this one cannot be written
    FILE *f = staged_open(&out, path, err);
    if (!f) return false;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"monospace\" font-size=\"10\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"20\" font-size=\"13\">",
            width, height, width, height, GAP);
    put_xml(title, strlen(title), f);
    fputs("</text>\n", f);
    for (int l = 0; l < layers; l++) {
        for (int h = 0; h < weights[l]->shape[1]; h++) {
            double x0 = GAP + h * (panel_w + GAP), y0 = TITLE + l * (panel_h + GAP + 16);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">layer %d, head %d</text>\n",
                    x0 + LABEL, y0 + 10, l + 1, h + 1);
            y0 += 16;
            for (int s = 0; s < S; s++)  // keys along the top
                label(f, x0 + LABEL + s * CELL + CELL / 2.0, y0 + LABEL - 4, "middle",
                      ag_seqdata_char(d, key_tokens[s]));
            fprintf(f,  // the frame; cells that would be white are not drawn
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"none\" "
                    "stroke=\"#c8c8c8\"/>\n",
                    x0 + LABEL, y0 + LABEL, S * CELL, T * CELL);
            for (int t = 0; t < T; t++) {  // queries down the side
                double y = y0 + LABEL + t * CELL;
                label(f, x0 + LABEL - 3, y + CELL - 3, "end", ag_seqdata_char(d, query_tokens[t]));
                for (int s = 0; s < S; s++) {
                    double w = ag_tensor_item(weights[l], (((size_t)h * T + t) * S + s));
                    char color[8];
                    heatmap_shade(w, color);
                    if (!strcmp(color, "#ffffff")) continue;
                    const char qc = ag_seqdata_char(d, query_tokens[t]),
                               kc = ag_seqdata_char(d, key_tokens[s]);
                    fprintf(f,
                            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"%s\">"
                            "<title>",
                            x0 + LABEL + s * CELL, y, CELL, CELL, color);
                    put_xml(&qc, 1, f);
                    fputs(" attends to ", f);
                    put_xml(&kc, 1, f);
                    fprintf(f, ": %.3f</title></rect>\n", w);
                }
            }
        }
    }
    fputs("</svg>\n", f);
    return staged_commit(&out, path, err);
}
