// tiny_lm: a byte-level GPT trained on a text file with attograd, then sampled.
//
//     ./build/examples/tiny_lm [options]                  (--help lists them)
//     mpirun -np N ./build/examples/tiny_lm [options]     (each process: its part of --batch)
//
// Prints the unigram and bigram baselines, a progress line (train and validation
// loss in bits per byte, tokens/s, time left), writes <out>.csv and <out>.svg (the
// loss curves), and ends with a sample of the model's text.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../common/checkpoint.h"
#include "../common/dist.h"
#include "../common/text.h"
#include "../common/train_log.h"
#include "options.h"

// Rows [begin, end) of this process's part of the batch through the model: their mean
// loss (nats), weighted by their targets. Training runs it on each thread's slice (see
// attograd/data_parallel.h); dropout draws from the seed moved by `begin`.
typedef struct {
    const lm *m;
    const text_batch *b;
    bool training, bf16;
    uint64_t seed;
} rows_in;

static ag_tensor *rows_loss(ag_tape *tp, int begin, int end, void *user, double *weight) {
    const rows_in *r = user;
    ag_tape_set_autocast(tp, r->bf16 ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF);  // --bf16
    const int T = r->b->T, n = end - begin;
    *weight = (double)n * T;
    ag_tensor *logits = lm_forward(tp, r->m, r->b->my_ids + (size_t)begin * T, n, T,
                                   r->training, r->seed + (uint64_t)begin);
    return ag_cross_entropy(tp, logits, r->b->my_targets + (size_t)begin * T, (size_t)n * T, -1);
}

// Validation bits per byte over fixed windows (the same at every call), the
// processes scoring their parts of each batch.
static double validate(ag_tape *tp, const lm *m, const text_data *text, const options *o,
                       text_batch *b) {
    ag_pcg32 rng = ag_pcg32_make(o->seed, 7);
    double sums[2] = {0, 0}, n = (double)b->count * b->T, w;  // loss * targets, targets
    ag_tape_set_grad_enabled(tp, false);
    for (int i = 0; i < o->eval_batches; i++, sums[1] += n) {
        text_batch_draw(b, text, true, &rng);
        ag_tape_reset(tp);
        ag_tensor *loss = rows_loss(tp, 0, b->count, &(rows_in){m, b, false, o->bf16, 0}, &w);
        sums[0] += n * ag_tensor_get(loss, 0);
    }
    dist_sum(sums, 2);
    return sums[0] / sums[1] / log(2);
}

static int sample(const lm *m, const options *o) {
    printf("--- sample (temperature %g, top-k %d, top-p %g) ---\n%s", o->sampling.temperature,
           o->sampling.top_k, o->sampling.top_p, o->prompt);
    double t0 = now_seconds();
    bool ok = lm_generate(m, o->prompt, o->sample_len, &o->sampling, o->seed, stdout);
    printf("\n--- %d bytes at %.0f bytes/s ---\n", o->sample_len,
           o->sample_len / (now_seconds() - t0));
    return ok ? 0 : 1;
}

static int train(lm *m, const text_data *text, const options *o) {
    ag_optim_config oc = ag_optim_defaults(AG_ADAMW);
    oc.beta2 = o->beta2, oc.weight_decay = o->weight_decay;
    ag_optim *opt = ag_optim_new(m->ps, &oc);
    ag_err err;  // --resume: on the text it was trained on, unless --data says otherwise
    ag_safetensors *f = NULL;
    bool ok = !o->resume || (checkpoint_load_checked(m->ps, opt, o->resume, o->steps, &f, &err) &&
                             text_check_fingerprint(text, o->data, f, o->resume, o->data_given,
                                                    &err));
    ag_safetensors_free(f);
    if (!ok) return ag_optim_free(opt), dist_fail(2, "%s", err.msg);
    const int B = o->batch, T = o->model.ctx, first = (int)ag_optim_step_count(opt);
    train_log run;
    if (!train_log_start(&run, first, o->steps, dist_rank() ? NULL : o->out, "bits/byte", &err))
        return ag_optim_free(opt), dist_fail(2, "%s", err.msg);
    text_batch b = text_batch_new(B, T, dist_rank(), dist_size());
    ag_tape *tp = ag_tape_new();
    ag_data_parallel *dp = ag_data_parallel_new(m->ps);  // --threads: each a slice of the rows
    train_log_valid(&run, first, validate(tp, m, text, o, &b));  // where training starts from
    int r = 0;
    double t0 = now_seconds();
    for (int step = first; step < o->steps && !r; step++) {
        ag_pcg32 rng = ag_pcg32_make(o->seed, 1000 + (uint64_t)step);  // batches replay on resume
        text_batch_draw(&b, text, false, &rng);
        // Each process draws its own dropout masks (its rows are other sequences).
        uint64_t seed = (o->seed << 32 | (uint64_t)step) + 0x9e3779b97f4a7c15u * dist_rank();
        ag_params_zero_grad(m->ps);
        double l = ag_data_parallel_step(dp, b.count, rows_loss,
                                         &(rows_in){m, &b, true, o->bf16, seed});
        // then the whole batch's, on every process:
        double norm = dist_combine(m->ps, &l, (double)b.count * T, o->clip);
        if ((r = !isfinite(l) || !isfinite(norm))) {  // 1: the exit status
            train_log_end(&run, NULL);
            dist_fail(1, "non-finite %s at step %d: stopping, nothing saved",
                      isfinite(l) ? "gradient norm" : "loss", step + 1);
            break;
        }
        double lr = ag_lr_warmup_cosine(step, o->warmup < o->steps ? o->warmup : o->steps,
                                        o->steps, o->lr, o->min_lr);
        ag_optim_set_lr(opt, lr);
        ag_optim_step(opt);
        double tps = (double)B * T * (step + 1 - first) / (now_seconds() - t0);  // training only
        bool eval = (step + 1) % o->eval_every == 0 || step + 1 == o->steps;
        train_log_step(&run, step, l / log(2), eval ? validate(tp, m, text, o, &b) : NAN, lr, tps);
    }
    train_log_end(&run, "tiny_lm loss");
    dist_report(o->steps - first, now_seconds() - t0);
    if (!r && o->save && !dist_rank() &&
        ag_checkpoint_save(m->ps, ag_optim_state(opt), o->save,
                           options_meta(o, text_fingerprint(text)), &err))
        r = dist_fail(1, "%s", err.msg);
    if (!r && !dist_rank()) r = sample(m, o);
    ag_tape_free(tp), ag_data_parallel_free(dp), ag_optim_free(opt), text_batch_free(&b);
    return r;
}

int main(int argc, char **argv) {
    dist_start("tiny_lm", &argc, &argv);
    options o;
    ag_err err;
    int r = options_parse(&o, argc, argv, &err);
    if (r) return r == 1 ? (dist_finish(), 0) : dist_fail(2, "%s", err.msg);
    ag_threads_set(o.threads);
    lm m;
    text_data text = {0};
    if (!lm_init(&m, &o.model, o.seed)) return dist_fail(2, "cannot build the model");
    if (o.generate)
        r = !checkpoint_load_checked(m.ps, NULL, o.generate, 0, NULL, &err)
                ? dist_fail(2, "%s", err.msg) : dist_rank() ? 0 : sample(&m, &o);
    else if (!text_load(&text, o.data, o.valid_fraction, (size_t)o.model.ctx + 1, &err))
        r = dist_fail(2, "%s", err.msg);
    else
        text_print_summary(&text, o.data), r = train(&m, &text, &o);
    lm_free(&m), text_free(&text);
    return r ? r : (dist_finish(), 0);
}
