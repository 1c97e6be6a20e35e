// Small sums over ranks (losses, counts), in rank order.
//
// Point to point, as the all-reduce's gathered path, not a collective: every rank sends its
// values (its count first) to every other and probes what comes before receiving it, so a
// rank that is in the gradients' all-reduce or the broadcast, or has ended, or sums another
// count, is reported. With MPI_Allgather such a rank left the others waiting forever.
#include <limits.h>
#include <string.h>

#include "dist_internal.h"

// Whether what rank r sent (tag, count bytes at got) is a sum of this rank's n values
// (ctx); else false after reporting.
static bool sum_agrees(int r, int tag, int count, const char *got, const void *ctx) {
    const int n = *(const int *)ctx;
    long long theirs = -1;
    if (tag == AGI_DIST_TAG_SUM && (size_t)count >= sizeof theirs)
        memcpy(&theirs, got, sizeof theirs);
    if (tag == AGI_DIST_TAG_FAREWELL)
        ag_error("dist_sum: rank %d has ended (ag_dist_finalize) while this rank waits for its "
                 "values: the ranks ran different numbers of steps", r);
    else if (tag == AGI_DIST_TAG_BROADCAST)
        ag_error("dist_sum: rank %d is in ag_dist_broadcast_params where this rank sums "
                 "values: the ranks' calls differ", r);
    else if (tag != AGI_DIST_TAG_SUM)
        ag_error("dist_sum: rank %d is in the gradients' all-reduce (ag_dist_allreduce_grads) "
                 "where this rank sums values: the ranks' calls differ", r);
    else if ((size_t)count != sizeof(long long) + (size_t)n * sizeof(double) || theirs != n)
        ag_error("dist_sum: rank %d sums %lld values where this rank sums %d: n must be the "
                 "same on every rank", r, theirs, n);
    else
        return true;
    return false;
}

void ag_dist_sum(double *values, int n) {
    if (n < 0) {
        ag_error("dist_sum: n %d must be >= 0", n);
        return;
    }
    if (n > 0 && !values) {
        ag_error("dist_sum: values is NULL (n %d)", n);
        return;
    }
    if ((size_t)n > ((size_t)INT_MAX - sizeof(long long)) / sizeof(double)) {
        ag_error("dist_sum: n %d values are more than one message may carry", n);
        return;
    }
    MPI_Comm comm = agi_dist_comm();
    if (comm == MPI_COMM_NULL) return;
    int size;
    MPI_Comm_size(comm, &size);
    if (size == 1) return;
    // Each rank's block: its count, then its values.
    const size_t block = sizeof(long long) + (size_t)n * sizeof(double);
    char *mine = agi_dist_blocks_room(block, comm);
    const long long head = n;
    memcpy(mine, &head, sizeof head);
    if (n) memcpy(mine + sizeof head, values, (size_t)n * sizeof(double));
    const char *all = agi_dist_blocks(block, AGI_DIST_TAG_SUM, comm, sum_agrees, &n);
    if (!all) return;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < size; r++) {
            double v;
            memcpy(&v, all + (size_t)r * block + sizeof head + (size_t)i * sizeof v, sizeof v);
            s = r == 0 ? v : s + v;
        }
        values[i] = s;
    }
}
