// A byte-level GPT: token embedding, positions (a learned table added to it, or a
// scheme inside the attention: relative, T5, ALiBi, RoPE, sinusoidal), N pre-LN causal
// transformer blocks, a final LayerNorm, and an output head tied to the token embedding
// (or its own, untied). Parameter names: wte.weight [256, E], wpe.weight [ctx, E] (learned
// positions only), blocks.<i>.* (PyTorch's TransformerEncoderLayer names),
// ln_f.weight/bias, head.weight (untied only).
#ifndef TINY_LM_MODEL_H
#define TINY_LM_MODEL_H

#include <attograd.h>

#define LM_VOCAB 256
#define LM_MAX_LAYERS 64

// The pcg32 streams of --seed, one for each use, so that no two draw the same numbers.
enum {
    LM_STREAM_INIT = 1,       // the initial weights
    LM_STREAM_SAMPLE = 3,     // the sampled text
    LM_STREAM_VALID = 7,      // the validation windows, the same ones at every validation
    LM_STREAM_BATCH = 1000,   // + step: that step's training windows (a resumed run draws
                              // the ones it would have drawn)
};

typedef struct {
    int ctx, d_model, heads, layers, ff;  // ff 0: 4 * d_model
    int pos;                              // an ag_pos_kind; AG_POS_NONE: learned (wpe)
    double dropout;
    bool untied, f64;
} lm_config;

typedef struct {
    lm_config cfg;
    ag_params *ps;
    ag_embedding_layer wte, wpe;
    ag_block blocks[LM_MAX_LAYERS];
    ag_layernorm_layer ln_f;
    ag_linear_layer head;  // untied only
} lm;

// Builds the model with fresh weights drawn from seed, and marks what AdamW decays.
// false after reporting.
bool lm_init(lm *m, const lm_config *cfg, uint64_t seed);
void lm_free(lm *m);

// ids [B, T] bytes (T <= ctx) -> logits [B, T, 256].
ag_tensor *lm_forward(ag_tape *tp, const lm *m, const int32_t *ids, int B, int T, bool training,
                      uint64_t dropout_seed);

// Writes n bytes sampled after `prompt` to out (drawn as `sc` says from pcg32 (seed,
// LM_STREAM_SAMPLE)), one position at a time against the blocks' KV caches (ag_generate),
// under autocast when bf16 (the linear layers reading bf16 copies of their weights). false
// if sampling met a NaN.
bool lm_generate(const lm *m, const char *prompt, int n, const ag_sample_config *sc,
                 uint64_t seed, bool bf16, FILE *out);

#endif
