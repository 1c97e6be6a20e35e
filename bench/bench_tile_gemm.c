// The tile kernels (src/kernels/tile_gemm.c) against OpenBLAS, one thread, f32, on the
// products attograd makes: per-head blocks of attention (T x T x d, T x d x T), the
// projections of small and mid-size models (B*T rows by E or 3E or 4E columns), their
// backward products (A^T B), single rows (generation), and a square product of 1536 (the
// ceiling). GFLOP/s are medians of repeated calls, the two kernels taking turns shape by
// shape; agi_gemm uses the tile kernels for every product when the CPU runs them, and
// this table is why.
//
//   bench_tile_gemm            every shape
//   bench_tile_gemm M N K ta tb    one product (ta, tb: 0 or 1)
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "../src/kernels/tile_gemm.h"
#include "attograd.h"
#include "timing.h"

typedef struct {
    int M, N, K;
    bool ta, tb;
    const char *what;
} shape;

static double gflops(const shape *s, bool tiles, const float *A, const float *B, float *C) {
    const int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    const double flop = 2.0 * s->M * s->N * s->K;
    const int reps = flop > 2e7 ? 1 : (int)(2e7 / flop) + 1;
    timings r = {{0}, 0, 0};
    double t;
    int run = 0;
    do {
        double t0 = now();
        for (int i = 0; i < reps; i++) {
            if (tiles)
                agi_tile_gemm_f32(s->ta, s->tb, s->M, s->N, s->K, 1, A, lda, B, ldb, 0, C, s->N,
                                  NULL);
            else
                cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                            s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, 1, A, lda, B,
                            ldb, 0, C, s->N);
        }
        t = (now() - t0) / reps;
    } while (again(run++, t, &r, 7, 0.2));
    return flop / median(&r) * 1e-9;
}

static void compare(const shape *s) {
    const size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
    float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = malloc(nc * sizeof *C);
    for (size_t i = 0; i < na; i++) A[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)(i % 7) * 0.01f;
    double tile = 0, blas = 0;
    for (int round = 0; round < 2; round++) {  // turns, against a shared machine's drift
        double t = gflops(s, true, A, B, C), b = gflops(s, false, A, B, C);
        tile = t > tile ? t : tile;
        blas = b > blas ? b : blas;
    }
    printf("%5d %5d %5d  %d %d | %7.1f %7.1f %5.2fx | %s\n", s->M, s->N, s->K, s->ta, s->tb,
           tile, blas, tile / blas, s->what);
    fflush(stdout);
    free(A), free(B), free(C);
}

int main(int argc, char **argv) {
    ag_tape_free(ag_tape_new());  // pins OpenBLAS to one thread
    if (!agi_tile_gemm_available()) {
        printf("the tile kernels do not run on this CPU (no AVX-512F): agi_gemm uses BLAS\n");
        return 0;
    }
    printf("f32, 1 thread; sgemm ceiling (cblas_sgemm n=1536) %.1f GFLOP/s\n", sgemm_ceiling(1));
    printf("%5s %5s %5s %2s %2s | %7s %7s %6s |\n", "M", "N", "K", "ta", "tb", "tile", "BLAS",
           "ratio");
    if (argc == 6) {
        shape s = {atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]) != 0,
                   atoi(argv[5]) != 0, "given"};
        if (s.M < 1 || s.N < 1 || s.K < 1) {
            fprintf(stderr, "usage: bench_tile_gemm [M N K ta tb]\n");
            return 2;
        }
        compare(&s);
        return 0;
    }
    static const shape shapes[] = {
        {32, 32, 16, false, true, "scores Q K^T, T 32, d 16 (the demo)"},
        {32, 16, 32, false, false, "P V, T 32, d 16"},
        {32, 16, 32, true, false, "dV = P^T dO, T 32, d 16"},
        {64, 64, 32, false, true, "scores, T 64, d 32"},
        {256, 256, 64, false, true, "scores block, T >= 256, d 64"},
        {256, 64, 256, false, false, "P V block, d 64"},
        {256, 64, 256, true, false, "dK = dS^T Q block, d 64"},
        {2048, 192, 64, false, true, "in_proj, B*T 2048, E 64 (the demo)"},
        {2048, 64, 192, false, false, "in_proj dx, E 64"},
        {192, 64, 2048, true, false, "in_proj dW, E 64"},
        {2048, 768, 256, false, true, "in_proj, E 256"},
        {768, 256, 2048, true, false, "in_proj dW, E 256"},
        {4096, 1536, 512, false, true, "in_proj, B*T 4096, E 512"},
        {4096, 512, 1536, false, false, "in_proj dx, E 512"},
        {1536, 512, 4096, true, false, "in_proj dW, E 512"},
        {1, 192, 64, false, true, "one row (generation), E 64"},
        {1, 1536, 512, false, true, "one row, E 512"},
        {7, 13, 5, false, false, "tiny"},
        {1536, 1536, 1536, false, false, "square (the ceiling's shape)"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) compare(&shapes[i]);
    return 0;
}
