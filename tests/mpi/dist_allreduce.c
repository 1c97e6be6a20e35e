// ag_dist_allreduce_grads on every path (two ranks, small buffers gathered,
// the ring for large ones), in f32 and f64:
//   - exact values (small integers times powers of two) come out exact;
//   - arbitrary values give rank order's sum to rounding, the same bits on
//     every rank and in every repetition;
//   - the weight scales each rank's part; the padding stays zero.
//     mpirun -np N dist_allreduce
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attograd.h"
#include "attograd/dist.h"

static int failures;

#define EXPECT(cond, ...)                                                          \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "rank %d: %s: ", ag_dist_rank(), #cond);               \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
            failures++;                                                            \
        }                                                                          \
    } while (0)

// Rank r's gradient element i.
static double value(int r, size_t i, bool exact) {
    if (exact) return (double)((int)((i * 7 + (size_t)r * 3) % 17) - 8) * 0.25;
    return sin(1.0 + (double)i * 0.37 + r * 1.91) * pow(10.0, (double)(i % 9) - 4);
}

static double get(const ag_params *ps, size_t i) {
    return ag_params_dtype(ps) == AG_F64 ? ((double *)ag_params_grad(ps))[i]
                                         : ((float *)ag_params_grad(ps))[i];
}

static void fill(ag_params *ps, bool exact) {
    int rank = ag_dist_rank();
    // Two parameters, so that the buffer has padding between them.
    for (int p = 0; p < ag_params_count(ps); p++) {
        ag_tensor *t = ag_params_at(ps, p);
        size_t off = (size_t)((char *)t->grad - (char *)ag_params_grad(ps)) / ag_dtype_size(t->dtype);
        for (size_t i = 0; i < t->numel; i++) {
            double v = value(rank, off + i, exact);
            if (t->dtype == AG_F64) ((double *)t->grad)[i] = v;
            else ((float *)t->grad)[i] = (float)v;
        }
    }
}

static void check(ag_dtype dt, int n) {
    int rank = ag_dist_rank(), size = ag_dist_size();
    ag_params *ps = ag_params_new(dt);
    ag_params_add(ps, "a", 1, (int[]){n});
    ag_params_add(ps, "b", 2, (int[]){3, 5});
    size_t len = ag_params_buffer_len(ps), bytes = len * ag_dtype_size(dt);
    ag_tensor *b = ag_params_at(ps, 1);
    size_t b_off = (size_t)((char *)b->grad - (char *)ag_params_grad(ps)) / ag_dtype_size(dt);
    const char *name = dt == AG_F64 ? "f64" : "f32";

    // Exact values, weight 1 and weight 0.5: the exact sum.
    for (int k = 0; k < 2; k++) {
        double w = k ? 0.5 : 1.0;
        fill(ps, true);
        ag_dist_allreduce_grads(ps, w);
        size_t bad = 0;
        for (size_t i = 0; i < len; i++) {
            bool padding = i >= (size_t)n && i < b_off;
            double want = 0;
            for (int r = 0; r < size && !padding; r++) want += w * value(r, i, true);
            bad += get(ps, i) != want;
        }
        EXPECT(bad == 0, "%s n=%d weight %g: %zu elements differ from the exact sum", name, n, w, bad);
    }

    // Arbitrary values: rank order's sum to rounding, the same bits twice.
    fill(ps, false);
    ag_dist_allreduce_grads(ps, 1.0);
    void *first = malloc(bytes), *root = malloc(bytes);
    memcpy(first, ag_params_grad(ps), bytes);
    double worst = 0;
    for (size_t i = 0; i < len; i++) {
        bool padding = i >= (size_t)n && i < b_off;
        double want = 0, scale = 0;
        for (int r = 0; r < size && !padding; r++) {
            double v = dt == AG_F64 ? value(r, i, false) : (double)(float)value(r, i, false);
            want += v, scale += fabs(v);
        }
        if (padding) EXPECT(get(ps, i) == 0, "%s: padding element %zu is %g", name, i, get(ps, i));
        else worst = fmax(worst, fabs(get(ps, i) - want) / (scale > 0 ? scale : 1));
    }
    double tol = dt == AG_F64 ? 1e-15 : 1e-6;
    EXPECT(worst <= tol, "%s n=%d: relative error %.3g > %g", name, n, worst, tol);
    fill(ps, false);
    ag_dist_allreduce_grads(ps, 1.0);
    EXPECT(memcmp(first, ag_params_grad(ps), bytes) == 0, "%s n=%d: a repetition gave other bits", name, n);
    memcpy(root, first, bytes);
    MPI_Bcast(root, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    EXPECT(memcmp(first, root, bytes) == 0, "%s n=%d: differs from rank 0's result", name, n);
    if (rank == 0)
        printf("%s, %d ranks, %zu elements (%.2f MB): exact sums exact, rank-order sum to %.1e\n",
               name, size, len, (double)bytes / 1e6, worst);
    free(first), free(root);
    ag_params_free(ps);
}

int main(int argc, char **argv) {
    ag_dist_init(&argc, &argv);
    // Small enough to gather, and large enough for the ring (an odd length,
    // so that the chunks differ in size).
    check(AG_F64, 1001);
    check(AG_F32, 1001);
    check(AG_F64, 400003);
    check(AG_F32, 400003);
    int all = failures;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    ag_dist_finalize();
    return all ? 1 : 0;
}
