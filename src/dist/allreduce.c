// The gradient all-reduce, in an order fixed by the number of ranks and the
// buffer's size, never by timing. Each synchronisation between ranks costs a
// message latency (and, on a loaded machine, a wait for the other process to
// be scheduled), so the method depends on the size:
//
// Small buffers (at most AGI_DIST_GATHER_BYTES to receive) and two ranks: one
// exchange. Every rank receives every other rank's buffer and adds them in
// rank order, g_0 + g_1 + ... + g_{N-1}, the same bits everywhere; for two
// ranks that is as many bytes as the ring sends, in one round instead of two.
//
// Otherwise a ring. The buffer (len elements) is cut into N chunks, chunk c being elements
// [c*len/N, (c+1)*len/N). Reduce-scatter, N-1 rounds: in round s rank r sends
// chunk (r-s) mod N to rank r+1 and adds the chunk (r-s-1) mod N it receives
// from rank r-1 to its own; so chunk c's sum is formed as
//     ((g_c + g_{c+1}) + g_{c+2}) + ... + g_{c-1}     (ranks mod N)
// whatever the timing, and ends complete on rank c-1. All-gather, N-1 more
// rounds: the complete chunks travel once more around the ring, copied.
// Each rank sends 2 (N-1)/N x len elements in all, the least any all-reduce
// can (MPI_Allreduce may pick another algorithm, and another order).
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

#define AGI_DIST_GATHER_BYTES (1u << 20)

static size_t chunk_begin(size_t len, int c, int n) { return len * (size_t)c / (size_t)n; }

// The data tag of gradients of MPI type `type` (float or double).
static int data_tag(MPI_Datatype type) {
    return type == MPI_DOUBLE ? AGI_DIST_TAG_DATA_F64 : AGI_DIST_TAG_DATA;
}

// Sends to the right and receives from the left. False (after reporting) when what came
// from the left is the farewell of a rank that has ended (agi_dist_farewell): the ranks ran
// different numbers of steps, and waiting would be forever; or data of the other dtype or
// of another length than this rank's store expects: the ranks' stores differ, and adding
// what came would mix unrelated values (of another dtype, MPI would take its bytes).
// p + i elements of es bytes; NULL stays NULL (an empty store's buffers), as NULL + 0 is
// undefined in C (clang's UBSan stops there).
static const char *at(const char *p, size_t i, size_t es) { return p ? p + i * es : p; }

static bool exchange(const char *send, size_t send_n, char *recv, size_t recv_n, size_t es,
                     MPI_Datatype type, int right, int left, MPI_Comm comm) {
    // In pieces, for counts beyond an int; both sides cut the same way. At least one, even
    // empty: a rank whose store is empty meets the others' data, where waiting for its own
    // would be forever.
    size_t done_s = 0, done_r = 0;
    do {
        size_t ns = send_n - done_s < AGI_DIST_PIECE ? send_n - done_s : AGI_DIST_PIECE;
        size_t nr = recv_n - done_r < AGI_DIST_PIECE ? recv_n - done_r : AGI_DIST_PIECE;
        MPI_Request sent;
        MPI_Status got;
        MPI_Isend(at(send, done_s, es), (int)ns, type, right, data_tag(type), comm, &sent);
        MPI_Probe(left, MPI_ANY_TAG, comm, &got);
        // A farewell stays for ag_dist_finalize, which receives one from every rank.
        if (got.MPI_TAG == AGI_DIST_TAG_FAREWELL) {
            MPI_Request_free(&sent);  // its receiver is gone
            ag_error("dist_allreduce_grads: rank %d has ended (ag_dist_finalize) while this "
                     "rank waits for its gradients: the ranks ran different numbers of steps",
                     left);
            return false;
        }
        // Counted in the sender's elements (a piece of them fits an int; its bytes may not).
        const bool f64 = got.MPI_TAG == AGI_DIST_TAG_DATA_F64;
        const MPI_Datatype their = f64 ? MPI_DOUBLE : MPI_FLOAT;
        int count;
        MPI_Get_count(&got, their, &count);
        if (got.MPI_TAG == AGI_DIST_TAG_GATHER || got.MPI_TAG == AGI_DIST_TAG_SUM ||
            got.MPI_TAG == AGI_DIST_TAG_BROADCAST) {
            if (got.MPI_TAG != AGI_DIST_TAG_GATHER)
                ag_error("dist_allreduce_grads: rank %d is in %s where this rank is in the "
                         "gradients' all-reduce: the ranks' calls differ", left,
                         got.MPI_TAG == AGI_DIST_TAG_SUM ? "ag_dist_sum"
                                                         : "ag_dist_broadcast_params");
            else
                ag_error("dist_allreduce_grads: rank %d gathers a store small enough to send "
                         "whole, where this rank's runs the ring: the ranks' parameter stores "
                         "differ", left);
            MPI_Get_count(&got, MPI_BYTE, &count);
            void *drop = agi_dist_drop_room(count > 0 ? (size_t)count : 0);
            MPI_Recv(drop, count, MPI_BYTE, left, got.MPI_TAG, comm, MPI_STATUS_IGNORE);
            free(drop);
            MPI_Request_free(&sent);  // its receiver is elsewhere: it takes no ring message
            return false;
        }
        if (got.MPI_TAG != data_tag(type) || (size_t)count != nr) {
            ag_error("dist_allreduce_grads: rank %d sent %d %s gradients where this rank's "
                     "store expects %zu %s: the ranks' parameter stores differ",
                     left, count, f64 ? "f64" : "f32", nr, type == MPI_DOUBLE ? "f64" : "f32");
            // Received, so that it does not wait for the next call.
            void *drop = agi_dist_drop_room(count > 0 ? (size_t)count * (f64 ? 8 : 4) : 0);
            MPI_Recv(drop, count, their, left, got.MPI_TAG, comm, MPI_STATUS_IGNORE);
            free(drop);
            MPI_Wait(&sent, MPI_STATUS_IGNORE);
            return false;
        }
        MPI_Recv((char *)at(recv, done_r, es), (int)nr, type, left, got.MPI_TAG, comm,
                 MPI_STATUS_IGNORE);
        MPI_Wait(&sent, MPI_STATUS_IGNORE);
        done_s += ns, done_r += nr;
    } while (done_s < send_n || done_r < recv_n);
    return true;
}

void agi_dist_farewell(MPI_Comm comm) {
    int rank, n;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &n);
    if (n == 1) return;
    MPI_Request *sent = agi_dist_scratch((sizeof *sent + 1) * (size_t)n);  // and n marks
    for (int r = 0; r < n; r++)
        if (r != rank) MPI_Isend(NULL, 0, MPI_BYTE, r, AGI_DIST_TAG_FAREWELL, comm, &sent[r]);
    // A rank still in an all-reduce, a sum or the broadcast takes the farewell for what it
    // waits for and reports; none of them is a collective, which would meet this gather.
    // Only when all have arrived here does it complete.
    char mark = 1, *marks = (char *)(sent + n);
    MPI_Allgather(&mark, 1, MPI_BYTE, marks, 1, MPI_BYTE, comm);
    for (int r = 0; r < n; r++) {
        if (r == rank) continue;
        MPI_Recv(NULL, 0, MPI_BYTE, r, AGI_DIST_TAG_FAREWELL, comm, MPI_STATUS_IGNORE);
        MPI_Wait(&sent[r], MPI_STATUS_IGNORE);
    }
}

static void scale(void *g, size_t len, ag_dtype dt, double w) {
    if (w == 1.0) return;
    if (dt == AG_F64) {
        double *x = g;
        for (size_t i = 0; i < len; i++) x[i] *= w;
    } else {
        float *x = g, wf = (float)w;
        for (size_t i = 0; i < len; i++) x[i] *= wf;
    }
}

// dst[i] = dst[i] + next[i]: the running sum first.
static void add_into_after(void *dst, const void *next, size_t n, ag_dtype dt) {
    if (dt == AG_F64) {
        double *d = dst;
        const double *x = next;
        for (size_t i = 0; i < n; i++) d[i] = d[i] + x[i];
    } else {
        float *d = dst;
        const float *x = next;
        for (size_t i = 0; i < n; i++) d[i] = d[i] + x[i];
    }
}

// dst[i] = partial[i] + dst[i]: the partial sum from the left comes first.
static void add_into(void *dst, const void *partial, size_t n, ag_dtype dt) {
    if (dt == AG_F64) {
        double *d = dst;
        const double *p = partial;
        for (size_t i = 0; i < n; i++) d[i] = p[i] + d[i];
    } else {
        float *d = dst;
        const float *p = partial;
        for (size_t i = 0; i < n; i++) d[i] = p[i] + d[i];
    }
}

// The gathered all-reduce's blocks: each rank's store's length and dtype, then its
// gradients, as bytes (a multiple of the dtype's size: the gradients stay aligned).
enum { GATHER_HEAD = 2 * sizeof(long long) };

// What this rank's gathered block holds (ctx of block_agrees): its head and its size.
typedef struct {
    long long head[2];
    size_t block;
} gather_block;

// What rank r sent where this rank's block was expected: true when it is such a block of
// the same length and dtype, else false after reporting.
static bool block_agrees(int r, int tag, int count, const char *got, const void *ctx) {
    const gather_block *b = ctx;
    const long long *head = b->head;
    long long theirs[2] = {-1, -1};
    if (tag == AGI_DIST_TAG_GATHER && (size_t)count >= sizeof theirs)
        memcpy(theirs, got, sizeof theirs);
    if (tag == AGI_DIST_TAG_FAREWELL) {
        ag_error("dist_allreduce_grads: rank %d has ended (ag_dist_finalize) while this rank "
                 "waits for its gradients: the ranks ran different numbers of steps", r);
    } else if (tag == AGI_DIST_TAG_SUM || tag == AGI_DIST_TAG_BROADCAST) {
        ag_error("dist_allreduce_grads: rank %d is in %s where this rank is in the "
                 "gradients' all-reduce: the ranks' calls differ",
                 r, tag == AGI_DIST_TAG_SUM ? "ag_dist_sum" : "ag_dist_broadcast_params");
    } else if (tag != AGI_DIST_TAG_GATHER) {
        ag_error("dist_allreduce_grads: rank %d runs the ring all-reduce of a store too large "
                 "to gather, where this rank's holds %lld %s gradients: the ranks' parameter "
                 "stores differ", r, head[0], ag_dtype_name((ag_dtype)head[1]));
    } else if ((size_t)count != b->block || theirs[0] != head[0] || theirs[1] != head[1]) {
        ag_error("dist_allreduce_grads: rank %d's store holds %lld %s gradients where this "
                 "rank's holds %lld %s: the ranks' parameter stores differ",
                 r, theirs[0], ag_dtype_name((ag_dtype)theirs[1]), head[0],
                 ag_dtype_name((ag_dtype)head[1]));
    } else {
        return true;
    }
    return false;
}

// Every rank's block, rank r's at r * block of what it returns (NULL after reporting), in
// one exchange of blocks (agi_dist_blocks): a block of another length or dtype is
// reported, as are a rank that has ended (its farewell), one that runs the ring (its store
// is too large to gather) and one in another call.
static const char *gather(const void *g, size_t len, ag_dtype dt, MPI_Comm comm) {
    const size_t es = ag_dtype_size(dt);
    const gather_block b = {{(long long)len, (long long)dt}, GATHER_HEAD + len * es};
    char *mine = agi_dist_blocks_room(b.block, comm);
    memcpy(mine, b.head, sizeof b.head);
    if (len) memcpy(mine + GATHER_HEAD, g, len * es);
    return agi_dist_blocks(b.block, AGI_DIST_TAG_GATHER, comm, block_agrees, &b);
}

void ag_dist_allreduce_grads(ag_params *ps, double weight) {
    if (!agi_dist_store_given(ps, "dist_allreduce_grads")) return;
    ag_dtype dt = ag_params_dtype(ps);
    size_t len = ag_params_buffer_len(ps), es = ag_dtype_size(dt);
    char *g = ag_params_grad(ps);
    if (weight != weight) {
        ag_error("dist_allreduce_grads: the weight is NaN");
        return;
    }
    scale(g, len, dt, weight);
    MPI_Comm comm = agi_dist_comm();
    if (comm == MPI_COMM_NULL) return;  // an empty store too: another rank's may not be
    int rank, n;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &n);
    if (n == 1) return;
    MPI_Datatype type = dt == AG_F64 ? MPI_DOUBLE : MPI_FLOAT;
    int right = (rank + 1) % n, left = (rank + n - 1) % n;
    if (n == 2) {
        char *other = agi_dist_scratch(len * es);
        if (!exchange(g, len, other, len, es, type, right, left, comm)) return;
        if (rank == 0)
            add_into_after(g, other, len, dt);  // g_0 + g_1
        else
            add_into(g, other, len, dt);  // g_0 + g_1
        return;
    }
    if (len <= AGI_DIST_GATHER_BYTES / es / (size_t)(n - 1)) {  // (n - 1) len es, unwrapped
        const char *all = gather(g, len, dt, comm);
        if (!all) return;
        const size_t block = GATHER_HEAD + len * es;
        if (len) memcpy(g, all + GATHER_HEAD, len * es);
        for (int r = 1; r < n; r++)
            add_into_after(g, all + (size_t)r * block + GATHER_HEAD, len, dt);
        return;
    }
    char *recv = agi_dist_scratch((len / (size_t)n + 1) * es);
    for (int s = 0; s < n - 1; s++) {
        int cs = ((rank - s) % n + n) % n, cr = ((rank - s - 1) % n + n) % n;
        size_t bs = chunk_begin(len, cs, n), br = chunk_begin(len, cr, n);
        size_t ns = chunk_begin(len, cs + 1, n) - bs, nr = chunk_begin(len, cr + 1, n) - br;
        if (!exchange(g + bs * es, ns, recv, nr, es, type, right, left, comm)) return;
        add_into(g + br * es, recv, nr, dt);
    }
    for (int s = 0; s < n - 1; s++) {
        int cs = ((rank + 1 - s) % n + n) % n, cr = ((rank - s) % n + n) % n;
        size_t bs = chunk_begin(len, cs, n), br = chunk_begin(len, cr, n);
        size_t ns = chunk_begin(len, cs + 1, n) - bs, nr = chunk_begin(len, cr + 1, n) - br;
        if (!exchange(g + bs * es, ns, g + br * es, nr, es, type, right, left, comm)) return;
    }
}
