// T5's relative position buckets (Raffel et al. 2020), a learned table [h, num_buckets]:
// query i, key j of head `head` add table[head, bucket(j - i)]. The buckets are those of
// HuggingFace's T5Attention._relative_position_bucket: half for each direction when
// bidirectional (the causal variant gives every later key the bucket of distance 0), in
// each half exact buckets for |j - i| < max_exact = (its buckets) / 2, then logarithmic
// ones up to max_distance, then the last.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "pos.h"

static void t5_defaults(agi_pos *p) {
    if (p->p.max_distance == 0) p->p.max_distance = 128;
    if (p->p.num_buckets == 0) p->p.num_buckets = 32;
}

// The logarithmic buckets need max_exact >= 1 exact ones before them, and a range
// (max_exact, max_distance] to spread over: num_buckets >= 4 and max_distance >
// num_buckets / 4 bidirectional, >= 2 and > num_buckets / 2 causal.
static bool t5_check(const agi_pos *p, bool every_variant, char *why, size_t size) {
    const int nb = p->p.num_buckets, maxd = p->p.max_distance;
    if (every_variant) {
        if (nb >= 4 && maxd > nb / 2) return true;
        snprintf(why, size, "T5 positions need num_buckets >= 4 and max_distance > "
                 "num_buckets / 2 (the exact buckets of the causal variant), got num_buckets %d "
                 "and max_distance %d", nb, maxd);
        return false;
    }
    const int exact = p->p.bidirectional ? 4 : 2;  // max_exact = num_buckets / exact
    if (nb >= exact && maxd > nb / exact) return true;
    snprintf(why, size, "T5 positions need num_buckets >= %d and max_distance > num_buckets / "
             "%d (%s), got num_buckets %d and max_distance %d", exact, exact,
             p->p.bidirectional ? "bidirectional" : "causal", nb, maxd);
    return false;
}

static int t5_cols(const ag_pos_bias *p) { return p->num_buckets; }

static void t5_rule(const ag_pos_bias *p, char *buf, size_t size) {
    snprintf(buf, size, "num_buckets = %d, max_distance > num_buckets / 4 (/ 2 causal)",
             p->num_buckets);
}

// Step by step as HuggingFace computes it, the logarithm in float32 as torch does there.
static int t5_column(const ag_pos_bias *p, int r) {
    int bucket = 0, nb = p->num_buckets;
    if (p->bidirectional) {
        nb /= 2;
        bucket += r > 0 ? nb : 0;
        r = abs(r);
    } else {
        r = r < 0 ? -r : 0;
    }
    const int max_exact = nb / 2;
    if (r < max_exact) return bucket + r;
    const float ratio = logf((float)r / (float)max_exact) /
                        (float)log((double)p->max_distance / max_exact) *
                        (float)(nb - max_exact);
    const long large = max_exact + (long)ratio;
    return bucket + (int)(large < nb - 1 ? large : nb - 1);
}

const agi_pos_scheme agi_pos_t5 = {
    .name = "T5",
    .title = "T5",
    .defaults = t5_defaults,
    .check = t5_check,
    .table_cols = t5_cols,
    .table_rule = t5_rule,
    .column = t5_column,
};
