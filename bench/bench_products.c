// attograd's matrix products against the silicon (bench/peak.h, measured in this process
// on as many threads) and, when the build found it, oneDNN's matmul on the same shapes:
// the GPT-2-small projections of the GPT-2-size step (B*T = 4 * 256 = 1024 rows, width
// 768: qkv 768 -> 2304, out 768 -> 768, fc 768 -> 3072, proj 3072 -> 768), forward
// (Y = X W^T) and both backward products (dX = dY W, dW = dY^T X), and the blocks of
// fused attention. Contenders take turns round by round, so that a busy spell of a shared
// machine falls on all of them; each figure is the median of the rounds (--best: the
// best round). "%pk" is the share of the f32 FMA peak for f32 products and of the bf16
// dot peak for bf16 ones.
//
// attograd runs through agi_gemm (the library's own split over its threads) in f32, and
// through agi_gemm_bf16 (autocast's products: operands rounded to bf16 as they are packed,
// f32 sums) with "x" its speed over attograd's f32; OpenBLAS (one thread only: attograd
// pins it there; its kernels are the Haswell ones OPENBLAS_CORETYPE asks for) through
// cblas_sgemm, the path of CPUs without AVX-512; oneDNN
// (optional: only when CMake found libdnnl) through a matmul primitive on its OpenMP
// threads, f32 and, with bf16 inputs converted beforehand, bf16 with f32 output.
//
// --cpu (one thread only) times the thread's CPU time instead of wall time, peak
// included, for comparing kernels on a busy machine.
//
//   bench_products [--threads N] [--best] [--cpu] [--rounds R]   every shape
//   bench_products [--threads N] ... M N K ta tb             one product
#define _POSIX_C_SOURCE 200809L

#include <cblas.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/kernels/bf16_gemm.h"
#include "../src/kernels/gemm.h"
#include "attograd.h"
#include "peak.h"

#ifdef AG_BENCH_DNNL
#include <oneapi/dnnl/dnnl.h>
void omp_set_num_threads(int);  // libgomp, which libdnnl runs on
#endif

typedef struct {
    int M, N, K;
    bool ta, tb;
    const char *what;
} shape;

typedef enum {
    AG_F32_PRODUCT,
    AG_BF16_PRODUCT,
    OPENBLAS_F32,
    DNNL_F32,
    DNNL_BF16,
    CONTENDERS
} contender;
static const char *const contender_names[CONTENDERS] = {"attograd f32", "attograd bf16",
                                                       "OpenBLAS f32", "oneDNN f32",
                                                       "oneDNN bf16"};
static const peak_kind contender_peak[CONTENDERS] = {PEAK_F32, PEAK_BF16, PEAK_F32, PEAK_F32,
                                                     PEAK_BF16};
static int threads = 1;

typedef struct {
    const shape *s;
    int lda, ldb;
    ag_tensor *tensor[3];  // A, B and C's memory
    float *A, *B, *C;
#ifdef AG_BENCH_DNNL
    dnnl_primitive_t prim[CONTENDERS];
    dnnl_memory_t mem[CONTENDERS][3];  // src, weights, dst
    uint16_t *A16, *B16;
#endif
} problem;

#ifdef AG_BENCH_DNNL
static dnnl_engine_t engine;
static dnnl_stream_t stream;

static uint16_t to_bf16(float x) {  // round to nearest even (finite inputs only here)
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// A matmul primitive for op(A) [M, K] times op(B) [K, N], the transposes given by strides.
static bool dnnl_setup(problem *p, contender c) {
    const shape *s = p->s;
    const dnnl_data_type_t in = c == DNNL_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a, b, d;
    dnnl_dims_t da = {s->M, s->K}, db = {s->K, s->N}, dd = {s->M, s->N};
    dnnl_dims_t sa = {s->ta ? 1 : p->lda, s->ta ? p->lda : 1};
    dnnl_dims_t sb = {s->tb ? 1 : p->ldb, s->tb ? p->ldb : 1}, sd = {s->N, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_memory_desc_init_by_strides(&a, 2, da, in, sa) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&b, 2, db, in, sb) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&d, 2, dd, dnnl_f32, sd) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &a, &b, NULL, &d) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL) != dnnl_success)
        return false;
    bool ok = dnnl_primitive_create(&p->prim[c], pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    void *ha = c == DNNL_BF16 ? (void *)p->A16 : (void *)p->A;
    void *hb = c == DNNL_BF16 ? (void *)p->B16 : (void *)p->B;
    ok = ok && dnnl_memory_create(&p->mem[c][0], &a, engine, ha) == dnnl_success &&
         dnnl_memory_create(&p->mem[c][1], &b, engine, hb) == dnnl_success &&
         dnnl_memory_create(&p->mem[c][2], &d, engine, p->C) == dnnl_success;
    return ok;
}

static void dnnl_run(const problem *p, contender c) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->mem[c][0]},
                               {DNNL_ARG_WEIGHTS, p->mem[c][1]},
                               {DNNL_ARG_DST, p->mem[c][2]}};
    dnnl_primitive_execute(p->prim[c], stream, 3, args);
    dnnl_stream_wait(stream);
}
#endif

static bool available(const problem *p, contender c) {
    if (c == AG_F32_PRODUCT || c == AG_BF16_PRODUCT) return true;
    if (c == OPENBLAS_F32) return threads == 1;  // attograd pins OpenBLAS to one thread
#ifdef AG_BENCH_DNNL
    return p->prim[c] != NULL;
#else
    (void)p;
    return false;
#endif
}

static void run(const problem *p, contender c) {
    const shape *s = p->s;
    if (c == AG_F32_PRODUCT) {
        agi_gemm_f32(s->ta, s->tb, s->M, s->N, s->K, 1, p->A, p->lda, p->B, p->ldb, 0, p->C, s->N);
        return;
    }
    if (c == AG_BF16_PRODUCT) {
        agi_gemm_bf16(s->ta, s->tb, s->M, s->N, s->K, 1, p->A, p->lda, p->B, p->ldb, 0, p->C,
                      s->N, NULL);
        return;
    }
    if (c == OPENBLAS_F32) {
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, 1, p->A, p->lda, p->B,
                    p->ldb, 0, p->C, s->N);
        return;
    }
#ifdef AG_BENCH_DNNL
    dnnl_run(p, c);
#endif
}

static problem make_problem(const shape *s) {
    problem p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.lda = s->ta ? s->M : s->K;
    p.ldb = s->tb ? s->K : s->N;
    const size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
    // The operands are the library's tensors, whose memory is what a model's products
    // read and write (large ones on huge pages, src/core/alloc.c), for every contender.
    const size_t n[3] = {na, nb, nc};
    for (int i = 0; i < 3; i++) {
        if (n[i] > INT_MAX) {  // a tensor of one dimension holds at most INT_MAX
            fprintf(stderr, "bench_products: %d x %d x %d: an operand of %zu floats is more "
                    "than one tensor of one dimension holds\n", s->M, s->N, s->K, n[i]);
            exit(2);
        }
        const int len = (int)n[i];
        p.tensor[i] = ag_tensor_zeros(AG_F32, 1, &len);
    }
    p.A = ag_tensor_f32(p.tensor[0]);
    p.B = ag_tensor_f32(p.tensor[1]);
    p.C = ag_tensor_f32(p.tensor[2]);
    ag_pcg32 rng = ag_pcg32_make(1, 2);
    for (size_t i = 0; i < na; i++) p.A[i] = (float)ag_pcg32_double(&rng) - 0.5f;
    for (size_t i = 0; i < nb; i++) p.B[i] = (float)ag_pcg32_double(&rng) - 0.5f;
#ifdef AG_BENCH_DNNL
    p.A16 = malloc(na * sizeof(uint16_t));
    p.B16 = malloc(nb * sizeof(uint16_t));
    for (size_t i = 0; i < na; i++) p.A16[i] = to_bf16(p.A[i]);
    for (size_t i = 0; i < nb; i++) p.B16[i] = to_bf16(p.B[i]);
    for (int c = DNNL_F32; c < CONTENDERS; c++)
        if (!dnnl_setup(&p, (contender)c)) p.prim[c] = NULL;
#endif
    return p;
}

static void free_problem(problem *p) {
#ifdef AG_BENCH_DNNL
    for (int c = DNNL_F32; c < CONTENDERS; c++) {
        if (p->prim[c]) dnnl_primitive_destroy(p->prim[c]);
        for (int i = 0; i < 3; i++)
            if (p->mem[c][i]) dnnl_memory_destroy(p->mem[c][i]);
    }
    free(p->A16), free(p->B16);
#endif
    for (int i = 0; i < 3; i++) ag_tensor_free(p->tensor[i]);
}

enum { MAX_ROUNDS = 64 };

// On several threads, a round starts only when the previous contender's threads have gone
// to sleep: libgomp's workers (oneDNN's) spin 5-9 ms after each parallel region (by the
// process's CPU time after one, on this machine), and attograd's pool workers 0.5 ms, and
// a spinning worker of one contender holds a core the next one's threads need. Without
// this pause attograd's f32 round, which follows oneDNN's bf16, ran at 38-45% of the peak
// on 256 x 256 x 64 and at 66-78% with OMP_WAIT_POLICY=PASSIVE (same load).
static void settle(void) {
    if (threads == 1) return;
    const struct timespec pause = {0, 30 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

// Seconds of one product of c: enough calls to fill about 20 ms, timed together. On several
// threads the round first runs c untimed for WARM_SECONDS: after settle() the contender's
// own workers are asleep, and the first milliseconds after they wake run at about half the
// two-core speed (the woken vCPU ramps up, and the scheduler may first place the woken
// worker beside the caller). Timing that spell measured the wake-up, not the product: the
// rounds fell into two groups, near the two-core peak and near half of it, for attograd
// and oneDNN alike (bench/README.md has the numbers).
#define WARM_SECONDS 5e-3
static double time_round(const problem *p, contender c) {
    const double flop = 2.0 * p->s->M * p->s->N * p->s->K;
    const int reps = flop > 4e9 ? 1 : (int)(4e9 / flop) + 1;
    if (threads > 1)
        for (const double w0 = now(); now() - w0 < WARM_SECONDS;) run(p, c);
    const double t0 = now();
    for (int i = 0; i < reps; i++) run(p, c);
    return (now() - t0) / reps;
}

static void measure(const shape *s, int rounds, bool best, const double peak[PEAK_KINDS]) {
    problem p = make_problem(s);
    timings t[CONTENDERS];
    for (int c = 0; c < CONTENDERS; c++) {
        t[c] = (timings){{0}, 0, 0};
        if (available(&p, (contender)c)) run(&p, (contender)c);  // warm-up (and JIT)
    }
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < CONTENDERS; c++)
            if (available(&p, (contender)c)) {
                settle();
                t[c].t[t[c].n++] = time_round(&p, (contender)c);
            }
    printf("%5d %5d %5d %d %d", s->M, s->N, s->K, s->ta, s->tb);
    const double flop = 2.0 * s->M * s->N * s->K;
    double sec[CONTENDERS] = {0};
    for (int c = 0; c < CONTENDERS; c++) {
        if (!available(&p, (contender)c)) {
            printf(" | %7s %4s", "-", "-");
            continue;
        }
        sec[c] = median(&t[c]);  // sorts
        if (best) sec[c] = t[c].t[0];
        const double gf = flop / sec[c] * 1e-9, pk = peak[contender_peak[c]];
        if (pk > 0)
            printf(" | %7.1f %3.0f%%", gf, 100 * gf / pk);
        else
            printf(" | %7.1f %4s", gf, "-");
        if (c == AG_BF16_PRODUCT) printf(" %4.2fx", sec[AG_F32_PRODUCT] / sec[c]);
    }
    printf(" | %s\n", s->what);
    fflush(stdout);
    free_problem(&p);
}

static int usage(void) {
    fprintf(stderr, "usage: bench_products [--threads N] [--best] [--cpu] [--rounds R] "
                    "[M N K ta tb]\n");
    return 2;
}

// The peak read again at the end: a neighbour (or a vCPU the host slowed) at the start
// reads it low, and every % printed too high (a run on two threads once read 145 GFLOP/s
// for the f32 peak, and 123-145% for the products).
static void peak_again(const double peak[PEAK_KINDS]) {
    settle();
    double again[PEAK_KINDS];
    for (int k = 0; k < PEAK_KINDS; k++) again[k] = peak_gflops((peak_kind)k, threads);
    printf("peak at the end: %.1f GFLOP/s (%s), %.1f (%s)\n", again[PEAK_F32],
           peak_names[PEAK_F32], again[PEAK_BF16], peak_names[PEAK_BF16]);
    for (int k = 0; k < PEAK_KINDS; k++)
        if (peak[k] < 0.95 * again[k])
            printf("warning: the %s peak at the start read %.0f%% of the end's: the %% of it "
                   "above are too high\n",
                   peak_names[k], 100 * peak[k] / again[k]);
}

int main(int argc, char **argv) {
    int rounds = 7, a = 1;
    bool best = false;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (strcmp(argv[a], "--best") == 0) {
            best = true;
        } else if (strcmp(argv[a], "--cpu") == 0) {
            timing_clock = CLOCK_THREAD_CPUTIME_ID;
        } else if (a + 1 < argc && strcmp(argv[a], "--threads") == 0) {
            threads = atoi(argv[++a]);
        } else if (a + 1 < argc && strcmp(argv[a], "--rounds") == 0) {
            rounds = atoi(argv[++a]);
        } else {
            return usage();
        }
    }
    if (timing_clock != CLOCK_MONOTONIC && threads != 1) {
        fprintf(stderr, "bench_products: --cpu times one thread only\n");
        return 2;
    }
    if (threads < 1 || rounds < 1 || rounds > MAX_ROUNDS || (argc - a != 0 && argc - a != 5))
        return usage();
    ag_threads_set(threads);
#ifdef AG_BENCH_DNNL
    omp_set_num_threads(threads);
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "bench_products: oneDNN did not start\n");
        return 1;
    }
#endif
    double peak[PEAK_KINDS];
    settle();  // oneDNN's start may leave its workers spinning on the cores the peak needs
    for (int k = 0; k < PEAK_KINDS; k++) peak[k] = peak_gflops((peak_kind)k, threads);
    printf("products on %d thread%s; peak %.1f GFLOP/s (%s), %.1f (%s); GFLOP/s are %s of "
           "%d rounds, %s time; load %s\n",
           threads, threads > 1 ? "s" : "", peak[PEAK_F32], peak_names[PEAK_F32],
           peak[PEAK_BF16], peak_names[PEAK_BF16], best ? "the best" : "medians", rounds,
           timing_clock == CLOCK_MONOTONIC ? "wall" : "CPU", load_average());
    printf("%5s %5s %5s %2s", "M", "N", "K", "tt");
    for (int c = 0; c < CONTENDERS; c++)
        printf(" | %*s", c == AG_BF16_PRODUCT ? 18 : 12, contender_names[c]);
    printf(" |\n");
    if (argc - a == 5) {
        shape s = {atoi(argv[a]), atoi(argv[a + 1]), atoi(argv[a + 2]), atoi(argv[a + 3]) != 0,
                   atoi(argv[a + 4]) != 0, "given"};
        if (s.M < 1 || s.N < 1 || s.K < 1) return usage();
        measure(&s, rounds, best, peak);
        peak_again(peak);
        return 0;
    }
    // Y = X W^T (W [out, in]), dX = dY W, dW = dY^T X, with M = B*T = 1024.
    static const shape shapes[] = {
        {1024, 2304, 768, false, true, "qkv forward"},
        {1024, 768, 768, false, true, "out forward"},
        {1024, 3072, 768, false, true, "fc forward"},
        {1024, 768, 3072, false, true, "proj forward"},
        {1024, 768, 2304, false, false, "qkv dX"},
        {1024, 768, 768, false, false, "out dX"},
        {1024, 768, 3072, false, false, "fc dX"},
        {1024, 3072, 768, false, false, "proj dX"},
        {2304, 768, 1024, true, false, "qkv dW"},
        {768, 768, 1024, true, false, "out dW"},
        {3072, 768, 1024, true, false, "fc dW"},
        {768, 3072, 1024, true, false, "proj dW"},
        {256, 256, 64, false, true, "attention block: scores Q K^T, d 64"},
        {256, 64, 256, false, false, "attention block: P V"},
        {256, 64, 256, true, false, "attention block: dK = dS^T Q"},
        {32, 32, 16, false, true, "demo scores, T 32, d 16"},
        {32, 16, 32, false, false, "demo P V"},
        {2048, 192, 64, false, true, "demo in_proj, B*T 2048, E 64"},
        {1, 2304, 768, false, true, "one row (generation)"},
        {1536, 1536, 1536, false, false, "square"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        measure(&shapes[i], rounds, best, peak);
    peak_again(peak);
#ifdef AG_BENCH_DNNL
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
#endif
    return 0;
}
