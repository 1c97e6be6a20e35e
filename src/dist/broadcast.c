// Every rank starts from rank 0's parameters.
#include "dist_internal.h"

void ag_dist_broadcast_params(ag_params *ps) {
    MPI_Comm comm = agi_dist_comm();
    if (comm == MPI_COMM_NULL) return;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    // The stores must match element for element, or the broadcast (and every
    // all-reduce after it) would mix unrelated parameters.
    long long mine[3] = {(long long)ag_params_buffer_len(ps), (long long)ag_params_dtype(ps),
                         ag_params_count(ps)};
    long long *all = agi_dist_scratch(sizeof mine * (size_t)size);
    MPI_Allgather(mine, 3, MPI_LONG_LONG, all, 3, MPI_LONG_LONG, comm);
    for (int r = 1; r < size; r++) {
        const long long *o = all + 3 * r;
        if (o[0] != all[0] || o[1] != all[1] || o[2] != all[2]) {
            ag_error("dist_broadcast_params: rank %d's store (%lld parameters, %lld %s elements) "
                     "differs from rank 0's (%lld parameters, %lld %s elements)",
                     r, o[2], o[0], ag_dtype_name((ag_dtype)o[1]), all[2], all[0],
                     ag_dtype_name((ag_dtype)all[1]));
            return;
        }
    }
    size_t len = ag_params_buffer_len(ps), es = ag_dtype_size(ag_params_dtype(ps));
    MPI_Datatype type = ag_params_dtype(ps) == AG_F64 ? MPI_DOUBLE : MPI_FLOAT;
    char *data = ag_params_data(ps);
    for (size_t at = 0; at < len; at += AGI_DIST_PIECE) {
        size_t n = len - at < AGI_DIST_PIECE ? len - at : AGI_DIST_PIECE;
        MPI_Bcast(data + at * es, (int)n, type, 0, comm);
    }
}
