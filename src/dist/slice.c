// A rank's slice of a global batch.
#include "attograd/dist.h"

ag_dist_slice ag_dist_batch_slice(int global_batch, int rank, int size) {
    ag_dist_slice s = {0, 0, 0.0};
    if (size < 1 || rank < 0 || rank >= size) {
        ag_error("dist_batch_slice: rank %d is not one of %d processes", rank, size);
        return s;
    }
    if (global_batch < size) {
        ag_error("dist_batch_slice: a global batch of %d leaves some of the %d processes "
                 "without data; use a batch of at least %d",
                 global_batch, size, size);
        return s;
    }
    int base = global_batch / size, extra = global_batch % size;
    s.count = base + (rank < extra);
    s.first = rank * base + (rank < extra ? rank : extra);
    s.weight = (double)s.count / global_batch;
    return s;
}
