// Sizes computed from shapes and counts, checked: every byte count the library
// allocates from user input goes through here or internal.h's inline helpers, so that
// none wraps and none exceeds AG_MAX_BYTES (base.h says why that bound).
#include <string.h>

#include "internal.h"

int agi_max_bytes_log2(void) {
    int k = 0;
    while (((size_t)1 << k) < AG_MAX_BYTES) k++;
    return k;
}

// Written digit by digit, not by snprintf: some ops still describe their operands'
// shapes before they know whether a message is needed, and printf's cost showed in a
// decode step's profile (README, "Decoding speed"). The text is "[2,3,4]", cut to 63
// characters.
const char *agi_shape_of(int ndim, const int shape[]) {
    static _Thread_local char bufs[4][64];
    static _Thread_local int next;
    char *b = bufs[next];
    next = (next + 1) % 4;
    size_t n = 0;
    const size_t room = sizeof bufs[0] - 1;
    b[n++] = '[';
    for (int i = 0; i < ndim && shape && n < room; i++) {
        char digits[12];
        int d = 0;
        long long v = shape[i];
        for (unsigned long long u = (unsigned long long)(v < 0 ? -v : v); d == 0 || u;
             u /= 10)
            digits[d++] = (char)('0' + u % 10);
        if (i && n < room) b[n++] = ',';
        if (v < 0 && n < room) b[n++] = '-';
        while (d && n < room) b[n++] = digits[--d];
    }
    if (n < room) b[n++] = ']';
    b[n] = '\0';
    return b;
}

bool agi_valid_shape(const char *op, ag_dtype dt, int ndim, const int shape[]) {
    if (agi_dtype_size(dt) == 0) {
        ag_error("%s: unknown dtype %d", op, (int)dt);
        return false;
    }
    if (ndim < 0) {
        ag_error("%s: %d dimensions requested, a tensor has 0 to %d", op, ndim, AG_MAX_DIMS);
        return false;
    }
    if (ndim > AG_MAX_DIMS) {
        ag_error("%s: %d dimensions requested, at most %d are supported", op, ndim,
                 AG_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        ag_error("%s: the shape is NULL (%d dimensions requested)", op, ndim);
        return false;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1) {
            ag_error("%s: dimension %d has extent %d, extents must be >= 1", op, i,
                     shape[i]);
            return false;
        }
    }
    size_t bytes;
    if (!agi_shape_bytes(dt, ndim, shape, &bytes)) {
        ag_error("%s: %s %s is too large: more than the 2^%d bytes one tensor may hold", op,
                 ag_dtype_name(dt), agi_shape_of(ndim, shape), agi_max_bytes_log2());
        return false;
    }
    return true;
}
