// Sampling a token from a row of logits: greedy, temperature, top-k, top-p.
//
// Probabilities are computed in double whatever the logits' dtype. Top-k and
// top-p need the tokens in order of probability: a full sort of V indices,
// which is cheap next to a model step for byte- or word-level vocabularies,
// and is skipped when neither filter is on.
#include <math.h>
#include <stdlib.h>

#include "attograd/generate.h"
#include "nn.h"

struct ag_sampler {
    int vocab;
    ag_sample_config cfg;
    ag_pcg32 rng;
    double *p;  // [vocab]
    int *order; // [vocab]
};

ag_sampler *ag_sampler_new(int vocab, const ag_sample_config *cfg, uint64_t seed,
                           uint64_t stream) {
    if (vocab < 1 || !cfg || !(cfg->temperature >= 0) || !isfinite(cfg->temperature) ||
        cfg->top_k < 0 || !(cfg->top_p >= 0 && cfg->top_p <= 1)) {
        ag_error("sampler: needs vocab >= 1, temperature >= 0, top_k >= 0, top_p in [0, 1]; "
                 "got vocab %d, temperature %g, top_k %d, top_p %g",
                 vocab, cfg ? cfg->temperature : NAN, cfg ? cfg->top_k : 0,
                 cfg ? cfg->top_p : NAN);
        return NULL;
    }
    ag_sampler *s = agi_calloc(sizeof *s);
    s->p = agi_calloc((size_t)vocab * sizeof *s->p);
    s->order = agi_calloc((size_t)vocab * sizeof *s->order);
    s->vocab = vocab;
    s->cfg = *cfg;
    if (s->cfg.top_p == 0) s->cfg.top_p = 1;  // a zeroed field: the filter is off
    ag_pcg32_seed(&s->rng, seed, stream);
    return s;
}

void ag_sampler_free(ag_sampler *s) {
    if (!s) return;
    agi_free(s->p);
    agi_free(s->order);
    agi_free(s);
}

// qsort has no context argument: the probabilities being sorted sit here for
// the comparison. A sampler is used by one thread at a time, as a tape is.
static _Thread_local const double *sort_p;

static int by_probability(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (sort_p[i] != sort_p[j]) return sort_p[i] > sort_p[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int ag_sampler_next(ag_sampler *s, const ag_tensor *logits, size_t row) {
    if (!s || !logits || (logits->dtype != AG_F32 && logits->dtype != AG_F64) ||
        logits->ndim < 1 || logits->shape[logits->ndim - 1] != s->vocab) {
        ag_error("sampler: logits %s must be f32 or f64 [..., %d]",
                 logits ? agi_shape(logits) : "NULL", s ? s->vocab : 0);
        return -1;
    }
    const int V = s->vocab;
    if (row >= logits->numel / (size_t)V) {
        ag_error("sampler: row %zu out of range for logits %s", row, agi_shape(logits));
        return -1;
    }
    double m = -INFINITY;
    int best = 0;
    for (int c = 0; c < V; c++) {
        double z = ag_tensor_item(logits, row * (size_t)V + (size_t)c);
        if (isnan(z)) {
            ag_error("sampler: row %zu of logits %s holds a NaN", row, agi_shape(logits));
            return -1;
        }
        s->p[c] = z;
        if (z > m) m = z, best = c;
    }
    if (m == -INFINITY) {
        ag_error("sampler: row %zu of logits %s is all -inf: no token has a probability", row,
                 agi_shape(logits));
        return -1;
    }
    if (s->cfg.temperature == 0) return best;
    if (m == INFINITY) {
        ag_error("sampler: row %zu of logits %s holds +inf: its probabilities at temperature %g "
                 "are NaN",
                 row, agi_shape(logits), s->cfg.temperature);
        return -1;
    }
    double total = 0;
    for (int c = 0; c < V; c++) total += s->p[c] = exp((s->p[c] - m) / s->cfg.temperature);
    int kept = V;
    bool filtered = (s->cfg.top_k > 0 && s->cfg.top_k < V) || s->cfg.top_p < 1;
    for (int c = 0; c < V; c++) s->order[c] = c;
    if (filtered) {
        sort_p = s->p;
        qsort(s->order, (size_t)V, sizeof *s->order, by_probability);
        if (s->cfg.top_k > 0 && s->cfg.top_k < kept) kept = s->cfg.top_k;
        if (s->cfg.top_p < 1) {
            double acc = 0;
            for (int i = 0; i < kept; i++) {
                acc += s->p[s->order[i]] / total;
                if (acc >= s->cfg.top_p) {
                    kept = i + 1;
                    break;
                }
            }
        }
        total = 0;
        for (int i = 0; i < kept; i++) total += s->p[s->order[i]];
    }
    double u = ag_pcg32_double(&s->rng) * total, acc = 0;
    for (int i = 0; i < kept; i++) {
        acc += s->p[s->order[i]];
        if (u < acc) return s->order[i];
    }
    return s->order[kept - 1];  // u rounded up to the total
}
