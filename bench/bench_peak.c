// The ceilings every other benchmark measures itself against (bench/peak.h): the f32 FMA
// and bf16 dot-product peaks and the memory read bandwidth.
//
//   bench_peak                 the table, on 1 and 2 threads
//   bench_peak KIND THREADS    one number: KIND f32 or bf16 (GFLOP/s), read (GB/s)
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "peak.h"

int main(int argc, char **argv) {
    if (argc == 3) {
        const int threads = atoi(argv[2]);
        if (threads < 1) return 2;
        if (strcmp(argv[1], "f32") == 0) printf("%.1f\n", peak_gflops(PEAK_F32, threads));
        else if (strcmp(argv[1], "bf16") == 0) printf("%.1f\n", peak_gflops(PEAK_BF16, threads));
        else if (strcmp(argv[1], "read") == 0) printf("%.1f\n", peak_read_gbs(threads));
        else return 2;
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: bench_peak [f32|bf16|read THREADS]\n");
        return 2;
    }
    printf("%-10s %12s %12s   (load %s)\n", "", "1 thread", "2 threads", load_average());
    for (int k = 0; k < PEAK_KINDS; k++)
        printf("%-10s %7.1f GF/s %7.1f GF/s\n", peak_names[k], peak_gflops((peak_kind)k, 1),
               peak_gflops((peak_kind)k, 2));
    printf("%-10s %7.1f GB/s %7.1f GB/s\n", "read", peak_read_gbs(1), peak_read_gbs(2));
    return 0;
}
