#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "path.h"
#include "staged_file.h"

void loss_curves_add(loss_curves *c, int which, double x, double y) {
    if (c->n[which] == c->cap[which]) {  // without the memory the point is left out
        const int cap = c->cap[which] ? 2 * c->cap[which] : 256;
        double *x = realloc(c->x[which], (size_t)cap * sizeof(double));
        if (x) c->x[which] = x;
        double *y = x ? realloc(c->y[which], (size_t)cap * sizeof(double)) : NULL;
        if (y) c->y[which] = y;
        if (!x || !y) return;
        c->cap[which] = cap;
    }
    c->x[which][c->n[which]] = x;
    c->y[which][c->n[which]] = y;
    c->n[which]++;
}

bool loss_curves_svg(const loss_curves *c, const char *prefix, const char *title,
                     const char *ylabel, ag_err *err) {
    char path[1024];
    if (!path_beside(path, sizeof path, prefix, "", ".svg")) {  // cut, it wrote elsewhere
        snprintf(err->msg, sizeof err->msg, "%.200s...svg: the name is too long", prefix);
        return false;
    }
    plot_series s[2] = {{"train", "#1f77b4", c->x[0], c->y[0], c->n[0]},
                        {"validation", "#d62728", c->x[1], c->y[1], c->n[1]}};
    return plot_svg(path, title, "step", ylabel, s, 2, err);
}

void loss_curves_free(loss_curves *c) {
    for (int i = 0; i < 2; i++) {
        free(c->x[i]);
        free(c->y[i]);
    }
    *c = (loss_curves){0};
}

enum { W = 640, H = 400, LEFT = 60, RIGHT = 20, TOP = 36, BOTTOM = 48 };

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about 5 ticks.
static double tick_step(double span) {
    double raw = span / 5, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

enum { MAX_TICKS = 16 };

// The ticks in [lo, hi] (multiples of tick_step's), at most MAX_TICKS, into t; their
// count. Where the step is below the spacing of doubles (losses of 1e16 within a few
// units) t += step never moved, and the loop wrote the file without end: a tick that
// does not move ends them.
static int ticks(double lo, double hi, double t[MAX_TICKS]) {
    const double step = tick_step(hi - lo), first = ceil(lo / step) * step;
    int n = 0;
    for (int k = 0; n < MAX_TICKS; k++) {
        const double v = first + k * step;
        if (!(v <= hi + 1e-9 * step) || (n && v <= t[n - 1])) break;
        t[n++] = v;
    }
    return n;
}

// A range of one value (or none) becomes one around it: two units, or a millionth of a
// value so large that a unit is below its spacing (v - 1 == v past 2^53).
static void widen(double *lo, double *hi) {
    if (*hi > *lo) return;
    const double v = isfinite(*lo) ? *lo : 0, pad = fmax(1, fabs(v) * 1e-6);
    *lo = v - pad;
    *hi = v + pad;
}

bool plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
              const plot_series *series, int n_series, ag_err *err) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int s = 0; s < n_series; s++)
        for (int i = 0; i < series[s].n; i++) {
            double x = series[s].x[i], y = series[s].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            x0 = fmin(x0, x);
            x1 = fmax(x1, x);
            y0 = fmin(y0, y);
            y1 = fmax(y1, y);
        }
    widen(&x0, &x1);
    widen(&y0, &y1);
    staged_file out;
    FILE *f = staged_open(&out, path, err);
    if (!f) return false;
    const double pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
#define PX(x) (LEFT + ((x) - x0) / (x1 - x0) * pw)
#define PY(y) (TOP + (y1 - (y)) / (y1 - y0) * ph)
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text x=\"%d\" y=\"22\" font-size=\"14\">%s</text>\n",
            W, H, LEFT, title);
    double t[MAX_TICKS];
    for (int i = 0, n = ticks(x0, x1, t); i < n; i++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>"
                   "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
                PX(t[i]), TOP, PX(t[i]), H - BOTTOM, PX(t[i]), H - BOTTOM + 16, t[i]);
    for (int i = 0, n = ticks(y0, y1, t); i < n; i++)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                LEFT, PY(t[i]), W - RIGHT, PY(t[i]), LEFT - 6, PY(t[i]) + 4, t[i]);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"black\"/>\n"
               "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n"
               "<text x=\"14\" y=\"%.0f\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 14 %.0f)\">%s</text>\n",
            LEFT, TOP, pw, ph, LEFT + pw / 2, H - 12, xlabel, TOP + ph / 2, TOP + ph / 2, ylabel);
    for (int s = 0; s < n_series; s++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                series[s].color);
        for (int i = 0; i < series[s].n; i++)
            if (isfinite(series[s].x[i]) && isfinite(series[s].y[i]))
                fprintf(f, "%.1f,%.1f ", PX(series[s].x[i]), PY(series[s].y[i]));
        fprintf(f, "\"/>\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                   "stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
                W - RIGHT - 150, TOP + 16 + 18 * s, W - RIGHT - 128, TOP + 16 + 18 * s,
                series[s].color, W - RIGHT - 122, TOP + 20 + 18 * s, series[s].label);
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    return staged_commit(&out, path, err);
}
