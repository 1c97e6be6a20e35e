// Every rank's block to every other rank, point to point: the gathered all-reduce's and
// ag_dist_sum's one exchange (see dist_internal.h). Each message is probed before it is
// received, so a rank that sent something else (it is in another call, or its block is
// of another length) is reported by the caller's check, where a collective waited for it
// forever or ended the job with MPI's MPI_ERR_TRUNCATE.
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

static size_t requests_bytes(int n) {
    return ((size_t)n * sizeof(MPI_Request) + 63) & ~(size_t)63;
}

// A block is sent with an int count (its callers bound it so), and there are at most
// INT_MAX ranks: the room, below 2^63 bytes, cannot wrap a size_t.
char *agi_dist_blocks_room(size_t block, MPI_Comm comm) {
    int rank, n;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &n);
    char *base = agi_dist_scratch(requests_bytes(n) + (size_t)n * block);
    return base + requests_bytes(n) + (size_t)rank * block;
}

char *agi_dist_blocks(size_t block, int tag, MPI_Comm comm, agi_dist_agrees agrees,
                      const void *ctx) {
    int rank, n;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &n);
    char *all = agi_dist_blocks_room(block, comm) - (size_t)rank * block;
    MPI_Request *sent = (MPI_Request *)(all - requests_bytes(n));
    char *mine = all + (size_t)rank * block;
    for (int r = 0; r < n; r++)
        if (r != rank) MPI_Isend(mine, (int)block, MPI_BYTE, r, tag, comm, &sent[r]);
    bool ok = true;
    for (int r = 0; r < n && ok; r++) {
        if (r == rank) continue;
        MPI_Status got;
        MPI_Probe(r, MPI_ANY_TAG, comm, &got);
        // A farewell stays for ag_dist_finalize, which receives one from every rank.
        if (got.MPI_TAG == AGI_DIST_TAG_FAREWELL) {
            ok = agrees(r, got.MPI_TAG, 0, NULL, ctx);
            break;
        }
        int count;
        MPI_Get_count(&got, MPI_BYTE, &count);
        const bool fits = got.MPI_TAG == tag && (size_t)count == block;
        // Whatever came is received, so that it does not wait for the next call.
        char *into = fits ? all + (size_t)r * block
                          : agi_dist_drop_room(count > 0 ? (size_t)count : 0);
        MPI_Recv(into, count, MPI_BYTE, r, got.MPI_TAG, comm, MPI_STATUS_IGNORE);
        ok = agrees(r, got.MPI_TAG, count, into, ctx);
        if (!fits) free(into);
    }
    for (int r = 0; r < n; r++) {
        if (r == rank) continue;
        if (ok)
            MPI_Wait(&sent[r], MPI_STATUS_IGNORE);
        else
            MPI_Request_free(&sent[r]);  // its receiver may never take it
    }
    return ok ? all : NULL;
}
