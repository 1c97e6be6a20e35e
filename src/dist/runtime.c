// Starting and ending the job, who we are in it, and ending it on an error.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

static MPI_Comm comm = MPI_COMM_NULL;
static int my_rank = 0, n_ranks = 1;
static int started_mpi;  // ag_dist_init called MPI_Init, so finalize ends it
static char prog[64] = "attograd";
static void *scratch;
static size_t scratch_bytes;

MPI_Comm agi_dist_comm(void) { return comm; }
int ag_dist_rank(void) { return my_rank; }
int ag_dist_size(void) { return n_ranks; }

// Outside MPI's life (before MPI_Init, after MPI_Finalize) MPI_Abort may not be called:
// Open MPI then says so and cannot promise to end the other processes. The process exits,
// which mpirun takes for the job's end. Outside ag_dist_init's, no rank is known.
static _Noreturn void print_and_abort(const char *who, const char *msg) {
    int started = 0, ended = 0;
    MPI_Initialized(&started);
    MPI_Finalized(&ended);
    fflush(stdout);
    if (comm != MPI_COMM_NULL)
        fprintf(stderr, "%s: rank %d of %d: %s\n", who, my_rank, n_ranks, msg);
    else
        fprintf(stderr, "%s: %s\n", who, msg);
    fflush(stderr);
    if (started && !ended) MPI_Abort(comm != MPI_COMM_NULL ? comm : MPI_COMM_WORLD, 1);
    exit(1);  // MPI_Abort does not return
}

// The other ranks would wait forever for a rank that stopped on a
// programming error; MPI_Abort ends them all.
// (Left installed by ag_dist_finalize, which cannot tell whether the program
// has installed its own since: after it, this is the default handler.)
static void abort_on_error(const char *message, void *user) {
    (void)user;
    if (comm == MPI_COMM_NULL) {
        fprintf(stderr, "attograd: %s\n", message);
        abort();
    }
    print_and_abort("attograd", message);
}

int ag_dist_init(int *argc, char ***argv) {
    if (comm != MPI_COMM_NULL) return 0;  // already started
    int ready = 0, ended = 0;
    MPI_Finalized(&ended);
    if (ended) {  // MPI cannot start twice in a process; MPI_Comm_dup would end it
        fprintf(stderr, "attograd: dist_init: MPI has ended in this process (ag_dist_finalize "
                        "or MPI_Finalize) and cannot start again\n");
        return -1;
    }
    MPI_Initialized(&ready);
    if (!ready) {
        // Only the thread that calls attograd talks to MPI; attograd's pool
        // threads never do.
        int provided;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            fprintf(stderr, "attograd: dist_init: MPI_Init failed\n");
            return -1;
        }
        started_mpi = 1;
    }
    if (argc && argv && *argc > 0 && (*argv)[0]) {
        const char *slash = strrchr((*argv)[0], '/');
        snprintf(prog, sizeof prog, "%s", slash ? slash + 1 : (*argv)[0]);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_rank(comm, &my_rank);
    MPI_Comm_size(comm, &n_ranks);
    ag_error_handler_set(abort_on_error, NULL);
    return 0;
}

void ag_dist_finalize(void) {
    if (comm == MPI_COMM_NULL) return;
    agi_dist_farewell(comm);
    MPI_Comm_free(&comm);
    comm = MPI_COMM_NULL;
    my_rank = 0, n_ranks = 1;
    agi_dist_scratch_free();
    if (started_mpi) MPI_Finalize();
    started_mpi = 0;
}

static _Noreturn void abort_as_the_program(const char *message, void *user) {
    (void)user;
    print_and_abort(prog, message);
}

// The message is built where every error's is (ag_verror), and reaches a handler that
// names the program rather than attograd: the failure is the program's.
void ag_dist_abort(const char *fmt, ...) {
    ag_error_handler_set(abort_as_the_program, NULL);
    va_list ap;
    va_start(ap, fmt);
    ag_verror(fmt, ap);
    va_end(ap);
    exit(1);  // the handler does not return; this is for the compiler
}

void *agi_dist_scratch(size_t bytes) {
    if (bytes <= scratch_bytes) return scratch;
    free(scratch);
    size_t rounded = (bytes + 63) / 64 * 64;
    scratch = aligned_alloc(64, rounded);
    if (!scratch) ag_dist_abort("out of memory for %zu bytes of all-reduce scratch", rounded);
    scratch_bytes = rounded;
    return scratch;
}

bool agi_dist_store_given(const ag_params *ps, const char *fn) {
    if (!ps) ag_error("%s: the store is NULL", fn);  // agi_given's words: not exported
    return ps != NULL;
}

void *agi_dist_drop_room(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) ag_dist_abort("out of memory for %zu bytes of an unexpected message", bytes);
    return p;
}

void agi_dist_scratch_free(void) {
    free(scratch);
    scratch = NULL;
    scratch_bytes = 0;
}
