// Learned relative positions (Shaw et al. 2018, as a bias): a table [h, 2M+1], and query
// i, key j of head `head` add table[head, clip(j - i, -M, M) + M] to their score. Beyond
// M either way every distance shares the last column.
#include <limits.h>
#include <stdio.h>

#include "pos.h"

// num_buckets is not read here; it gets the config's documented default all the same, so
// that a module's config shows the same values whatever its scheme.
static void relative_defaults(agi_pos *p) {
    if (p->p.max_distance == 0) p->p.max_distance = 16;
    if (p->p.num_buckets == 0) p->p.num_buckets = 32;
}

static bool relative_check(const agi_pos *p, bool every_variant, char *why, size_t size) {
    const int M = p->p.max_distance;
    if (M >= (every_variant ? 1 : 0) && M <= (INT_MAX - 1) / 2) return true;
    snprintf(why, size, "max_distance %d and num_buckets %d must be >= 1 (relative positions: "
             "a table of 2 * max_distance + 1 columns, at most INT_MAX)",
             M, p->p.num_buckets);
    return false;
}

// -1 for an M whose table would not fit (the check refuses it).
static int relative_cols(const ag_pos_bias *p) {
    const int M = p->max_distance;
    return M >= 0 && M <= (INT_MAX - 1) / 2 ? 2 * M + 1 : -1;
}

static void relative_rule(const ag_pos_bias *p, char *buf, size_t size) {
    snprintf(buf, size, "2M+1, M = %d", p->max_distance);
}

static int relative_column(const ag_pos_bias *p, int r) {
    const int M = p->max_distance;
    return (r < -M ? -M : r > M ? M : r) + M;
}

const agi_pos_scheme agi_pos_relative = {
    .name = "RELATIVE",
    .title = "relative position",
    .defaults = relative_defaults,
    .check = relative_check,
    .table_cols = relative_cols,
    .table_rule = relative_rule,
    .column = relative_column,
};
