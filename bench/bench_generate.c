// Generation, token after token, through the KV caches (ag_generate): milliseconds per
// token and tokens per second for a GPT of `layers` pre-LN blocks, GPT-2's ends (wte,
// wpe or a position scheme inside the attention, ln_f, the tied head), greedy sampling,
// a prompt of 4 tokens and then `tokens` drawn ones within one context (no restart of
// the window), and the bytes the caches hold (heap bytes of ag_generator_new beyond the
// model's). A token reads every weight once (the position table a row): "weights GB/s" is
// their bytes over a token's time, "%read" its share of the memory read bandwidth
// measured in the same run (bench/peak.h) on as many threads, the ceiling of a model too
// large for the caches. Then the bytes of the KV caches of each shape by the number of kv heads
// (grouped-query attention: h_kv = h, h/2, h/4, 1), from ag_kv_cache_bytes.
//
//   bench_generate [--cpu] [--bf16] [--pos SCHEME|all] [--kv-heads n]
//                  [layers E h ff tokens [threads]]
//       the two shapes below (tiny_lm's default model, and a wider one), or the one given;
//       threads 1 and 2, or the given count. Each time is the median of ROUNDS runs;
//       --cpu: the calling thread's CPU time instead of the wall clock (one thread, on a
//       busy machine). --kv-heads: the blocks' num_kv_heads (0, the default: h). --bf16:
//       each also under autocast (ag_generator_set_autocast: the linear layers read bf16
//       copies of their weights), the two generators' runs interleaved, and the speed
//       ratio: the median of the rounds' ratios.
//   bench_generate [--cpu] --tiny-lm
//       what `tiny_lm --generate` does with its default model, one thread: 4000 bytes
//       drawn at temperature 0.8 and top-p 0.95 in a context of 64, the window started
//       again from its second half each time it fills (tiny_lm prints bytes/s by the wall
//       clock, which a busy machine slows).
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC)

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attograd.h"
#include "peak.h"  // load_average, and timing.h
#include "schemes.h"

enum { VOCAB = 256, PROMPT = 4, ROUNDS = 5 };


typedef struct {
    ag_params *ps;
    ag_tensor *wte, *wpe;
    ag_block *blocks;
    ag_layernorm_layer ln_f;
    int layers;
} gpt;

static gpt gpt_make(int layers, int E, int h, int kvh, int ff, int context, ag_pos_kind pos) {
    gpt g = {ag_params_new(AG_F32), NULL, NULL, calloc((size_t)layers, sizeof(ag_block)), {0},
             layers};
    ag_pcg32 rng = ag_pcg32_make(7, 8);
    ag_embedding_layer wte, wpe;
    ag_embedding_layer_init(&wte, g.ps, "wte", VOCAB, E, &rng);
    g.wte = wte.weight;
    if (pos == AG_POS_NONE) {
        ag_embedding_layer_init(&wpe, g.ps, "wpe", context, E, &rng);
        g.wpe = wpe.weight;
    }
    ag_block_config bc = {.d_model = E, .num_heads = h, .dim_feedforward = ff,
                          .activation = AG_ACT_GELU, .norm_first = true, .pos = pos,
                          .num_kv_heads = kvh};
    for (int l = 0; l < layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "h.%d", l);
        if (!ag_block_init(&g.blocks[l], g.ps, name, &bc, &rng)) exit(1);
        if (g.blocks[l].self_attn.pos_table)
            ag_tensor_init_normal(g.blocks[l].self_attn.pos_table, &rng, 0, 0.1);
    }
    ag_layernorm_layer_init(&g.ln_f, g.ps, "ln_f", E);
    return g;
}

static void gpt_free(gpt *g) {
    ag_params_free(g->ps);
    free(g->blocks);
}

typedef struct {
    double ms_per_token;
    size_t cache_bytes;
} result;

// Bytes of weights a token reads: every parameter but the position table, of which it
// reads one row (the tied head reads all of wte). In bf16 (autocast) the weights of the
// linear layers (the projections, the feed-forward and the tied head) are read as their
// bf16 copies, half the bytes; the biases, LayerNorms and the position row as float32.
static double weight_bytes(const gpt *g, ag_autocast ac) {
    const size_t all = ag_params_buffer_len(g->ps) * sizeof(float);
    size_t halved = 0;
    if (ac == AG_AUTOCAST_BF16) {
        halved = g->wte->numel;
        for (int l = 0; l < g->layers; l++) {
            const ag_block *b = &g->blocks[l];
            const ag_mha *m = &b->self_attn;
            const ag_tensor *w[] = {m->in_proj_weight, m->q_proj_weight, m->k_proj_weight,
                                    m->v_proj_weight, m->out_proj.weight, b->linear1.weight,
                                    b->linear2.weight};
            for (int i = 0; i < 7; i++) halved += w[i] ? w[i]->numel : 0;
        }
    }
    return (double)(all - (g->wpe ? g->wpe->numel * sizeof(float) : 0) -
                    halved * sizeof(uint16_t));
}

// `tokens` after the prompt in a window of `context` positions, drawn by `how`, under each
// of the n autocast settings: their runs interleaved (A B A B ...), each a median. ratio:
// the median over the rounds of the first setting's time over the second's (n = 2).
static void measure(const gpt *g, int tokens, int context, const ag_sample_config *how,
                    int threads, int n, const ag_autocast *modes, result *r, double *ratio) {
    ag_threads_set(threads);
    ag_decoder d = {g->blocks, g->layers, context, .wte = g->wte, .wpe = g->wpe,
                    .ln_f = &g->ln_f, .head = g->wte};
    ag_generator *gen[2];
    ag_sampler *s[2];
    for (int i = 0; i < n; i++) {
        const size_t before = ag_memory_usage().bytes_live;
        gen[i] = ag_generator_new(&d);
        r[i] = (result){0, ag_memory_usage().bytes_live - before};
        ag_generator_set_autocast(gen[i], modes[i]);
        s[i] = ag_sampler_new(VOCAB, how, 1, 1);
    }
    int32_t prompt[PROMPT] = {72, 101, 108, 108};
    int32_t *out = malloc((size_t)tokens * sizeof *out);
    timings t[2] = {{{0}, 0, 0}, {{0}, 0, 0}}, ratios = {{0}, 0, 0};
    for (int round = 0; round <= ROUNDS; round++) {  // round 0 warms up
        double took[2];
        for (int i = 0; i < n; i++) {
            double t0 = now();
            if (ag_generate(gen[i], prompt, PROMPT, tokens, s[i], out, NULL, NULL) != tokens)
                exit(1);
            took[i] = (now() - t0) / (PROMPT + tokens);
            if (round > 0) t[i].t[t[i].n++] = took[i];
        }
        if (round > 0 && n == 2) ratios.t[ratios.n++] = took[0] / took[1];
    }
    for (int i = 0; i < n; i++) {
        r[i].ms_per_token = 1e3 * median(&t[i]);
        ag_sampler_free(s[i]);
        ag_generator_free(gen[i]);
    }
    if (n == 2) *ratio = median(&ratios);
    free(out);
    ag_threads_set(1);
}

static const ag_sample_config greedy = {0, 0, 1};

// tiny_lm's default model (examples/tiny_lm: 4 blocks of 64, 4 heads, context 64, a
// learned position table) as `tiny_lm --generate` samples it.
static int tiny_lm(void) {
    enum { CONTEXT = 64, BYTES = 4000 };
    const ag_sample_config tiny_lm_sampling = {.temperature = 0.8, .top_k = 0, .top_p = 0.95};
    ag_tape_free(ag_tape_new());  // pins OpenBLAS to one thread
    gpt g = gpt_make(4, 64, 4, 0, 256, CONTEXT, AG_POS_NONE);
    result r;
    measure(&g, BYTES, CONTEXT, &tiny_lm_sampling, 1, 1, (ag_autocast[]){AG_AUTOCAST_OFF}, &r,
            NULL);
    printf("tiny_lm --generate (default model, %d bytes, temperature 0.8, top-p 0.95, context "
           "%d), 1 thread, %s: %.1f us a byte, %.0f bytes/s (median of %d runs); load %s\n",
           BYTES, CONTEXT, timing_clock == CLOCK_MONOTONIC ? "wall clock" : "CPU time",
           1e3 * r.ms_per_token, 1e3 / r.ms_per_token, ROUNDS, load_average());
    gpt_free(&g);
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_generate [--cpu] [--bf16] [--pos ");
    schemes_print(stderr);
    fprintf(stderr, "all] [--kv-heads n] [layers E h ff tokens [threads]]\n"
                    "       bench_generate [--cpu] --tiny-lm\n");
    return 2;
}

// The bytes of one generation's caches (every layer's, batch 1, the whole context) with
// h_kv = h, h/2, h/4 and 1 kv heads, against plain attention's.
static void cache_bytes_by_kv_heads(const int *sh) {
    const int h = sh[2], kvs[] = {h, h / 2, h / 4, 1};
    size_t full = 0;
    for (int i = 0; i < 4; i++) {
        const int kvh = kvs[i];
        if (kvh < 1 || h % kvh || (i > 0 && kvh == kvs[i - 1])) continue;
        gpt g = gpt_make(sh[0], sh[1], h, kvh, sh[3], PROMPT + sh[4], AG_POS_ROPE);
        size_t bytes = 0;
        for (int l = 0; l < sh[0]; l++) {
            ag_kv_cache *c = ag_kv_cache_new_block(&g.blocks[l], 1, PROMPT + sh[4]);
            bytes += ag_kv_cache_bytes(c);
            ag_kv_cache_free(c);
        }
        if (kvh == h) full = bytes;
        printf("%6d %4d %2d %5d %6d | %4d | %11zu | %5.3f\n", sh[0], sh[1], h, sh[3], sh[4],
               kvh, bytes, (double)bytes / (double)full);
        gpt_free(&g);
    }
}

int main(int argc, char **argv) {
    // layers, E, h, ff, tokens: tiny_lm's default model, and a wider one.
    const int shapes[][5] = {{4, 64, 4, 256, 60}, {4, 256, 8, 1024, 250}};
    int one[5] = {0}, threads_only = 0, a = 1;
    const char *pos = "none";
    if (a < argc && strcmp(argv[a], "--cpu") == 0) {
        timing_clock = CLOCK_THREAD_CPUTIME_ID;
        a++;
    }
    bool bf16 = false;
    if (a < argc && strcmp(argv[a], "--bf16") == 0) {
        bf16 = true;
        a++;
    }
    if (a + 1 < argc && strcmp(argv[a], "--pos") == 0) {
        pos = argv[a + 1];
        a += 2;
    }
    if (a + 1 == argc && strcmp(argv[a], "--tiny-lm") == 0) return tiny_lm();
    int kv_heads = 0;
    if (a + 1 < argc && strcmp(argv[a], "--kv-heads") == 0) {
        kv_heads = atoi(argv[a + 1]);
        a += 2;
        if (kv_heads < 1) return usage();
    }
    const int rest = argc - a;
    if (rest != 0 && rest != 5 && rest != 6) return usage();
    for (int i = 0; i < 5 && rest; i++) one[i] = atoi(argv[a + i]);
    if (rest == 6) threads_only = atoi(argv[a + 5]);
    if ((rest && (one[0] < 1 || one[1] < 1 || one[2] < 1 || one[1] % one[2] || one[3] < 1 ||
                  one[4] < 1)) ||
        threads_only < 0 || threads_only > 2)
        return usage();
    const char *names[SCHEMES_MOST];
    const int schemes = schemes_list(names);
    bool on[SCHEMES_MOST], any = false;
    for (int k = 0; k < schemes; k++) any |= on[k] = schemes_takes(pos, k);
    if (!any) return usage();
    ag_tape_free(ag_tape_new());  // pins OpenBLAS to one thread
    const double read_gbs[2] = {peak_read_gbs(1), threads_only == 1 ? 0 : peak_read_gbs(2)};
    printf("generation, %s, greedy, prompt %d tokens; ms per token (median of %d runs, %s); "
           "memory read bandwidth %.1f GB/s (1 thread), %.1f (2), measured here; load %s\n",
           bf16 ? "f32 and bf16 (autocast) interleaved" : "f32", PROMPT, ROUNDS, timing_clock == CLOCK_MONOTONIC ? "wall clock" : "CPU time",
           read_gbs[0], read_gbs[1], load_average());
    printf("%6s %4s %2s %5s %6s | %-10s %3s %4s | %9s %9s | %11s | %12s %6s\n", "layers", "E",
           "h", "ff", "tokens", "pos", "thr", "prec", "ms/token", "tokens/s", "cache bytes",
           "weights GB/s", "%read");
    const int n_shapes = rest ? 1 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int si = 0; si < n_shapes; si++) {
        const int *sh = rest ? one : shapes[si];
        for (int k = 0; k < schemes; k++) {
            if (!on[k]) continue;
            gpt g = gpt_make(sh[0], sh[1], sh[2], kv_heads, sh[3], PROMPT + sh[4], (ag_pos_kind)k);
            for (int threads = 1; threads <= 2; threads++) {
                if (threads_only && threads != threads_only) continue;
                const ag_autocast modes[2] = {AG_AUTOCAST_OFF, AG_AUTOCAST_BF16};
                result r[2];
                double ratio = 0;
                measure(&g, sh[4], PROMPT + sh[4], &greedy, threads, bf16 ? 2 : 1, modes, r,
                        &ratio);
                for (int i = 0; i < (bf16 ? 2 : 1); i++) {
                    char low[32];
                    const double gbs = weight_bytes(&g, modes[i]) / r[i].ms_per_token * 1e-6;
                    printf("%6d %4d %2d %5d %6d | %-10s %3d %4s | %9.3f %9.0f | %11zu | %12.1f "
                           "%5.0f%%\n",
                           sh[0], sh[1], sh[2], sh[3], sh[4], schemes_lower(k, low), threads,
                           i ? "bf16" : "f32", r[i].ms_per_token, 1e3 / r[i].ms_per_token,
                           r[i].cache_bytes, gbs, 100 * gbs / read_gbs[threads - 1]);
                }
                if (bf16)
                    printf("%38s bf16 tokens/s over f32's: %.2fx (median of %d interleaved "
                           "pairs)\n", "", ratio, ROUNDS);
                fflush(stdout);
            }
            gpt_free(&g);
        }
    }
    printf("\nKV cache bytes by kv heads (grouped-query attention), batch 1, whole context\n");
    printf("%6s %4s %2s %5s %6s | %4s | %11s | %5s\n", "layers", "E", "h", "ff", "tokens",
           "h_kv", "cache bytes", "ratio");
    for (int si = 0; si < n_shapes; si++) cache_bytes_by_kv_heads(rest ? one : shapes[si]);
    return 0;
}
