// dates: an encoder-decoder that translates dates as people write them into ISO 8601.
//
//     ./build/examples/dates                          train, test on held-out dates, save
//     ./build/examples/dates --generate "nov 26 2026" translate one date with the saved model
//
// The model: torch.nn.Transformer (LAYERS encoder and LAYERS decoder layers, pre-LN)
// between learned character embeddings and positions and a linear head, with the names a
// PyTorch module with these attributes would give them: src_emb, src_pos, tgt_emb,
// tgt_pos, transformer.*, head. It trains on dates written 22 ways (data.c), ends with
// one line "test: exact_match=<fraction> n=<count> seconds=<s>" on dates never seen in
// training, and writes the attention of the last decoder layer over one held-out source
// (--svg) and the checkpoint (--save).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/checkpoint.h"
#include "../common/clock.h"
#include "../common/flags.h"
#include "../common/escape.h"
#include "../common/heatmap.h"
#include "../common/path.h"
#include "../common/progress.h"
#include "data.h"

// "dates: <msg>" on stderr, one line whatever the message's paths hold.
static void dates_error(const char *msg) {
    fputs("dates: ", stderr);
    put_line(msg, stderr);
}

enum { D_MODEL = 64, HEADS = 4, FF = 128, LAYERS = 2, BATCH = 64 };
enum { TEST_BATCH = 2000 };  // held-out examples translated at once
#define LR 2e-3  // AdamW's peak learning rate

typedef struct model {
    ag_params *ps;
    ag_embedding_layer src_emb, src_pos, tgt_emb, tgt_pos;
    ag_transformer transformer;
    ag_linear_layer head;
} model;

static bool model_init(model *m, uint64_t seed) {
    const int V = dates_vocab();
    ag_pcg32 rng = ag_pcg32_make(seed, 2);
    ag_transformer_config tc = {.layer = {.d_model = D_MODEL, .num_heads = HEADS,
                                          .dim_feedforward = FF, .norm_first = true},
                                .num_encoder_layers = LAYERS, .num_decoder_layers = LAYERS};
    m->ps = ag_params_new(AG_F32);
    return ag_embedding_layer_init(&m->src_emb, m->ps, "src_emb", V, D_MODEL, &rng) &&
           ag_embedding_layer_init(&m->src_pos, m->ps, "src_pos", DATES_SRC_MAX, D_MODEL, &rng) &&
           ag_embedding_layer_init(&m->tgt_emb, m->ps, "tgt_emb", V, D_MODEL, &rng) &&
           ag_embedding_layer_init(&m->tgt_pos, m->ps, "tgt_pos", DATES_TGT, D_MODEL, &rng) &&
           ag_transformer_init(&m->transformer, m->ps, "transformer", &tc, &rng) &&
           ag_linear_layer_init(&m->head, m->ps, "head", D_MODEL, V, true, &rng);
}

// Characters ids [n, L] plus the first L rows of the position table: [n, L, D_MODEL].
static ag_tensor *embed(ag_tape *tp, const ag_embedding_layer *e, const ag_embedding_layer *pos,
                        const int32_t *ids, int n, int L) {
    ag_tensor *x = ag_embedding_layer_forward(tp, e, ids, 2, (int[]){n, L});
    return ag_add(tp, x, ag_slice(tp, pos->weight, 0, 0, L));
}

static ag_tensor *encode(ag_tape *tp, const model *m, const dates_batch *b) {
    ag_tensor *src = embed(tp, &m->src_emb, &m->src_pos, b->src, b->n, b->S);
    ag_transformer_opts o = {.src_key_padding_mask = b->src_pad};
    return ag_transformer_encoder_forward(tp, &m->transformer.encoder, src, &o);
}

// The scores [n, DATES_TGT, vocab] of each next character of b's targets (teacher
// forcing); *cross, if asked, the last decoder layer's attention over the source.
static ag_tensor *logits(ag_tape *tp, const model *m, const dates_batch *b, ag_tensor **cross) {
    ag_tensor *tgt = embed(tp, &m->tgt_emb, &m->tgt_pos, b->tgt_in, b->n, DATES_TGT);
    ag_transformer_opts o = {.causal = true, .memory_key_padding_mask = b->src_pad,
                             .cross_weights = cross};
    ag_tensor *y = ag_transformer_decoder_forward(tp, &m->transformer.decoder, tgt,
                                                  encode(tp, m, b), &o);
    return ag_linear_layer_forward(tp, &m->head, y);
}

// b's sources translated (beams <= 1: greedy) through the decoder's caches: out [n,
// DATES_TGT], the ISO characters and DATES_END. tp: grad disabled.
static bool translate(ag_tape *tp, const model *m, const dates_batch *b, int beams, int32_t *out) {
    ag_seq2seq s2s = {.decoder = &m->transformer.decoder, .wte = m->tgt_emb.weight,
                      .wpe = m->tgt_pos.weight, .head = m->head.weight, .head_bias = m->head.bias};
    ag_search_config sc = {.max_new_tokens = DATES_TGT, .end_token = DATES_END,
                           .num_beams = beams, .length_penalty = 1};
    return ag_seq2seq_generate(&s2s, encode(tp, m, b), b->src_pad, AG_MASK_BLOCKS, &sc,
                               DATES_START, out, NULL, NULL);
}

typedef struct options {
    int steps, test, beams;
    uint64_t seed;
    const char *save, *svg, *generate;
} options;

static int train(model *m, const options *o) {
    dates_split split;
    dates_split_init(&split, o->seed, 0.1);  // a tenth of the days held out
    ag_optim_config oc = ag_optim_defaults(AG_ADAMW);
    ag_optim *opt = ag_optim_new(m->ps, &oc);
    ag_pcg32 train_rng = ag_pcg32_make(o->seed, 3), test_rng = ag_pcg32_make(o->seed, 4);
    dates_batch b = {0};
    ag_tape *tp = ag_tape_new();
    const double t0 = now_seconds();
    for (int step = 0; step < o->steps; step++) {
        dates_batch_draw(&b, &split, false, &train_rng, BATCH);
        ag_tape_reset(tp);
        ag_params_zero_grad(m->ps);
        ag_tensor *loss = ag_cross_entropy(tp, logits(tp, m, &b, NULL), b.tgt_out,
                                           (size_t)b.n * DATES_TGT, -1);
        ag_backward(tp, loss);
        ag_params_clip_grad_norm(m->ps, 1.0);
        ag_optim_set_lr(opt, ag_lr_warmup_cosine(step, o->steps / 20, o->steps, LR, 0));
        ag_optim_step(opt);
        if ((step + 1) % 250 == 0)
            printf("step %d: loss %.4f\n", step + 1, ag_tensor_item(loss, 0));
    }
    // The held-out examples, TEST_BATCH at a time, drawn as one batch of --test would be.
    // All at once, the decoder's memory grew with --test: 1000000 asked for 7.4 GB, and
    // aborted after the training, before the checkpoint was saved.
    ag_tape_set_grad_enabled(tp, false);
    ag_err err = {.msg = "out of memory for the held-out examples"};
    int32_t *out = malloc((size_t)TEST_BATCH * DATES_TGT * sizeof *out);
    int right = 0;  // translations exact to the end token
    bool ok = out != NULL;
    for (int done = 0; ok && done < o->test; done += b.n) {
        const int n = o->test - done < TEST_BATCH ? o->test - done : TEST_BATCH;
        dates_batch_draw(&b, &split, true, &test_rng, n);
        ag_tape_reset(tp);
        ok = translate(tp, m, &b, 1, out);
        for (size_t i = 0; ok && i < (size_t)b.n * DATES_TGT; i += DATES_TGT)
            right += !memcmp(out + i, b.tgt_out + i, DATES_TGT * sizeof *out);
    }
    printf("test: exact_match=%.4f n=%d seconds=%.1f\n", (double)right / o->test, o->test,
           now_seconds() - t0);
    // The attention over one held-out source while the decoder writes its ISO form.
    dates_batch_draw(&b, &split, true, &test_rng, 1);
    ag_tensor *w = NULL;
    logits(tp, m, &b, &w);
    char rows[DATES_TGT + 1];  // the output characters, '$' for the end
    snprintf(rows, sizeof rows, "%s$", b.iso[0]);
    ok = ok && (!o->svg || heatmap_svg(o->svg, b.text[0], w, DATES_TGT, b.S, rows, b.text[0],
                                       &err));
    ok = ok && (!o->save || !ag_params_save(m->ps, o->save, NULL, &err));
    if (!ok) dates_error(err.msg);
    free(out);
    dates_batch_free(&b);
    dates_split_free(&split);
    ag_tape_free(tp);
    ag_optim_free(opt);
    return ok ? 0 : 1;
}

static int generate(model *m, const options *o) {
    ag_err err;
    dates_batch b = {0};
    int32_t out[DATES_TGT];
    if (!checkpoint_load_checked(m->ps, NULL, o->save, 0, NULL, &err)) {
        dates_error(err.msg);
        return 2;
    }
    if (!dates_batch_of_text(&b, o->generate)) return 2;
    ag_tape *tp = ag_tape_new();
    ag_tape_set_grad_enabled(tp, false);
    bool ok = translate(tp, m, &b, o->beams, out);
    // A model that never draws the end (a checkpoint trained a few steps, or another
    // one) fills all DATES_TGT tokens: the loop read on past them.
    for (int j = 0; ok && j < DATES_TGT && out[j] >= 0 && out[j] != DATES_END; j++)
        putchar(dates_char(out[j]));
    putchar('\n');
    ag_tape_free(tp);
    dates_batch_free(&b);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    options o = {.steps = 1500, .test = 2000, .beams = 4, .seed = 1, .save = "dates.safetensors",
                 .svg = "dates_attention.svg"};
    flag flags[] = {
        FLAG("--steps", INT, &o.steps, 1, 1e7, false, "training steps"),
        FLAG("--test", INT, &o.test, 1, 1e6, false, "held-out examples to test on"),
        // At most 2^53, as flags.c asks of a FLAG_U64 range.
        FLAG("--seed", U64, &o.seed, 0, 9007199254740992.0, false,
             "the split, the weights and the batches"),
        FLAG("--save", STRING, &o.save, 0, 0, false, "the checkpoint (read by --generate)"),
        FLAG("--svg", STRING, &o.svg, 0, 0, false, "the attention picture"),
        FLAG("--generate", STRING, &o.generate, 0, 0, false, "translate this date with --save"),
        FLAG("--beams", INT, &o.beams, 1, 8, false, "beam search width for --generate")};
    ag_err err;
    int r = flags_parse("usage: dates [options]", flags, sizeof flags / sizeof *flags, argc,
                        argv, &err);
    if (r == 2) dates_error(err.msg);
    if (r) return r == 1 ? 0 : 2;
    // --generate only translates: training's flags beside it were dropped without a word
    // (dates --generate ... --svg a.svg drew nothing and exited 0).
    const int n_flags = (int)(sizeof flags / sizeof *flags);
    // (--seed too: the checkpoint replaces the weights it drew.) And --beams without
    // --generate was dropped the same way: the test after training decodes greedily.
    const char *const training_only[] = {"--steps", "--test", "--svg", "--seed", NULL};
    const char *unused = o.generate ? flags_first_given(flags, n_flags, training_only) : NULL;
    if (unused) {
        fprintf(stderr, "dates: --generate only translates with --save's checkpoint: it "
                "takes no %s\n", unused);
        return 2;
    }
    if (!o.generate && flags_given(flags, n_flags, "--beams")) {
        fprintf(stderr, "dates: --beams is the beam width of --generate; without it, the test "
                "after training decodes greedily\n");
        return 2;
    }
    // Where training writes at its end must work before it starts (a --save in a missing
    // directory was found after all the steps, and they were lost).
    const run_file files[] = {{"--save", o.save, true, NULL}, {"--svg", o.svg, true, NULL}};
    if (!o.generate && ((o.save && !checkpoint_path_usable("--save", o.save, &err)) ||
                        (o.svg && !checkpoint_path_usable("--svg", o.svg, &err)) ||
                        !run_files_distinct(files, 2, &err))) {
        dates_error(err.msg);
        return 2;
    }
    model m;
    if (!model_init(&m, o.seed)) return 2;
    r = o.generate ? generate(&m, &o) : train(&m, &o);
    ag_transformer_free(&m.transformer);
    ag_params_free(m.ps);
    return r;
}
