// Times ag_dist_allreduce_grads (the fixed-order ring) against MPI_Allreduce
// on gradient buffers of several sizes. Not a test: run it by hand,
//     mpirun -np 2 ./build/tests/mpi/bench_allreduce
// and read the numbers as those of a shared machine if it is one.
#define _POSIX_C_SOURCE 200809L  // clock_gettime
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "attograd.h"
#include "attograd/dist.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    ag_dist_init(&argc, &argv);
    int rank = ag_dist_rank(), size = ag_dist_size();
    const int sizes[] = {20299, 262144, 2621440, 10000000};  // the demo's parameters, 1 MB, 10 MB, 40 MB
    if (rank == 0)
        printf("%d processes, f32 gradients; median of the repetitions\n"
               "%12s %10s %14s %14s %12s\n", size, "elements", "MB", "ring (ms)",
               "MPI_Allreduce", "ring GB/s");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        ag_params *ps = ag_params_new(AG_F32);
        ag_params_add(ps, "w", 1, (int[]){sizes[k]});
        size_t len = ag_params_buffer_len(ps);
        float *g = ag_params_grad(ps);
        int reps = sizes[k] > 1000000 ? 11 : 101;
        double ring[101], mpi[101];
        for (int r = 0; r < reps; r++) {
            for (size_t i = 0; i < len; i++) g[i] = (float)(i % 7);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            ag_dist_allreduce_grads(ps, 1.0 / size);
            ring[r] = now() - t0;
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now();
            MPI_Allreduce(MPI_IN_PLACE, g, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            mpi[r] = now() - t0;
        }
        // medians (insertion sort: few values)
        for (int i = 1; i < reps; i++)
            for (int j = i; j > 0 && ring[j] < ring[j - 1]; j--) {
                double t = ring[j]; ring[j] = ring[j - 1]; ring[j - 1] = t;
            }
        for (int i = 1; i < reps; i++)
            for (int j = i; j > 0 && mpi[j] < mpi[j - 1]; j--) {
                double t = mpi[j]; mpi[j] = mpi[j - 1]; mpi[j - 1] = t;
            }
        double mb = 4.0 * (double)len / 1e6, t = ring[reps / 2];
        if (rank == 0)
            printf("%12zu %10.2f %14.3f %14.3f %12.2f\n", len, mb, 1e3 * t, 1e3 * mpi[reps / 2],
                   size > 1 ? 2.0 * (size - 1) / size * mb / 1e3 / t : 0);
        ag_params_free(ps);
    }
    ag_dist_finalize();
    return 0;
}
