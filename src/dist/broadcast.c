// Every rank starts from rank 0's parameters.
#include <string.h>

#include "dist_internal.h"

// What one parameter looks like, in a form every rank can compare: its dims, its shape,
// and a hash of its name (FNV-1a, 63 bits so that it stays a positive long long).
enum { LAYOUT = 6 };

static void layout_of(const ag_tensor *t, long long out[LAYOUT]) {
    out[0] = t->ndim;
    for (int i = 0; i < AG_MAX_DIMS; i++) out[1 + i] = i < t->ndim ? t->shape[i] : 1;
    unsigned long long h = 1469598103934665603ULL;
    for (const char *c = t->name ? t->name : ""; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    out[5] = (long long)(h >> 1);
}

static const char *shape_text(const long long l[LAYOUT], char *buf, size_t size) {
    int shape[AG_MAX_DIMS];
    for (int i = 0; i < AG_MAX_DIMS; i++) shape[i] = (int)l[1 + i];
    ag_tensor t = {.ndim = (int)l[0]};
    memcpy(t.shape, shape, sizeof shape);
    return ag_tensor_shape_str(&t, buf, size);
}

// Whether every rank's store has rank 0's parameters, one by one: the same count, element
// count and dtype, and then the same shape and name for each. Stores that only add up to
// the same length ([4,8] where rank 0 has [8,4]) would mix unrelated values. False after
// reporting the first difference (every rank sees the same, and reports it).
static bool same_layout(ag_params *ps, MPI_Comm comm, int size) {
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
            return false;
        }
    }
    const int n = ag_params_count(ps);
    if (n == 0) return true;
    const size_t per = (size_t)n * LAYOUT;
    if (per > AGI_DIST_PIECE) {  // an MPI count is an int
        ag_error("dist_broadcast_params: %d parameters are more than can be compared", n);
        return false;
    }
    long long *buf = agi_dist_scratch(sizeof *buf * per * ((size_t)size + 1));
    long long *own = buf + per * (size_t)size;
    for (int k = 0; k < n; k++) layout_of(ag_params_at(ps, k), own + (size_t)k * LAYOUT);
    MPI_Allgather(own, (int)per, MPI_LONG_LONG, buf, (int)per, MPI_LONG_LONG, comm);
    for (int r = 1; r < size; r++) {
        for (int k = 0; k < n; k++) {
            const long long *a = buf + (size_t)k * LAYOUT;
            const long long *b = buf + per * (size_t)r + (size_t)k * LAYOUT;
            if (memcmp(a, b, sizeof *a * LAYOUT) == 0) continue;
            const char *name = ag_params_at(ps, k)->name;
            char sa[64], sb[64];
            if (memcmp(a, b, sizeof *a * (LAYOUT - 1)) != 0)
                ag_error("dist_broadcast_params: parameter %d ('%s' here) is %s on rank %d and "
                         "%s on rank 0", k, name ? name : "", shape_text(b, sb, sizeof sb), r,
                         shape_text(a, sa, sizeof sa));
            else
                ag_error("dist_broadcast_params: parameter %d ('%s' here) has another name on "
                         "rank %d than on rank 0", k, name ? name : "", r);
            return false;
        }
    }
    return true;
}

void ag_dist_broadcast_params(ag_params *ps) {
    MPI_Comm comm = agi_dist_comm();
    if (comm == MPI_COMM_NULL) return;
    int size;
    MPI_Comm_size(comm, &size);
    if (!same_layout(ps, comm, size)) return;
    size_t len = ag_params_buffer_len(ps), es = ag_dtype_size(ag_params_dtype(ps));
    MPI_Datatype type = ag_params_dtype(ps) == AG_F64 ? MPI_DOUBLE : MPI_FLOAT;
    char *data = ag_params_data(ps);
    for (size_t at = 0; at < len; at += AGI_DIST_PIECE) {
        size_t n = len - at < AGI_DIST_PIECE ? len - at : AGI_DIST_PIECE;
        MPI_Bcast(data + at * es, (int)n, type, 0, comm);
    }
}
