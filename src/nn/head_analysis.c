// What each attention head looks at, from its weights A [B, h, T, S] (the seeds'
// analyze_attention_heads):
//   entropy   mean over the queries of -sum_j a_ij log a_ij (nats; 0 log 0 = 0): low when
//             a head looks at few keys, log S when it spreads evenly;
//   distance  sum a_ij |i - j| / sum a_ij over all queries: how far back (or ahead) it looks;
//   strongest the (query, key) with the largest weight averaged over the batch.
// A fully masked query (a row of zeros) has no distribution: it is left out. A NaN is
// not a masked query: a NaN weight makes its head's entropy and distance NaN, and its
// strongest pair the first pair whose batch average is NaN (as torch.max ranks NaN).
#include <math.h>

#include "nn.h"

bool ag_attention_head_stats(const ag_tensor *w, ag_head_stats *stats) {
    if (!stats) {
        ag_error("attention_head_stats: the stats array is NULL (weights %s)",
                 w ? agi_shape(w) : "NULL");
        return false;
    }
    if (!w || !agi_is_float(w->dtype) || w->ndim != 4) {
        ag_error("attention_head_stats: weights %s must be f32 or f64 [B, h, T, S]",
                 agi_dtype_shape(w));
        return false;
    }
    // Else every element read would report it, one line each, and the stats be NaN.
    if (!w->data) {
        ag_error("attention_head_stats: weights %s have no data (a gradient view no backward "
                 "has reached)",
                 agi_shape(w));
        return false;
    }
    int B = w->shape[0], h = w->shape[1], T = w->shape[2], S = w->shape[3];
    for (int j = 0; j < h; j++) {
        double entropy = 0, dist = 0, mass = 0, best = -1;
        int rows = 0, bq = 0, bk = 0;
        for (int t = 0; t < T; t++)
            for (int s = 0; s < S; s++) {
                double avg = 0;
                for (int b = 0; b < B; b++)
                    avg += ag_tensor_item(w, (((size_t)b * h + j) * T + t) * S + s) / B;
                if ((avg > best || isnan(avg)) && !isnan(best)) best = avg, bq = t, bk = s;
            }
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                size_t row = (((size_t)b * h + j) * T + t) * S;
                double sum = 0, e = 0;
                for (int s = 0; s < S; s++) {
                    double a = ag_tensor_item(w, row + s);
                    sum += a;
                    if (a > 0 || isnan(a)) e -= a * log(a);
                    dist += a * fabs((double)(t - s));
                }
                if (sum > 0 || isnan(sum)) entropy += e, mass += sum, rows++;
            }
        stats[j] = (ag_head_stats){rows ? entropy / rows : 0, mass != 0 ? dist / mass : 0, bq, bk,
                                   best};
    }
    return true;
}

void ag_attention_head_stats_print(const ag_head_stats *stats, int heads,
                                   const double *importance[], const char *const names[],
                                   int n_importance, FILE *f) {
    if (!f || (heads > 0 && !stats) || (n_importance > 0 && (!importance || !names))) {
        ag_error("attention_head_stats_print: the %s is NULL (%d heads, %d importance columns)",
                 !f ? "file" : heads > 0 && !stats ? "stats array"
                     : !importance ? "importance array" : "names array",
                 heads, n_importance);
        return;
    }
    for (int i = 0; i < n_importance; i++)  // the table is not started with a hole in it
        if (!names[i] || (heads > 0 && !importance[i])) {
            ag_error("attention_head_stats_print: importance column %d of %d has a NULL %s "
                     "(%d heads)",
                     i, n_importance, !names[i] ? "name" : "score array", heads);
            return;
        }
    fprintf(f, "head  entropy  distance  strongest (q->k, weight)");
    for (int i = 0; i < n_importance; i++) fprintf(f, "  %10s", names[i]);
    fputc('\n', f);
    for (int j = 0; j < heads; j++) {
        const ag_head_stats *s = &stats[j];
        fprintf(f, "%4d  %7.3f  %8.2f  %4d -> %-4d %6.3f       ", j, s->entropy, s->distance,
                s->query, s->key, s->weight);
        for (int i = 0; i < n_importance; i++) fprintf(f, "  %10.4g", importance[i][j]);
        fputc('\n', f);
    }
}
