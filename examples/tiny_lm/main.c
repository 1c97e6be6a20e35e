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

#include "../common/checkpoint.h"
#include "../common/clock.h"
#include "../common/dist.h"
#include "../common/dist_agree.h"
#include "../common/text.h"
#include "../common/train_log.h"
#include "options.h"

// Exit statuses: a run refused before it starts (a file, a checkpoint), and a run
// that stopped (a non-finite step, a save that failed).
enum { EXIT_REFUSED = 2, EXIT_STOPPED = 1 };

// 2^64 / the golden ratio: the ranks' dropout seeds, this far apart, draw other masks.
#define RANK_STRIDE UINT64_C(0x9e3779b97f4a7c15)

// Rows of this process's part of a batch, for rows_loss.
typedef struct {
    const lm *m;
    const text_batch *b;
    bool training;
    bool bf16;  // --bf16: the products on bfloat16 operands (autocast)
    uint64_t dropout_seed;
} rows_in;

// Rows [begin, end) through the model: their mean loss (nats) over their targets, the
// count of which is their weight. Training runs it on each thread's slice of the rows
// (attograd/data_parallel.h); dropout draws from the seed moved by `begin`.
static ag_tensor *rows_loss(ag_tape *tp, int begin, int end, void *user, double *weight) {
    const rows_in *r = user;
    ag_tape_set_autocast(tp, r->bf16 ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF);
    const int T = r->b->T;
    const int n = end - begin;
    const int32_t *ids = r->b->my_ids + (size_t)begin * T;
    const int32_t *targets = r->b->my_targets + (size_t)begin * T;
    *weight = (double)n * T;
    ag_tensor *logits =
        lm_forward(tp, r->m, ids, n, T, r->training, r->dropout_seed + (uint64_t)begin);
    return ag_cross_entropy(tp, logits, targets, (size_t)n * T, AG_IGNORE_INDEX);
}

// Validation bits per byte, over the same windows at every call, the processes
// scoring their parts of each batch. tp has gradients off.
static double validate(ag_tape *tp, const lm *m, const text_data *text, const options *o,
                       text_batch *b) {
    ag_pcg32 rng = ag_pcg32_make(o->seed, LM_STREAM_VALID);
    rows_in rows = {m, b, false, o->bf16, 0};
    double sums[2] = {0, 0};  // loss times targets, targets
    for (int i = 0; i < o->eval_batches; i++) {
        text_batch_draw(b, text, true, &rng);
        ag_tape_reset(tp);
        double targets;
        ag_tensor *loss = rows_loss(tp, 0, b->count, &rows, &targets);
        sums[0] += targets * ag_tensor_item(loss, 0);
        sums[1] += targets;
    }
    dist_sum(sums, 2);
    return sums[0] / sums[1] / log(2);
}

// Trains from the optimizer's step (0, or --resume's) up to --steps, then saves.
static void train(lm *m, ag_optim *opt, const text_data *text, const options *o) {
    const int B = o->batch;
    const int T = o->model.ctx;
    const int first = (int)ag_optim_step_count(opt);
    const int warmup = o->warmup < o->steps ? o->warmup : o->steps;
    const double max_norm = o->clip > 0 ? o->clip : INFINITY;  // the norm is measured anyway
    text_batch b;
    const bool room = text_batch_new(&b, B, T, dist_rank(), dist_size());
    dist_check(!room, EXIT_REFUSED, "--batch %d windows of --ctx %d bytes: out of memory for "
               "the batch", B, T);
    ag_err err;
    train_log run;
    const bool logs = train_log_start(&run, first, o->steps, dist_rank() ? NULL : o->out,
                                      "bits/byte", &err);
    dist_check(!logs, EXIT_REFUSED, "%s", err.msg);
    ag_tape *tp = ag_tape_new();  // validation's (each training thread has its own)
    ag_tape_set_grad_enabled(tp, false);
    ag_data_parallel *dp = ag_data_parallel_new(m->ps);  // --threads, each a slice of the rows
    train_log_valid(&run, first, validate(tp, m, text, o, &b));  // where training starts from
    const double start = now_seconds();
    for (int step = first; step < o->steps; step++) {
        ag_pcg32 rng = ag_pcg32_make(o->seed, LM_STREAM_BATCH + (uint64_t)step);
        text_batch_draw(&b, text, false, &rng);
        // Dropout: --seed in the high 32 bits, the step in the low ones, moved for each rank
        // (its rows are other sequences, and need other masks).
        const uint64_t rank = (uint64_t)dist_rank();
        const uint64_t dropout_seed = (o->seed << 32 | (uint64_t)step) + RANK_STRIDE * rank;
        rows_in rows = {m, &b, true, o->bf16, dropout_seed};
        ag_params_zero_grad(m->ps);
        double loss = ag_data_parallel_step(dp, b.count, rows_loss, &rows);
        dist_combine(m->ps, &loss, (double)b.count * T, NULL, 0);  // the whole batch's
        const double norm = ag_params_clip_grad_norm(m->ps, max_norm);
        const bool finite = isfinite(loss) && isfinite(norm);
        if (!finite) train_log_end(&run, NULL, &err);
        dist_check(!finite, EXIT_STOPPED, "non-finite %s at step %d: stopping, nothing saved",
                   isfinite(loss) ? "gradient norm" : "loss", step + 1);
        const double lr = ag_lr_warmup_cosine(step, warmup, o->steps, o->lr, o->min_lr);
        ag_optim_set_lr(opt, lr);
        ag_optim_step(opt);
        const double tokens_per_s = (double)B * T * (step + 1 - first) / (now_seconds() - start);
        const bool validates = (step + 1) % o->eval_every == 0 || step + 1 == o->steps;
        const double valid = validates ? validate(tp, m, text, o, &b) : NAN;
        train_log_step(&run, step, loss / log(2), validates, valid, lr, tokens_per_s);
    }
    // A plot that cannot be written fails the run, after the checkpoint is safe.
    const bool plotted = train_log_end(&run, "tiny_lm loss", &err);
    dist_report(o->steps - first, now_seconds() - start);
    if (o->save)
        checkpoint_save_everywhere(m->ps, opt, o->save, options_meta(o, text_fingerprint(text)),
                                   EXIT_STOPPED);
    dist_check(!plotted, EXIT_STOPPED, "%s", err.msg);
    ag_tape_free(tp);
    ag_data_parallel_free(dp);
    text_batch_free(&b);
}

// Rank 0 samples --sample bytes after --prompt and says how fast; every rank learns
// whether it went well.
static void sample(const lm *m, const options *o) {
    bool ok = true;
    if (dist_rank() == 0) {
        printf("--- sample (temperature %g, top-k %d, top-p %g) ---\n%s",
               o->sampling.temperature, o->sampling.top_k, o->sampling.top_p, o->prompt);
        const double start = now_seconds();
        ok = lm_generate(m, o->prompt, o->sample_len, &o->sampling, o->seed, o->bf16, stdout);
        const double seconds = now_seconds() - start;
        printf("\n--- %d bytes at %.0f bytes/s ---\n", o->sample_len, o->sample_len / seconds);
    }
    dist_check(!ok, EXIT_STOPPED, "sampling met a NaN");
}

int main(int argc, char **argv) {
    dist_start("tiny_lm", &argc, &argv);
    options o;
    options_parse(&o, argc, argv);  // exits after --help, or on a flag it refuses
    ag_threads_set(o.threads);
    ag_err err;
    lm m;
    dist_check(!lm_init(&m, &o.model, o.seed), EXIT_REFUSED, "cannot build the model");

    if (o.generate) {  // the checkpoint's model, sampled: no training
        bool loaded = checkpoint_load_checked(m.ps, NULL, o.generate, 0, NULL, &err);
        dist_check(!loaded, EXIT_REFUSED, "%s", err.msg);
        sample(&m, &o);
        lm_free(&m);
        dist_finish();
        return 0;
    }

    // The text (its last --valid for validation), the same on every process.
    text_data text;
    bool read = text_load(&text, o.data, o.valid_fraction, (size_t)o.model.ctx + 1, &err);
    dist_check(!read, EXIT_REFUSED, "%s", err.msg);
    dist_agree_data(text.bytes, text.len, "--data");
    text_print_summary(&text, o.data);

    // AdamW, fresh or as --resume saved it: on the text it was trained on, unless
    // --data names another.
    ag_optim_config oc = ag_optim_defaults(AG_ADAMW);
    oc.beta2 = o.beta2;
    oc.weight_decay = o.weight_decay;
    ag_optim *opt = ag_optim_new(m.ps, &oc);
    if (o.resume) {
        ag_safetensors *file;
        bool loaded = checkpoint_load_checked(m.ps, opt, o.resume, o.steps, &file, &err);
        dist_check(!loaded, EXIT_REFUSED, "%s", err.msg);
        bool same = text_check_fingerprint(&text, o.data, file, o.resume, o.data_given, &err);
        ag_safetensors_free(file);
        dist_check(!same, EXIT_REFUSED, "%s", err.msg);
    }
    dist_agree_state(m.ps, opt, o.resume);

    train(&m, opt, &text, &o);
    sample(&m, &o);
    ag_optim_free(opt);
    text_free(&text);
    lm_free(&m);
    dist_finish();
    return 0;
}
