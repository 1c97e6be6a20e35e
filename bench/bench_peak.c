// The ceilings every other benchmark measures itself against (bench/peak.h): the f32 FMA
// and bf16 dot-product peaks and the memory read bandwidth, on 1 and 2 threads.
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "peak.h"

int main(void) {
    printf("%-10s %12s %12s\n", "", "1 thread", "2 threads");
    for (int k = 0; k < PEAK_KINDS; k++)
        printf("%-10s %7.1f GF/s %7.1f GF/s\n", peak_names[k], peak_gflops((peak_kind)k, 1),
               peak_gflops((peak_kind)k, 2));
    printf("%-10s %7.1f GB/s %7.1f GB/s\n", "read", peak_read_gbs(1), peak_read_gbs(2));
    return 0;
}
