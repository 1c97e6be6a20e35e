// tiny_lm: a byte-level GPT trained on a text file with attograd, then sampled.
//
//     ./build/examples/tiny_lm [options]      (--help lists them)
//
// Prints the unigram and bigram baselines, a progress line (train loss,
// validation bits per byte, tokens/s, time left), writes <out>.csv and
// <out>.svg (the loss curves), and ends with a sample of the model's text.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../common/plot.h"
#include "../common/progress.h"
#include "../common/text.h"
#include "options.h"

// Mean validation loss (nats per byte) over fixed windows: the same ones at every call.
static double validate(ag_tape *tp, const lm *m, const text_data *text, const options *o,
                       int32_t *ids, int32_t *targets) {
    ag_pcg32 rng = ag_pcg32_make(o->seed, 7);
    double sum = 0;
    bool was = ag_tape_set_grad_enabled(tp, false);
    for (int i = 0; i < o->eval_batches; i++) {
        text_windows(text, true, o->batch, o->model.ctx, &rng, ids, targets);
        ag_tape_reset(tp);
        ag_tensor *logits = lm_forward(tp, m, ids, o->batch, o->model.ctx, false, 0);
        sum += ag_tensor_get(ag_cross_entropy(tp, logits, targets,
                                              (size_t)o->batch * o->model.ctx, -1), 0);
    }
    ag_tape_set_grad_enabled(tp, was);
    return sum / o->eval_batches;
}

static int sample(lm *m, const options *o) {
    ag_sample_config sc = {o->temperature, o->top_k, o->top_p};
    ag_sampler *s = ag_sampler_new(LM_VOCAB, &sc, o->seed, 3);
    printf("--- sample (temperature %g, top-k %d, top-p %g) ---\n%s", o->temperature, o->top_k,
           o->top_p, o->prompt);
    double t0 = now_seconds();
    bool ok = lm_generate(m, o->prompt, o->sample_len, s, stdout);
    printf("\n--- %d bytes at %.0f bytes/s ---\n", o->sample_len,
           o->sample_len / (now_seconds() - t0));
    ag_sampler_free(s);
    return ok ? 0 : 1;
}

static int fail(const ag_err *e, int s) { return fprintf(stderr, "tiny_lm: %s\n", e->msg), s; }

static int train(lm *m, const text_data *text, const options *o) {
    ag_optim_config oc = ag_optim_defaults(AG_ADAMW);
    oc.beta2 = o->beta2, oc.weight_decay = o->weight_decay;
    ag_params_decay_matrices_only(m->ps);  // as nanoGPT: no decay on biases, LayerNorms,
    ag_params_set_decay(m->ps, m->wte.weight, false);  // and embeddings
    ag_params_set_decay(m->ps, m->wpe.weight, false);
    ag_optim *opt = ag_optim_new(m->ps, &oc);
    ag_err err;
    if (o->resume && ag_checkpoint_load(m->ps, ag_optim_state(opt), o->resume, NULL, &err))
        return ag_optim_free(opt), fail(&err, 2);
    const int B = o->batch, T = o->model.ctx, first = (int)ag_optim_step_count(opt);
    progress p;
    if (!progress_start(&p, first, o->steps, o->out, "step,train_loss,valid_bits,lr,tokens_per_s"))
        return ag_optim_free(opt), 2;
    int32_t *ids = malloc(sizeof(int32_t) * B * T), *targets = malloc(sizeof(int32_t) * B * T);
    loss_curves curves = {0};
    ag_tape *tp = ag_tape_new();
    double valid_bits = validate(tp, m, text, o, ids, targets) / log(2), t0 = now_seconds();
    loss_curves_add(&curves, 1, first, valid_bits);  // where training starts from
    int r = 0;
    for (int step = first; step < o->steps; step++) {
        ag_pcg32 rng = ag_pcg32_make(o->seed, 1000 + (uint64_t)step);  // batches replay on resume
        text_windows(text, false, B, T, &rng, ids, targets);
        ag_tape_reset(tp);
        ag_params_zero_grad(m->ps);
        ag_tensor *logits = lm_forward(tp, m, ids, B, T, true, o->seed << 32 | (uint64_t)step);
        ag_tensor *loss = ag_cross_entropy(tp, logits, targets, (size_t)B * T, -1);
        ag_backward(tp, loss);
        double l = ag_tensor_get(loss, 0);
        double norm = ag_params_clip_grad_norm(m->ps, o->clip > 0 ? o->clip : INFINITY);
        if ((r = !isfinite(l) || !isfinite(norm))) {  // 1: the exit status
            fprintf(stderr, "\ntiny_lm: non-finite %s at step %d: stopping, nothing saved\n",
                    isfinite(l) ? "gradient norm" : "loss", step + 1);
            break;
        }
        double lr = ag_lr_warmup_cosine(step, o->warmup < o->steps ? o->warmup : o->steps,
                                        o->steps, o->lr, o->min_lr);
        ag_optim_set_lr(opt, lr);
        ag_optim_step(opt);
        double tps = (double)B * T * (step + 1 - first) / (now_seconds() - t0);  // training only
        bool eval = (step + 1) % o->eval_every == 0 || step + 1 == o->steps;
        if (eval) valid_bits = validate(tp, m, text, o, ids, targets) / log(2),
                  loss_curves_add(&curves, 1, step + 1, valid_bits);
        loss_curves_add(&curves, 0, step + 1, l / log(2));
        progress_line(&p, step, eval, "train %.3f nats | valid %.3f bits/byte | %.0f tok/s", l,
                      valid_bits, tps);
        progress_csv(&p, "%d,%.17g,%.17g,%.17g,%.1f", step + 1, l, eval ? valid_bits : NAN, lr, tps);
    }
    progress_end(&p);
    if (!r && !loss_curves_svg(&curves, o->out, "tiny_lm loss", "bits/byte", &err)) fail(&err, 0);
    if (!r && o->save && ag_checkpoint_save(m->ps, ag_optim_state(opt), o->save, options_meta(o), &err))
        r = fail(&err, 1);
    if (!r) r = sample(m, o);
    ag_tape_free(tp), ag_optim_free(opt), loss_curves_free(&curves), free(ids), free(targets);
    return r;
}

int main(int argc, char **argv) {
    options o;
    int r = options_parse(&o, argc, argv);
    if (r) return r == 1 ? 0 : 2;
    ag_set_num_threads(o.threads);
    ag_err err;
    lm m;
    text_data text = {0};
    if (!lm_init(&m, &o.model, o.seed)) return 2;
    if (o.generate)
        r = ag_checkpoint_load(m.ps, NULL, o.generate, NULL, &err) ? fail(&err, 2) : sample(&m, &o);
    else if (!text_load(&text, o.data, o.valid_fraction, (size_t)o.model.ctx + 1, &err))
        r = fail(&err, 2);
    else
        text_print_summary(&text, o.data), r = train(&m, &text, &o);
    lm_free(&m), text_free(&text);
    return r;
}
