// ALiBi (Press et al. 2022): no parameters, a fixed slope per head. Query i, key j of head
// `head` add -slope_head |i - j| bidirectional, or slope_head (j - i) causal: -slope
// (i - j) for the keys j <= i a causal mask leaves (for a later key the term is positive
// but the key is masked; softmax is unchanged by the per-row shift between the two forms).
#include <math.h>
#include <stdlib.h>

#include "pos.h"

// The paper's slopes: for h a power of two, 2^(-8 (k + 1) / h); otherwise those of the
// power of two p just below h, then every other slope of 2p for the remaining heads.
static double slope(int k, int h) {
    int p = 1;
    while (p <= h / 2) p *= 2;  // p * 2 <= h, without overflowing for h >= 2^30
    if (k < p) return pow(2.0, -8.0 * (k + 1) / p);
    return pow(2.0, -8.0 * (2 * (k - p) + 1) / (2.0 * p));  // 2 p is 2^31 for h > 2^30
}

static double alibi_slope(const ag_pos_bias *p, int head) { return slope(head, p->heads); }

static double alibi_value(const ag_pos_bias *p, int r) {
    return p->bidirectional ? -abs(r) : r;  // times the slope: -slope |r|, or slope r
}

const agi_pos_scheme agi_pos_alibi = {
    .name = "ALIBI",
    .title = "ALiBi",
    .head_scale = alibi_slope,
    .value = alibi_value,
    .prune_refusal = "ALiBi's slopes depend on the head count",
};
