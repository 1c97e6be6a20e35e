// Small sums over ranks (losses, counts), in rank order.
#include "dist_internal.h"

void ag_dist_sum(double *values, int n) {
    if (n > 0 && !values) {
        ag_error("dist_sum: values is NULL (n %d)", n);
        return;
    }
    MPI_Comm comm = agi_dist_comm();
    if (comm == MPI_COMM_NULL || n <= 0) return;
    int size;
    MPI_Comm_size(comm, &size);
    if (size == 1) return;
    // Everyone gathers everything and adds in rank order: the same bits on
    // every rank, which MPI_Allreduce does not promise.
    double *all = agi_dist_scratch(sizeof(double) * (size_t)n * (size_t)size);
    MPI_Allgather(values, n, MPI_DOUBLE, all, n, MPI_DOUBLE, comm);
    for (int i = 0; i < n; i++) {
        double s = all[i];
        for (int r = 1; r < size; r++) s += all[(size_t)r * n + i];
        values[i] = s;
    }
}
