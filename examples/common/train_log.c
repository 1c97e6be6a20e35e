#include "train_log.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "path.h"

// The points of the steps up to `first` from the CSV a resumed run continues (the rows
// progress_start kept): the plot of a resumed run began at the resume. The validation
// loss at `first` is left to the run, which measures it again (train_log_valid).
static void curves_from_csv(train_log *l, const char *prefix, int first) {
    char path[1024], line[512];
    FILE *f = path_beside(path, sizeof path, prefix, "", ".csv") ? fopen(path, "re") : NULL;
    while (f && fgets(line, sizeof line, f)) {
        char *end;
        const long step = strtol(line, &end, 10);
        if (line[0] < '0' || line[0] > '9' || *end != ',') continue;  // the header
        if (step > first) break;
        const double train = strtod(end + 1, &end);
        if (*end != ',') continue;
        const double valid = strtod(end + 1, &end);
        if (*end != ',') continue;
        loss_curves_add(&l->curves, 0, (double)step, train);
        if (!isnan(valid) && step < first) loss_curves_add(&l->curves, 1, (double)step, valid);
    }
    if (f) fclose(f);
}

bool train_log_start(train_log *l, int first, int last, const char *prefix, const char *unit,
                     ag_err *err) {
    *l = (train_log){.prefix = prefix, .unit = unit, .valid = NAN};
    char header[128];
    int u = (int)strcspn(unit, "/");
    snprintf(header, sizeof header, "step,train_%.*s,valid_%.*s,lr,tokens_per_s", u, unit, u,
             unit);
    if (!progress_start(&l->p, first, last, prefix, header, err)) return false;
    if (prefix && first > 0) curves_from_csv(l, prefix, first);
    return true;
}

void train_log_valid(train_log *l, int first, double valid) {
    l->valid = valid;
    loss_curves_add(&l->curves, 1, first, valid);
}

void train_log_step(train_log *l, int step, double train, bool validated, double valid,
                    double lr, double tps) {
    // NAN stood for "not measured": a validation loss measured as NaN was shown as the
    // last finite one, and its line not forced.
    if (validated) train_log_valid(l, step + 1, valid);
    loss_curves_add(&l->curves, 0, step + 1, train);
    progress_line(&l->p, step, validated, "%s: train %.3f, valid %.3f | %.0f tok/s", l->unit,
                  train, l->valid, tps);
    progress_csv(&l->p, "%d,%.17g,%.17g,%.17g,%.1f", step + 1, train, validated ? valid : NAN,
                 lr, tps);
}

bool train_log_end(train_log *l, const char *title, ag_err *err) {
    if (l->ended) return true;
    l->ended = true;
    // A CSV whose rows met a full disk was lost without a word, and the run exited 0.
    bool ok = progress_end(&l->p, err);
    ag_err plot_err;
    const bool plotted = !title || !l->prefix ||
                         loss_curves_svg(&l->curves, l->prefix, title, l->unit, &plot_err);
    if (ok && !plotted) *err = plot_err;
    loss_curves_free(&l->curves);
    return ok && plotted;
}
