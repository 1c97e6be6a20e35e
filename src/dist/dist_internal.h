// Internal declarations of the dist library (src/dist), which is built on MPI
// and linked apart from libattograd.
#ifndef ATTOGRAD_DIST_INTERNAL_H
#define ATTOGRAD_DIST_INTERNAL_H

#include <mpi.h>

#include "attograd/dist.h"

// The job's communicator: a duplicate of MPI_COMM_WORLD, so that attograd's
// messages never match a user's; MPI_COMM_NULL before ag_dist_init.
MPI_Comm agi_dist_comm(void);

// Scratch memory kept from call to call (a training step allocates nothing
// after the first); returns at least `bytes`, 64-byte aligned; exits with a
// message if memory runs out.
void *agi_dist_scratch(size_t bytes);
void agi_dist_scratch_free(void);
// Whether ps is a store, else false after "<fn>: the store is NULL" (libattograd does not
// export agi_given).
bool agi_dist_store_given(const ag_params *ps, const char *fn);
// Room for an unexpected message of `bytes`, received only to be dropped (free it); exits
// with a message if memory runs out.
void *agi_dist_drop_room(size_t bytes);

// The tags of the all-reduce's messages: its data (float32 or float64 gradients), and the
// farewell every rank sends every other from ag_dist_finalize. A rank that waits for data
// and receives a farewell knows that the rank it waits for has ended, where otherwise it
// would wait forever; one that receives data of the other dtype, or of another length,
// knows that the ranks' stores differ, where MPI would take the bytes as they come. A
// small buffer gathered from every rank goes as bytes, its length and dtype first. A
// rank in ag_dist_sum sends its own tag, so a rank in the all-reduce can tell it apart, and
// so does ag_dist_broadcast_params: each call out of step with another is named.
enum {
    AGI_DIST_TAG_DATA = 0,
    AGI_DIST_TAG_FAREWELL = 1,
    AGI_DIST_TAG_DATA_F64 = 2,
    AGI_DIST_TAG_GATHER = 3,
    AGI_DIST_TAG_SUM = 4,       // ag_dist_sum's values, their count first
    AGI_DIST_TAG_BROADCAST = 5  // ag_dist_broadcast_params's layouts, then rank 0's values
};

// One exchange of every rank's block of `block` bytes (blocks.c): write this rank's
// into agi_dist_blocks_room (its head first: what a receiver checks), then
// agi_dist_blocks sends it to every other rank under `tag` and takes theirs, each message
// probed first and passed to `agrees` (r, its tag, its bytes and their count; NULL and 0
// for a farewell, which stays for ag_dist_finalize), which reports what does not fit and
// returns false. Returns the blocks, rank r's at r * block, or NULL after a report. The
// room is the dist scratch: valid until the next call that takes it.
typedef bool (*agi_dist_agrees)(int r, int tag, int count, const char *got, const void *ctx);
char *agi_dist_blocks_room(size_t block, MPI_Comm comm);
char *agi_dist_blocks(size_t block, int tag, MPI_Comm comm, agi_dist_agrees agrees,
                      const void *ctx);

// The farewell (allreduce.c): returns once every rank has said it, or ends the job.
void agi_dist_farewell(MPI_Comm comm);

// MPI counts are ints: larger transfers go in pieces of at most this many
// elements.
#define AGI_DIST_PIECE (1 << 28)

#endif
