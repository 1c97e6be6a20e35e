// attograd/generate.h — text generation: sampling the next token from logits,
// and running a model one new position at a time against a KV cache.
#ifndef ATTOGRAD_GENERATE_H
#define ATTOGRAD_GENERATE_H

#include "attograd/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- Sampling ---------------------------------------------------------------------
// How the next token is drawn from a row of logits z[0..V):
//   temperature 0:  greedy, argmax z (the lowest index among equal maxima);
//   otherwise:      p = softmax(z / temperature), then
//                   top_k > 0:   only the k most probable tokens stay;
//                   top_p < 1:   only the smallest set of most probable tokens
//                                whose probability adds up to >= top_p stays
//                                (at least one token);
//                   the kept probabilities are renormalised and one token is
//                   drawn with u = ag_pcg32_double in [0, 1).
// Ties in probability rank by lower index, so a draw depends only on the logits,
// the configuration and the generator.
// A zeroed config is greedy; a field left 0 turns its filter off, so
// {.temperature = 0.8} samples from every token.
typedef struct ag_sample_config {
    double temperature;  // >= 0 and finite; 0 is greedy (top_k and top_p are then unused,
                         // but held to their ranges, as ag_sampler_new checks them)
    int top_k;           // >= 0; 0 keeps every token
    double top_p;        // in [0, 1]; 0 and 1 keep every token
} ag_sample_config;

typedef struct ag_sampler ag_sampler;

// A sampler for `vocab` tokens drawing from pcg32 (seed, stream). Its scratch is
// allocated here, once: drawing allocates nothing. Reports and returns NULL on
// a bad configuration.
ag_sampler *ag_sampler_new(int vocab, const ag_sample_config *cfg, uint64_t seed,
                           uint64_t stream);
void ag_sampler_free(ag_sampler *s);

// The next token for row `row` of logits [..., V] (f32 or f64, V = vocab).
// A row in which no token has a finite probability is reported (one line naming the
// row) and gives -1, never a token: a row holding a NaN, a row entirely -inf, and,
// when sampling (temperature > 0), a row holding +inf, whose probabilities are
// exp(inf - inf) = NaN (PyTorch's multinomial raises on both). Greedy takes a +inf as
// the arg max, as torch.argmax does. A -inf among finite logits is a token of
// probability 0.
int ag_sampler_next(ag_sampler *s, const ag_tensor *logits, size_t row);

// ---- One position at a time: the KV cache ---------------------------------------------
// Generating token after token with ag_mha_forward would recompute the keys and
// values of every earlier position at every step. A KV cache keeps them: each step
// runs only the new positions, through the module's own forward code (the same
// projections, position scheme, fused attention kernels, LayerNorms and feed-forward
// as ag_mha_forward and ag_block_forward, grad disabled), and allocates nothing once
// warm (the cache's tape keeps its memory from step to step).
//
// For self-attention (kdim = vdim = E: the packed in_proj_weight, or grouped-query
// attention's separate projections), causal, in eval mode (no dropout), no other mask,
// with every setting ag_mha_init accepts (any position scheme, pruned heads, add_bias_kv,
// add_zero_attn, num_kv_heads, window): for x [B, E], the new
// position t of B sequences (or x [B, n, E], n new positions t .. t + n - 1),
//     ag_mha_forward_cached(m, c, x, out)    out (x's shape) = rows t .. of
//         ag_mha_forward(x_0.., x_0.., x_0.., causal) for each sequence,
//     ag_block_forward_cached(b, c, x)       x becomes rows t .. of
//         ag_block_forward(x_0.., causal, eval), in place,
// up to rounding (the same up to 1e-12 in float64 for 50 tokens, for every position
// scheme: tests/test_generate.c). Each call stores the new positions' keys and values
// (keys rotated at their positions with RoPE) and advances the cache by n; t counts
// from 0 after ag_kv_cache_reset.
typedef struct ag_kv_cache ag_kv_cache;

// A cache for up to max_len positions of `batch` sequences, for one module (the
// cache remembers it, and its ag_mha.version: it refuses another module, and this one
// after ag_mha_prune_heads). Reports and returns NULL for attention whose kdim or vdim
// is not E (not self-attention). A module with a sliding window W keeps the last W
// positions only, whatever max_len, and runs any number of them.
ag_kv_cache *ag_kv_cache_new(const ag_mha *m, int batch, int max_len);
ag_kv_cache *ag_kv_cache_new_block(const ag_block *b, int batch, int max_len);
void ag_kv_cache_free(ag_kv_cache *c);
void ag_kv_cache_reset(ag_kv_cache *c);              // forget every position
int ag_kv_cache_len(const ag_kv_cache *c);           // positions stored
int ag_kv_cache_capacity(const ag_kv_cache *c);      // max_len; with a sliding window W
                                                     // (ag_mha_config.window): W, the ring
                                                     // of the last W positions, and the
                                                     // cache never fills
// The bytes of its key and value buffers (the reorder spares aside): batch x (max_len +
// extra keys, or W with a sliding window) x h_kv * d x 2 elements of the module's dtype,
// so grouped-query attention divides them by h / h_kv.
size_t ag_kv_cache_bytes(const ag_kv_cache *c);

// A step may run fewer sequences than the cache holds: x [rows, E] or [rows, n, E] with
// rows <= batch is the first `rows` sequences (a search's live hypotheses). The others
// then miss those positions: a later step of more rows is refused until ag_kv_cache_reset.
//
// Report and return false on a wrong shape or dtype (x and out: [rows, E] or
// [rows, n, E] in the parameters' dtype, rows <= batch), new positions beyond the
// capacity, a cache made for another module, or a module changed since (pruned, made
// again).
bool ag_mha_forward_cached(const ag_mha *m, ag_kv_cache *c, const ag_tensor *x,
                           ag_tensor *out);
bool ag_block_forward_cached(const ag_block *b, ag_kv_cache *c, ag_tensor *x);

// Beams change places between steps: sequence i (i < n <= batch) becomes what sequence
// from[i] was, every position stored (a sequence may be the source of several, or of
// none), as ag_search_model.reorder asks. Sequences n .. batch - 1 are left undefined
// (they hold no live hypothesis then): a later step of more than n rows, or a reorder
// from them, is refused until ag_kv_cache_reset (to keep a sequence, list it: from[i] =
// i). A reorder that only drops sequences (from increasing, as when hypotheses finish)
// moves them in place; the first other call makes a buffer the size of the cache's keys
// and values, and later calls allocate nothing. False after reporting (an index outside
// [0, batch), or undefined).
bool ag_kv_cache_reorder(ag_kv_cache *c, const int *from, int n);

// ---- An encoder-decoder's decoder, token after token -------------------------------------
// The caches of an ag_transformer_decoder for decoding `batch` inputs with up to `beams`
// hypotheses each: every layer's self-attention keys and values (as ag_kv_cache), and its
// attention's keys and values over the encoder's memory, projected once per set of
// inputs by ag_decoder_cache_set_memory and kept. A step then runs only the new
// position of each live hypothesis, through the layers' own code (the same projections,
// fused attention kernels, LayerNorms and feed-forward as the decoder's forward), with
// grad disabled, and allocates nothing once the tape has grown to a step's size.
typedef struct ag_decoder_cache ag_decoder_cache;

// For up to max_len target positions and max_src memory positions. NULL after reporting.
// The cache keeps `d` (set_memory and reorder read the decoder through it): d must stay
// where it is while the cache is used; the cache may be freed before or after it. A
// decoder changed since (made again, freed, heads pruned in any layer) is refused by
// set_memory, the step and reorder: make a new cache.
ag_decoder_cache *ag_decoder_cache_new(const ag_transformer_decoder *d, int batch, int beams,
                                       int max_len, int max_src);
void ag_decoder_cache_free(ag_decoder_cache *c);

// A new set of inputs: memory [B, S, E] (B <= batch, S <= max_src; the encoder's output)
// and its key padding mask (bool [B, S] in `polarity`, or NULL). Projects every layer's
// keys and values of the memory, and forgets every target position. False after
// reporting.
bool ag_decoder_cache_set_memory(ag_decoder_cache *c, ag_tensor *memory,
                                 const ag_tensor *memory_key_padding_mask,
                                 ag_mask_polarity polarity);

// x [rows, E] (or [rows, n, E]): the next position (or n positions) of `rows` hypotheses,
// hypothesis i continuing input source[i], the rows grouped by input in input order (as
// ag_search_hyps gives them; an input absent from a step has finished and is dropped
// for good). Returns, on tp (grad disabled), rows t .. of
//     ag_transformer_decoder_forward(x_0.., memory, causal, memory_key_padding_mask)
// for each hypothesis (t: the positions before), the final norm included, up to
// rounding (1e-12 in float64: tests/test_decoder_cache.c). NULL after reporting.
ag_tensor *ag_transformer_decoder_forward_cached(ag_tape *tp, const ag_transformer_decoder *d,
                                                 ag_decoder_cache *c, ag_tensor *x,
                                                 const int *source);

// Hypothesis i (i < n) now continues what hypothesis from[i] was: the self-attention
// caches follow (ag_kv_cache_reorder), for ag_search_model.reorder. False after
// reporting.
bool ag_decoder_cache_reorder(ag_decoder_cache *c, const int *from, int n);

// ---- A decoder-only model, token after token -------------------------------------------
// What a GPT-style model is to generation: an input for each token at each
// position, a stack of causal blocks, and logits from the last block's output. The
// blocks, their KV caches, the context window and the sampling loop are the same for
// every such model, and live here. The two ends are GPT-2's unless the model says
// otherwise: the input is row `token` of wte plus, with learned positions, row `pos`
// of wpe; the logits are ln_f(x) head^T (head = wte when tied). A model with other
// ends passes them as callbacks.
typedef struct ag_decoder {
    const ag_block *blocks;  // `layers` blocks, each run causally against its own cache
    int layers;
    int context;             // positions the model takes (0 .. context - 1)
    // GPT-2's ends (when embed_fn / head_fn are NULL):
    ag_tensor *wte;                  // [V, E]
    ag_tensor *wpe;                  // [context, E], or NULL (positions inside attention)
    const ag_layernorm_layer *ln_f;  // or NULL (none)
    ag_tensor *head;                 // [V, E]
    // Other ends: the first block's input [1, E] for `token` at position `pos`, and
    // the logits [1, V] of the last block's output x [1, E], built on tp (grad
    // disabled: any ops, e.g. ag_embedding(tp, wte, &token, 1, (int[]){1}) plus
    // ag_slice(tp, wpe, 0, pos, 1)). NULL after reporting stops the generation.
    ag_tensor *(*embed_fn)(ag_tape *tp, const void *model, int32_t token, int pos);
    ag_tensor *(*head_fn)(ag_tape *tp, const void *model, ag_tensor *x);
    const void *model;       // passed to embed_fn and head_fn
} ag_decoder;

typedef struct ag_generator ag_generator;

// The caches of every block (one sequence, `context` positions), a tape for the two
// callbacks, and room for one context of tokens: everything generating needs,
// allocated here, so that a token costs no allocation once the tape has grown to a
// step's size. Reports and returns NULL for a bad decoder (no blocks, context < 1,
// neither wte nor embed_fn, neither head nor head_fn) or blocks the cache refuses, and
// checks now what a generation would otherwise find wrong in its middle: every block of
// the first block's dtype and d_model E, and (where no callback replaces them) wte
// [V, E], wpe [>= context, E], head [<= V, E] (a token it draws is fed back through
// wte) and ln_f's [E], all in the blocks' dtype. The decoder is copied; what it points
// to must outlive the generator.
ag_generator *ag_generator_new(const ag_decoder *d);
void ag_generator_free(ag_generator *g);

// Feeds prompt[0 .. n_prompt) (n_prompt >= 1 tokens, each a row of wte unless embed_fn
// embeds them: checked before the first step), then draws n
// tokens with `s`, each fed back in turn, into out[0 .. n) (out may be NULL) and to
// `emit` (when not NULL) as they come. Every position runs once against the caches.
// When the context is full, the window starts again from its last (context + 1) / 2
// tokens (the caches are refilled with them), so any n is possible; a prompt longer
// than the context is cut to its last `context` tokens. Blocks that all attend through a
// sliding window (ag_block_config.window) with a position scheme inside their attention,
// and no wpe, never start again: each token is one step at the next position, past the
// context (embed_fn then sees such positions), exactly the whole causal forward over
// every token fed. Returns the number of
// tokens drawn: n, or fewer when a callback or the sampler (a row of logits without a
// finite probability) failed, after reporting. A block changed since the generator was
// made (heads pruned, made again) is refused before any step: make a new generator. One
// generation of a generator at a time: ag_generate or ag_generator_free called from its
// emit or a callback, or from another thread meanwhile, is refused (the free leaves the
// generator to be freed after ag_generate returns).
int ag_generate(ag_generator *g, const int32_t *prompt, int n_prompt, int n, ag_sampler *s,
                int32_t *out, void (*emit)(int32_t token, void *user), void *user);

// Autocast for generating (ag_tape_set_autocast: products on bfloat16 operands summed in
// float32, everything else float32), on the generator's own tape: the blocks' steps and
// the built-in head; a callback sees it on its tape. With AG_AUTOCAST_BF16, a step of up to 4
// positions (each token after the prompt) reads bf16 copies of the weights of its linear layers
// (parameters of an ag_params: the projections, feed-forward and head), half the bytes of
// float32, made at their first use in each generation (the parameters as they are when
// ag_generate starts; the first token allocates them, later ones nothing). The logits
// then match the autocast forward of the model over the same tokens up to the order of
// float32 sums. Off by default; returns the previous setting (a NULL generator or an
// unknown mode is reported, as ag_tape_set_autocast reports them, and changes nothing).
ag_autocast ag_generator_set_autocast(ag_generator *g, ag_autocast mode);
ag_autocast ag_generator_autocast(const ag_generator *g);

// ---- Sequences: greedy, sampling and beam search, batched -------------------------------
// One search for encoder-decoder and decoder-only models alike. Each of `batch` inputs
// starts from `start_len` tokens (an encoder-decoder's start token; a decoder-only
// model's prompt) and grows hypotheses token by token, until each ends with the end
// token (included) or holds max_new_tokens generated tokens. The model is a step: the
// next-token scores of every live hypothesis.
//
//   num_beams 0 or 1:  one hypothesis per input, its next token drawn by an ag_sampler
//                      with `sample` (a zeroed config: greedy, the argmax);
//   num_beams K >= 2:  beam search as Hugging Face's BeamSearchScorer defines it: at each
//                      step, over the K live beams of an input, the 2K best continuations
//                      by the sum of log-probabilities (ties: lower beam, then lower token);
//                      in that order, an end token among the first K finishes a hypothesis,
//                      any other continuation becomes a live beam until K are live. A
//                      finished hypothesis of n generated tokens (the end token counted,
//                      the start tokens not) scores sum log p / n^length_penalty, as
//                      fairseq and Hugging Face score it; each input keeps its K best
//                      finished (a later one replaces the worst only if strictly better).
//                      An input is done when it holds K finished and `stop` says so
//                      (below); at max_new_tokens its live beams join the finished ones,
//                      scored by their length. At the first step only one beam is live.
// Every hypothesis's log-probabilities are the log_softmax of the scores the model
// gives (logits or log-probabilities both do). The returned score of a hypothesis is
// its sum of log-probabilities over n^length_penalty in every mode.
typedef enum ag_beam_stop {
    AG_BEAM_STOP_HEURISTIC,  // Hugging Face's early_stopping=False (its default): done when
                             // no live beam can beat the worst finished one at its present
                             // length: worst >= best candidate sum / n^length_penalty
    AG_BEAM_STOP_EARLY,      // early_stopping=True (fairseq's rule): done with K finished
    AG_BEAM_STOP_NEVER,      // early_stopping="never": as HEURISTIC, but with length_penalty
                             // > 0 the bound divides by max_new_tokens^length_penalty
} ag_beam_stop;

typedef struct ag_search_config {
    int max_new_tokens;      // >= 1
    int end_token;           // ends a hypothesis (and is part of it); < 0: none
    int num_beams;           // 0 or 1: greedy or sampling; >= 2: beam search
    int num_return;          // hypotheses returned per input, best first (0 means 1); at
                             // most num_beams with beams, 1 without
    double length_penalty;   // alpha in sum log p / n^alpha; 0 scores the plain sum (fairseq's
                             // and Hugging Face's default is 1: set it); refused unless
                             // max_new_tokens^|alpha| is within double's range
    ag_beam_stop stop;       // beam search only
    ag_sample_config sample; // without beams: zeroed is greedy; with beams: must be greedy
                             // (its other settings unused, but held to their ranges)
    uint64_t seed, stream;   // the sampler's pcg32
} ag_search_config;

// What the model sees at a step: n live hypotheses, each `len` tokens long (the start
// tokens, then those generated so far); the model returns the scores of each one's next
// token. Hypotheses are grouped by input, in input order.
typedef struct ag_search_hyps {
    int n;                  // live hypotheses
    int len;                // tokens each holds
    const int32_t *tokens;  // hypothesis i: tokens[i * stride .. i * stride + len)
    int stride;
    const int *source;      // [n]: the input (0 .. batch - 1) hypothesis i continues
} ag_search_hyps;

typedef struct ag_search_model {
    // Scores [n, vocab] (f32 or f64) for the next token of each live hypothesis, valid
    // until the next call; NULL after reporting stops the search. A model that keeps
    // state per hypothesis (a KV cache) runs only the tokens its state lacks: all
    // start_len of them at the first step, then each hypothesis's last token.
    ag_tensor *(*step)(void *model, const ag_search_hyps *h);
    // Called between steps when the live hypotheses changed places (beams reordered,
    // hypotheses finished): hypothesis i (i < n) now continues what hypothesis from[i]
    // was. NULL for a model that keeps no state per hypothesis. A model with state
    // needs room for batch * max(num_beams, 1) hypotheses. False after reporting stops
    // the search.
    bool (*reorder)(void *model, const int *from, int n);
    void *model;
} ag_search_model;

typedef struct ag_search ag_search;

// Everything a search of `batch` inputs of `start_len` tokens over `vocab` tokens
// needs, allocated here: a run allocates nothing itself. Reports and returns NULL on a
// bad configuration.
ag_search *ag_search_new(int batch, int vocab, int start_len, const ag_search_config *cfg);
void ag_search_free(ag_search *s);

// start [batch, start_len] tokens in [0, vocab). Writes, for input b and its r-th best
// hypothesis (i = b * num_return + r), its generated tokens to out[i * max_new_tokens ..]
// (-1 after the last), their count to lengths[i] (0 and score -INFINITY where an input
// has fewer hypotheses than num_return), and its score to scores[i] (lengths and scores
// may be NULL). Sampling draws from the search's own generator, made once from seed and
// stream: a second run continues its draws (greedy and beam search repeat exactly); a new
// search repeats the first run's.
// False after reporting (bad start tokens, a step's scores of the wrong shape or with a
// row holding a NaN or +inf (NaN log-probabilities) or no finite score, or a model failure).
// One run of a search at a time: ag_search_run or ag_search_free called from the model's
// step or reorder, or from another thread meanwhile, is refused (the free leaves the
// search to be freed after the run returns).
bool ag_search_run(ag_search *s, const ag_search_model *m, const int32_t *start, int32_t *out,
                   int *lengths, double *scores);

// ---- An encoder-decoder, decoded ----------------------------------------------------------
// What decoding needs of an encoder-decoder besides its decoder: the decoder's input for a
// token at a position, and the scores from the decoder's output. As for ag_decoder, the
// ends are the common ones unless callbacks say otherwise: the input is row `token` of
// wte plus row `pos` of wpe (when given); the scores are x head^T + head_bias.
typedef struct ag_seq2seq {
    const ag_transformer_decoder *decoder;
    ag_tensor *wte;        // [V, E]
    ag_tensor *wpe;        // [max positions, E], or NULL
    ag_tensor *head;       // [V, E]
    ag_tensor *head_bias;  // [V], or NULL
    // Other ends, on tp (grad disabled): the inputs [n, E] of tokens[0 .. n) at position
    // pos, and the scores [n, V] of the decoder's output x [n, E]. NULL after reporting
    // stops the decoding.
    ag_tensor *(*embed_fn)(ag_tape *tp, const void *model, const int32_t *tokens, int n,
                           int pos);
    ag_tensor *(*head_fn)(ag_tape *tp, const void *model, ag_tensor *x);
    const void *model;     // passed to embed_fn and head_fn
} ag_seq2seq;

// Decodes the B inputs whose encoder output is memory [B, S, E] (its key padding mask
// bool [B, S] in `polarity`, or NULL), each from start_token, as cfg says (greedy,
// sampling or beam search; out, lengths and scores as ag_search_run writes them, the
// start token not included), through the decoder's caches: the memory projected once,
// then one position a step. Allocates what the decoding needs once, at the start. Without
// embed_fn, wte needs a row for every token the head draws and wpe (when given) at least
// max_new_tokens rows; the built-in ends (wte and wpe without embed_fn, head and head_bias
// without head_fn) are [rows, E] ([V]) in the decoder's dtype and d_model E: all checked
// before the first step. False after reporting.
bool ag_seq2seq_generate(const ag_seq2seq *m, ag_tensor *memory,
                         const ag_tensor *memory_key_padding_mask, ag_mask_polarity polarity,
                         const ag_search_config *cfg, int32_t start_token, int32_t *out,
                         int *lengths, double *scores);

#ifdef __cplusplus
}
#endif
#endif
