// Decoding an encoder-decoder, token after token: tokens per second of the cached decoder
// (ag_transformer_decoder_forward_cached: the memory projected once, the self-attention
// cached, one new position a step) against re-running the whole decoder on the prefix at
// every step (ag_transformer_decoder_forward, grad disabled, the last position's output),
// at source and target lengths 32 and 128. The model: nn.Transformer's decoder, LAYERS
// pre-LN layers of d_model E, H heads, feed-forward FF, float32, BATCH sequences decoded
// together; the tokens fed are fixed (what is timed is the decoder, not a search). The
// two contenders take turns (A B A B) ROUNDS times; each figure is the median.
//
//   bench_decode [--cpu] [threads]      --cpu: the thread's CPU time (one thread only)
#define _POSIX_C_SOURCE 200809L  // clock_gettime

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attograd.h"
#include "timing.h"

enum { E = 128, H = 4, FF = 512, LAYERS = 4, BATCH = 8, ROUNDS = 5 };

typedef struct {
    ag_params *ps;
    ag_transformer_decoder d;
    ag_tensor *memory, *x;  // [BATCH, S, E], the inputs of every position [BATCH, T, E]
} bench;

static bench bench_make(int S, int T) {
    bench b = {.ps = ag_params_new(AG_F32)};
    ag_pcg32 rng = ag_pcg32_make(3, 1);
    ag_block_config cfg = {.d_model = E, .num_heads = H, .dim_feedforward = FF,
                           .norm_first = true, .activation = AG_ACT_GELU};
    if (!ag_transformer_decoder_init(&b.d, b.ps, "decoder", &cfg, LAYERS, &rng)) exit(1);
    b.memory = ag_tensor_uniform(AG_F32, 3, (int[]){BATCH, S, E}, &rng, -1, 1);
    b.x = ag_tensor_uniform(AG_F32, 3, (int[]){BATCH, T, E}, &rng, -1, 1);
    return b;
}

static void bench_free(bench *b) {
    ag_tensor_free(b->memory);
    ag_tensor_free(b->x);
    ag_transformer_decoder_free(&b->d);
    ag_params_free(b->ps);
}

// Position t of every sequence, [BATCH, 1, E], on tp.
static ag_tensor *position(ag_tape *tp, const bench *b, int t) {
    return ag_slice(tp, b->x, 1, t, 1);
}

// Seconds to decode T positions through the caches (the memory's projection included).
static double cached(const bench *b, ag_decoder_cache *c, ag_tape *tp, int T) {
    static const int source[BATCH] = {0, 1, 2, 3, 4, 5, 6, 7};
    const double t0 = now();
    ag_decoder_cache_set_memory(c, b->memory, NULL, AG_MASK_BLOCKS);
    for (int t = 0; t < T; t++) {
        ag_tape_reset(tp);
        if (!ag_transformer_decoder_forward_cached(tp, &b->d, c, position(tp, b, t), source))
            exit(1);
    }
    return now() - t0;
}

// Seconds to decode T positions by running the whole decoder on each prefix.
static double recomputed(const bench *b, ag_tape *tp, int T) {
    const ag_transformer_opts causal = {.causal = true};
    const double t0 = now();
    for (int t = 0; t < T; t++) {
        ag_tape_reset(tp);
        ag_tensor *prefix = ag_slice(tp, b->x, 1, 0, t + 1);
        ag_tensor *y = ag_transformer_decoder_forward(tp, &b->d, prefix, b->memory, &causal);
        if (!y || !ag_slice(tp, y, 1, t, 1)) exit(1);
    }
    return now() - t0;
}

int main(int argc, char **argv) {
    int a = 1, threads = 1;
    if (a < argc && strcmp(argv[a], "--cpu") == 0) {
        timing_clock = CLOCK_THREAD_CPUTIME_ID;
        a++;
    }
    if (a < argc) threads = atoi(argv[a]);
    if (threads < 1 || (threads > 1 && timing_clock != CLOCK_MONOTONIC)) {
        fprintf(stderr, "usage: bench_decode [--cpu] [threads]  (--cpu: one thread)\n");
        return 2;
    }
    ag_threads_set(threads);
    printf("decoder: %d pre-LN layers, d_model %d, %d heads, ff %d, f32, batch %d, %d thread%s%s\n",
           LAYERS, E, H, FF, BATCH, threads, threads > 1 ? "s" : "",
           timing_clock == CLOCK_MONOTONIC ? "" : ", CPU time");
    printf("%6s %6s | %16s | %16s | %7s\n", "S", "T", "cached tok/s", "re-run tok/s", "ratio");
    const int lengths[2] = {32, 128};
    for (int i = 0; i < 4; i++) {
        const int S = lengths[i / 2], T = lengths[i % 2];
        bench b = bench_make(S, T);
        ag_decoder_cache *c = ag_decoder_cache_new(&b.d, BATCH, 1, T, S);
        ag_tape *tp = ag_tape_new();
        ag_tape_set_grad_enabled(tp, false);
        timings tc = {{0}, 0, 0}, tr = {{0}, 0, 0};
        for (int round = 0; round <= ROUNDS; round++) {  // round 0 warms up
            const double s1 = cached(&b, c, tp, T), s2 = recomputed(&b, tp, T);
            if (round > 0) {
                tc.t[tc.n++] = s1;
                tr.t[tr.n++] = s2;
            }
        }
        const double cached_tps = BATCH * T / median(&tc), rerun_tps = BATCH * T / median(&tr);
        printf("%6d %6d | %16.0f | %16.0f | %6.1fx\n", S, T, cached_tps, rerun_tps,
               cached_tps / rerun_tps);
        ag_tape_free(tp);
        ag_decoder_cache_free(c);
        bench_free(&b);
    }
    return 0;
}
