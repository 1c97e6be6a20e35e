// Every rank starts from rank 0's parameters.
//
// Point to point, as ag_dist_sum and the all-reduce, not collectives: rank 0 sends its
// store's layout to every rank and every rank its own to rank 0, each message probed
// before it is received, and rank 0's values follow to each rank whose layout agrees. A
// rank that is in a sum or the all-reduce, or has ended, is so named; with MPI_Allgather
// and MPI_Bcast the others waited for it forever, or took its farewell for a layout.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

// What one parameter looks like, in a form every rank can compare: its dims, its shape,
// and a hash of its name (FNV-1a, 63 bits so that it stays a positive long long).
enum { LAYOUT = 6 };
// A store's layout message: its length, dtype and parameter count, then each parameter's
// layout.
enum { HEAD = 3 };

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

// Whether rank r's layout message is rank 0's (`zero`), both well formed (take_layout):
// the same count, element count and dtype, and then the same shape and name for each
// parameter. Stores that only add up to the same length ([4,8] where rank 0 has [8,4])
// would mix unrelated values. Rank 0 and rank r compare the same two messages, so both
// see a difference, and report it (false).
static bool same_layout(const ag_params *ps, const long long *zero, const long long *other,
                        int r) {
    if (memcmp(zero, other, sizeof *zero * HEAD) != 0) {
        ag_error("dist_broadcast_params: rank %d's store (%lld parameters, %lld %s elements) "
                 "differs from rank 0's (%lld parameters, %lld %s elements)",
                 r, other[2], other[0], ag_dtype_name((ag_dtype)other[1]), zero[2], zero[0],
                 ag_dtype_name((ag_dtype)zero[1]));
        return false;
    }
    for (int k = 0; k < (int)zero[2]; k++) {
        const long long *a = zero + HEAD + (size_t)k * LAYOUT;
        const long long *b = other + HEAD + (size_t)k * LAYOUT;
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
    return true;
}

// Rank r's layout message, received into `room` when it is `words` long longs as this
// rank's, else into memory of its own (freed by the caller when it is not `room`). NULL
// after reporting when rank r is elsewhere: in ag_dist_sum, in the all-reduce, or ended
// (its farewell stays for ag_dist_finalize, which takes one from every rank); or when what
// it sent is no layout (its head's count disagrees with its length). Whatever else came
// is received, so that it does not wait for the next call.
static long long *take_layout(int r, long long *room, size_t words, MPI_Comm comm) {
    MPI_Status st;
    MPI_Probe(r, MPI_ANY_TAG, comm, &st);
    if (st.MPI_TAG == AGI_DIST_TAG_FAREWELL) {
        ag_error("dist_broadcast_params: rank %d has ended (ag_dist_finalize) while this rank "
                 "broadcasts the parameters: the ranks' calls differ", r);
        return NULL;
    }
    int count;
    MPI_Get_count(&st, MPI_BYTE, &count);
    const bool fits = st.MPI_TAG == AGI_DIST_TAG_BROADCAST && (size_t)count == words * 8;
    long long *into = fits ? room : agi_dist_drop_room(count > 0 ? (size_t)count : 0);
    MPI_Recv(into, count, MPI_BYTE, r, st.MPI_TAG, comm, MPI_STATUS_IGNORE);
    const size_t got = (size_t)count / sizeof *into;
    if (st.MPI_TAG == AGI_DIST_TAG_BROADCAST && count % (int)sizeof *into == 0 && got >= HEAD &&
        into[2] >= 0 && (unsigned long long)into[2] == (got - HEAD) / LAYOUT &&
        (got - HEAD) % LAYOUT == 0)
        return into;
    if (into != room) free(into);
    if (st.MPI_TAG == AGI_DIST_TAG_BROADCAST)
        ag_error("dist_broadcast_params: rank %d sent %d bytes that are no store's layout, "
                 "where this rank waits for one: the ranks' broadcasts are out of step", r,
                 count);
    else if (st.MPI_TAG == AGI_DIST_TAG_SUM)
        ag_error("dist_broadcast_params: rank %d is in ag_dist_sum where this rank broadcasts "
                 "the parameters: the ranks' calls differ", r);
    else
        ag_error("dist_broadcast_params: rank %d is in the gradients' all-reduce "
                 "(ag_dist_allreduce_grads) where this rank broadcasts the parameters: the "
                 "ranks' calls differ", r);
    return NULL;
}

// Rank 0's values to rank r (rank 0), or from rank 0 (rank r), in pieces of an int count.
static void values(ag_params *ps, int r, bool send, MPI_Comm comm) {
    const size_t len = ag_params_buffer_len(ps), es = ag_dtype_size(ag_params_dtype(ps));
    const MPI_Datatype type = ag_params_dtype(ps) == AG_F64 ? MPI_DOUBLE : MPI_FLOAT;
    char *data = ag_params_data(ps);
    for (size_t at = 0; at < len; at += AGI_DIST_PIECE) {
        const int n = (int)(len - at < AGI_DIST_PIECE ? len - at : AGI_DIST_PIECE);
        if (send)
            MPI_Send(data + at * es, n, type, r, AGI_DIST_TAG_BROADCAST, comm);
        else
            MPI_Recv(data + at * es, n, type, 0, AGI_DIST_TAG_BROADCAST, comm,
                     MPI_STATUS_IGNORE);
    }
}

void ag_dist_broadcast_params(ag_params *ps) {
    if (!agi_dist_store_given(ps, "dist_broadcast_params")) return;
    MPI_Comm comm = agi_dist_comm();
    if (comm == MPI_COMM_NULL) return;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (size == 1) return;
    const int n = ag_params_count(ps);
    if ((size_t)n > ((size_t)INT_MAX / sizeof(long long) - HEAD) / LAYOUT) {  // an int count
        ag_error("dist_broadcast_params: %d parameters are more than can be compared", n);
        return;
    }
    // The requests (one for each rank), this rank's layout, and room for another's: a
    // layout within an int count (checked above), so nothing here wraps a size_t.
    const size_t words = HEAD + (size_t)n * LAYOUT, bytes = words * sizeof(long long);
    const size_t requests = ((size_t)size * sizeof(MPI_Request) + 63) & ~(size_t)63;
    char *base = agi_dist_scratch(requests + 2 * bytes);
    MPI_Request *sent = (MPI_Request *)base;
    long long *mine = (long long *)(base + requests), *room = mine + words;
    mine[0] = (long long)ag_params_buffer_len(ps);
    mine[1] = (long long)ag_params_dtype(ps);
    mine[2] = n;
    for (int k = 0; k < n; k++) layout_of(ag_params_at(ps, k), mine + HEAD + (size_t)k * LAYOUT);
    if (rank == 0) {
        for (int r = 1; r < size; r++)
            MPI_Isend(mine, (int)bytes, MPI_BYTE, r, AGI_DIST_TAG_BROADCAST, comm, &sent[r]);
        // Rank by rank, every rank: each whose layout agrees has its values, even when
        // another's differs (before it or after), as it waits for them once its own check
        // has passed; one that differs or is elsewhere is reported, not served.
        for (int r = 1; r < size; r++) {
            long long *theirs = take_layout(r, room, words, comm);
            const bool agrees = theirs && same_layout(ps, mine, theirs, r);
            if (theirs != room) free(theirs);
            if (agrees) {
                values(ps, r, true, comm);
                MPI_Wait(&sent[r], MPI_STATUS_IGNORE);
            } else {
                MPI_Request_free(&sent[r]);  // its receiver may never take it
            }
        }
        return;
    }
    MPI_Isend(mine, (int)bytes, MPI_BYTE, 0, AGI_DIST_TAG_BROADCAST, comm, &sent[0]);
    long long *zero = take_layout(0, room, words, comm);
    const bool ok = zero && same_layout(ps, zero, mine, rank);
    if (zero != room) free(zero);
    if (!ok) {
        MPI_Request_free(&sent[0]);  // rank 0 may never take it
        return;
    }
    MPI_Wait(&sent[0], MPI_STATUS_IGNORE);
    values(ps, 0, false, comm);
}
