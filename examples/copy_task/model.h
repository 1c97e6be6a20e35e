// The copy-task models, built from attograd's modules.
//
// Decoder-only (the default):
//     x = tok_emb(ids) + pos_emb(0..T-1)                      [B, T, E]
//     for each layer:  x = LayerNorm(x + MHA(x, x, x, causal))
//     logits = head(x)                                        [B, T, V]
// Encoder-decoder (--cross): the encoder reads the first half, and every
// decoder position attends to it through cross-attention:
//     e = tok_emb(source) + pos_emb;   for each layer: e = LN(e + MHA(e, e, e))
//     d = tok_emb(dec_in) + pos_emb;   for each layer: d = LN(d + MHA(d, e, e))
//     logits = head(d)
// With no_attention, every attention output is replaced by zeros: the
// ablation that shows the attention does the work.
#ifndef COPY_TASK_MODEL_H
#define COPY_TASK_MODEL_H

#include <attograd.h>

#define MAX_LAYERS 8

typedef struct {
    int vocab, d_model, heads, layers, max_len;
    double dropout;
    bool cross, no_attention;
    ag_pos_kind pos;   // NONE: a learned absolute table pos_emb [max_len, E]; otherwise no
                       // pos_emb, and every attention carries the positions (--pos)
    int max_distance;  // RELATIVE's M, T5's max_distance (0: the library's default)
    int layer_heads[MAX_LAYERS];  // heads left in layer l's (decoder) attention after
                                  // pruning, each of d_model / heads dims; 0: heads
} model_config;

typedef struct {
    model_config cfg;
    ag_params *ps;
    ag_embedding_layer tok, pos;
    ag_mha attn[MAX_LAYERS];  // causal self-attention, or cross-attention with cfg.cross
    ag_layernorm_layer norm[MAX_LAYERS];
    ag_mha enc_attn[MAX_LAYERS];  // the encoder's self-attention (cfg.cross only)
    ag_layernorm_layer enc_norm[MAX_LAYERS];
    ag_linear_layer head;
} model;

// What one forward pass needs: token ids (for cross, the source and the
// decoder input) and how dropout is drawn this step.
typedef struct {
    int B;
    int T;                  // decoder-only: sequence positions; cross: decoder positions
    const int32_t *ids;     // [B, T]
    int S;                  // cross: source positions
    const int32_t *source;  // cross: [B, S]
    bool training;
    uint64_t dropout_seed;
    ag_tensor *const *head_masks;  // NULL, or one float [heads] per layer (of cfg.layers):
                                   // the head_mask of the decoder attention of that layer
} model_input;

bool model_init(model *m, const model_config *cfg, ag_dtype dt, uint64_t seed);
void model_free(model *m);
// -> logits [B, T, V]. If `weights` is non-NULL, weights[l] receives layer l's
// per-head attention weights [B, h, T, S] (for the heatmap).
ag_tensor *model_forward(ag_tape *tp, const model *m, const model_input *in, ag_tensor **weights);

#endif
