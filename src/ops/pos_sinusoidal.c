// A fixed bias from sinusoidal embeddings (after Sandwich, Chi et al. 2023): the inner
// product of the sinusoidal embeddings (Vaswani et al.) of positions i and j, width D,
// depends on j - i alone, sum_c cos((j - i) w_c); less its value at j = i, it is 0 on the
// diagonal and negative elsewhere, falling off roughly logarithmically with distance, as
// T5's learned buckets do. Scaled per head as ALiBi's slopes are spread, lambda_head =
// h / (8 (head + 1)), so heads see near or far. No parameters are learned:
//     b(head, r) = lambda_head sum_{c=1..D/2} (cos(r w_c) - 1),  w_c = base^(-2c/D).
// A module takes D = its head_dim and base = its rope_base (10000).
#include <math.h>
#include <stdio.h>

#include "pos.h"

static void sinusoidal_defaults(agi_pos *p) {
    if (p->p.dims == 0) p->p.dims = p->head_dim;
    if (p->p.base == 0) p->p.base = 10000;
}

static bool sinusoidal_check(const agi_pos *p, bool every_variant, char *why, size_t size) {
    (void)every_variant;  // one variant: cos is even, so causal or not is the same term
    const double base = p->p.base == 0 ? 10000 : p->p.base;
    if (p->p.dims >= 2 && base > 0 && isfinite(base)) return true;
    snprintf(why, size, "sinusoidal positions need dims >= 2 (a module's head_dim) and a "
             "finite base > 0, got dims %d and base %g", p->p.dims, p->p.base);
    return false;
}

static double sinusoidal_value(const ag_pos_bias *p, int head, int r) {
    const double base = p->base == 0 ? 10000 : p->base;
    const int D = p->dims;
    double sum = 0;
    for (int c = 1; c <= D / 2; c++) sum += cos(r * pow(base, -2.0 * c / D)) - 1;
    return (double)p->heads / (8.0 * (head + 1)) * sum;
}

const agi_pos_scheme agi_pos_sinusoidal = {
    .name = "SINUSOIDAL",
    .title = "sinusoidal",
    .defaults = sinusoidal_defaults,
    .check = sinusoidal_check,
    .value = sinusoidal_value,
    .prune_refusal = "the sinusoidal bias's scales depend on the head count",
};
