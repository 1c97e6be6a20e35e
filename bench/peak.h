// The silicon's ceiling, measured in the same process as what is compared with it: the
// arithmetic peak of a loop that does nothing but fused multiply-adds into 12 independent
// vector accumulators (enough to cover the instruction's latency on both FMA pipes), and
// the memory bandwidth of a loop that only reads (or copies) a buffer far larger than the
// caches. A kernel's GFLOP/s over the peak of the same run, on the same thread count, is
// robust to the clock of the day and, partly, to a busy neighbour; a shared machine is
// still best measured when quiet.
//
//   peak_gflops(PEAK_F32, threads)   zmm vfmadd231ps: 32 flop an instruction
//   peak_gflops(PEAK_BF16, threads)  zmm vdpbf16ps: 32 products and 32 sums an instruction
//   peak_read_gbs(threads)           GB/s read from memory (a 512 MB buffer)
//
// Each is the best of a few runs: a neighbour only ever slows a loop down. On threads > 1
// the loops run at once on that many threads and their flop (or bytes) are summed over the
// longest thread's time. Where the CPU lacks AVX-512 (or AVX512_BF16) the peak is 0 and
// benchmarks print "-" for the percentages.
#ifndef ATTOGRAD_BENCH_PEAK_H
#define ATTOGRAD_BENCH_PEAK_H

#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "timing.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_X86 1
#endif

typedef enum { PEAK_F32, PEAK_BF16, PEAK_KINDS } peak_kind;
static const char *const peak_names[PEAK_KINDS] = {"f32 FMA", "bf16 dot"};

enum { PEAK_ACC = 12, PEAK_ITERS = 2000000, PEAK_TRIES = 10 };

static inline bool peak_has(peak_kind kind) {
#ifdef PEAK_X86
    __builtin_cpu_init();
    if (kind == PEAK_BF16) return __builtin_cpu_supports("avx512bf16");
    return __builtin_cpu_supports("avx512f");
#else
    (void)kind;
    return false;
#endif
}

#ifdef PEAK_X86
static volatile float peak_sink;

// PEAK_ITERS rounds of 12 independent accumulations: acc = acc * 0.5 + 1 (which stays
// near 2, no overflow or subnormals).
__attribute__((target("avx512f"))) static inline void peak_fma_loop(void) {
    __m512 acc[PEAK_ACC];
    for (int j = 0; j < PEAK_ACC; j++) acc[j] = _mm512_set1_ps((float)j);
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    for (long i = 0; i < PEAK_ITERS; i++)
        for (int j = 0; j < PEAK_ACC; j++) acc[j] = _mm512_fmadd_ps(acc[j], half, one);
    __m512 s = acc[0];
    for (int j = 1; j < PEAK_ACC; j++) s = _mm512_add_ps(s, acc[j]);
    peak_sink = _mm512_reduce_add_ps(s);
}

// The same with acc += a . b over pairs of bf16 (small values: the sums stay finite).
__attribute__((target("avx512f,avx512bf16"))) static inline void peak_dot_loop(void) {
    __m512 acc[PEAK_ACC];
    for (int j = 0; j < PEAK_ACC; j++) acc[j] = _mm512_set1_ps((float)j);
    const __m512 x = _mm512_set1_ps(1.0f / 1024);
    const __m512bh a = _mm512_cvtne2ps_pbh(x, x);
    for (long i = 0; i < PEAK_ITERS; i++)
        for (int j = 0; j < PEAK_ACC; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, a);
    __m512 s = acc[0];
    for (int j = 1; j < PEAK_ACC; j++) s = _mm512_add_ps(s, acc[j]);
    peak_sink = _mm512_reduce_add_ps(s);
}
#endif

typedef struct {
    peak_kind kind;
    const float *buf;  // the read loop's buffer and its floats
    size_t n;
    double seconds;
} peak_job;

static inline void *peak_run(void *arg) {
    peak_job *j = arg;
    const double t0 = now();
#ifdef PEAK_X86
    if (j->buf) {  // a read of the whole buffer, 4 sums side by side
        float s[64] = {0};
        for (size_t i = 0; i + 64 <= j->n; i += 64)
            for (int k = 0; k < 64; k++) s[k] += j->buf[i + k];
        float t = 0;
        for (int k = 0; k < 64; k++) t += s[k];
        peak_sink = t;
    } else if (j->kind == PEAK_F32) {
        peak_fma_loop();
    } else {
        peak_dot_loop();
    }
#endif
    j->seconds = now() - t0;
    return NULL;
}

// Runs the job on `threads` threads at once (each its own share of a read); returns the
// longest thread's time.
static inline double peak_once(peak_kind kind, int threads, const float *buf, size_t n) {
    enum { MAX = 8 };
    if (threads > MAX) threads = MAX;
    pthread_t t[MAX];
    peak_job j[MAX];
    for (int i = 0; i < threads; i++) {
        j[i] = (peak_job){kind, buf ? buf + n / threads * i : NULL, n / threads, 0};
        if (i > 0) pthread_create(&t[i], NULL, peak_run, &j[i]);
    }
    peak_run(&j[0]);
    double longest = j[0].seconds;
    for (int i = 1; i < threads; i++) {
        pthread_join(t[i], NULL);
        if (j[i].seconds > longest) longest = j[i].seconds;
    }
    return longest;
}

// GFLOP/s of the arithmetic loop of `kind` on `threads` threads (0 without the
// instructions).
static inline double peak_gflops(peak_kind kind, int threads) {
    if (!peak_has(kind)) return 0;
    double best = 1e30;
    for (int r = 0; r < PEAK_TRIES + 1; r++) {  // the first warms the clock up
        const double t = peak_once(kind, threads, NULL, 0);
        if (r > 0 && t < best) best = t;
    }
    const double per_instruction = kind == PEAK_F32 ? 32 : 64;
    return per_instruction * PEAK_ACC * (double)PEAK_ITERS * threads / best * 1e-9;
}

// GB/s read from memory on `threads` threads.
static inline double peak_read_gbs(int threads) {
    const size_t n = ((size_t)512 << 20) / sizeof(float);
    float *buf = malloc(n * sizeof(float));
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);  // faulted in before timing
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        const double t = peak_once(PEAK_F32, threads, buf, n);
        if (t < best) best = t;
    }
    free(buf);
    return (double)(n / threads * threads) * sizeof(float) / best * 1e-9;
}

// The load averages of /proc/loadavg ("1 5 15"), for the header of a table: timings on a
// shared machine are read together with how busy it was.
static inline const char *load_average(void) {
    static char text[64];
    double l[3];
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) == 3)
        snprintf(text, sizeof text, "%.2f %.2f %.2f", l[0], l[1], l[2]);
    else
        snprintf(text, sizeof text, "?");
    if (f) fclose(f);
    return text;
}

#endif
