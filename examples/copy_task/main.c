// copy_task: trains a MultiheadAttention model on a synthetic sequence task
// (copy by default) with attograd, and shows what the attention learned.
//
//     ./build/examples/copy_task [options]                  (--help lists them)
//     mpirun -np N ./build/examples/copy_task [options]     (each process: its part of --batch)
//
// The last line on stdout is always the held-out result, e.g.
//     test: token_acc=0.9995 seq_acc=0.9960 steps=300 seconds=4.2
// (seconds = training wall time, including the validation passes that decide
// when to stop).
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../common/clock.h"
#include "../common/dist.h"
#include "../common/dist_agree.h"
#include "../common/escape.h"
#include "../common/progress.h"
#include "checkpoint.h"
#include "heads.h"
#include "heatmap.h"
#include "train.h"

// The model the flags describe, for sequences of the splits' length (and of
// --test-length's: with --pos none, training never reaches those rows of the position
// table, which keep their initial values); a pruned checkpoint's, with the heads it
// has left.
static model_config config_of(const options *o, const splits *d, const run_state *rs) {
    const int train_len = d->train->seq_len;
    const int longer_len = d->longer ? d->longer->seq_len : 0;
    model_config mc = {.vocab = d->train->vocab, .d_model = o->d_model, .heads = o->heads,
                       .layers = o->layers, .dropout = o->dropout, .cross = o->cross,
                       .no_attention = o->no_attention, .pos = (ag_pos_kind)o->pos};
    mc.max_len = longer_len > train_len ? longer_len : train_len;
    mc.max_distance = o->pos == AG_POS_RELATIVE ? train_len : 0;  // 0: the library's default
    for (int l = 0; rs->pruned && l < o->layers; l++) mc.layer_heads[l] = rs->heads[l];
    return mc;
}

// Adam with its defaults (PyTorch's) but the learning rate.
static ag_optim *adam_new(const model *m, double lr) {
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    oc.lr = lr;
    return ag_optim_new(m->ps, &oc);
}

// What is trained on what, and where a resumed run stands.
// saved_lr: the learning rate the checkpoint's Adam had (o->lr when not resumed).
static void print_run(const options *o, const model *m, const splits *d, const run_state *rs,
                      double saved_lr) {
    printf("attograd %s: task %s, L=%d%s, %s%d layer%s, d_model %d, %d heads, %zu parameters, "
           "batch %d, Adam lr %g, %d thread%s%s\n",
           ag_version(), ag_task_name((ag_task)o->task), o->length,
           d->generated ? " (generated)" : "", o->cross ? "encoder-decoder, " : "", o->layers,
           o->layers > 1 ? "s" : "", o->d_model, o->heads, ag_params_numel(m->ps), o->batch,
           o->lr, o->threads, o->threads > 1 ? "s" : "",
           o->no_attention ? ", attention ablated" : "");
    if (o->resume && rs->pruned)
        printf("resumed %s at step %d: a model pruned by %d head%s after training and "
               "fine-tuned %d step%s, whose run is over\n",
               o->resume, rs->step, rs->pruned, rs->pruned == 1 ? "" : "s", rs->finetuned,
               rs->finetuned == 1 ? "" : "s");
    else if (o->resume && o->lr != saved_lr)
        printf("resumed %s at step %d, Adam lr %g from here (the checkpoint's was %g)\n",
               o->resume, rs->step, o->lr, saved_lr);
    else if (o->resume)
        printf("resumed %s at step %d\n", o->resume, rs->step);
}

// Step `step`'s CSV row (step, loss, accuracy, validation accuracy when measured: valid
// >= 0) and its progress line.
static void report_step(progress *p, int step, const step_result *r, double valid) {
    char measured[32] = "";
    if (valid >= 0) snprintf(measured, sizeof measured, "%.6f", valid);
    progress_csv(p, "%d,%.6f,%.6f,%s", step + 1, r->loss, r->accuracy, measured);
    if (valid >= 0)
        progress_line(p, step, true, "loss %.4f, accuracy %.4f, validation %.4f", r->loss,
                      r->accuracy, valid);
    else
        progress_line(p, step, false, "loss %.4f, accuracy %.4f", r->loss, r->accuracy);
}

// Trains from rs->step up to --steps, or until the validation accuracy reaches
// --target-acc; saves every --save-every steps (*saved_at: the step of the last
// save). rs follows where the run stands. Returns the training wall time; *csv_written
// says whether every row of the CSV was written (false: csv_err says why).
static double train(trainer *t, model *m, ag_optim *opt, const splits *d, const options *o,
                    run_state *rs, int *saved_at, bool *csv_written, ag_err *csv_err) {
    char prefix[OUT_PATH_MAX];
    options_out_path(o, "", prefix, sizeof prefix);
    progress p;
    ag_err err;
    const bool started = progress_start(&p, rs->step, o->steps, dist_rank() ? NULL : prefix,
                                        "step,loss,accuracy,valid_accuracy", &err);
    dist_check(!started, EXIT_FAILED, "%s", err.msg);
    const int first = rs->step;
    const double start = now_seconds();
    bool reached = false;
    while (rs->step < o->steps && !reached) {
        const int step = rs->step;
        ag_pcg32 rng = ag_pcg32_make(o->seed, STREAM_BATCH + (uint64_t)step);
        const uint64_t dropout_seed = o->seed * DROPOUT_PRIME_TRAIN + (uint64_t)step;
        step_result r = trainer_step(t, m, opt, d->train, &rng, dropout_seed);
        if (step_failed(&r)) progress_end(&p, NULL);  // the line ends before the error's
        step_check(&r, "step", step + 1, o->save != NULL);
        // Validate when the batch says we may be done (not again for COOLDOWN steps if
        // we were not), and every --eval-every steps.
        const bool may_be_done = o->target_acc > 0 && r.accuracy >= o->target_acc &&
                                 step - rs->last_check >= COOLDOWN;
        const bool validates = may_be_done || (step + 1) % o->eval_every == 0;
        const double valid = validates ? evaluate(t->tp, m, d->valid).token_acc : -1;
        if (may_be_done) rs->last_check = step;
        report_step(&p, step, &r, valid);
        rs->step = step + 1;
        reached = may_be_done && valid >= o->target_acc;
        if (o->save_every && rs->step % o->save_every == 0) {
            progress_flush(&p);  // the CSV holds every step the checkpoint has taken
            run_save(o, m, opt, rs);
            *saved_at = rs->step;
        }
    }
    const double seconds = now_seconds() - start;
    *csv_written = progress_end(&p, csv_err);
    dist_report(rs->step - first, seconds);
    return seconds;
}

// Rank 0 draws every head's attention on test sequence 0 into <--out>/<task>_attention.svg,
// and names the files it wrote (the CSV when `trained` wrote it); false, with err, if the
// picture could not be written.
static bool write_attention(ag_tape *tp, const model *m, const splits *d, const options *o,
                            bool trained, double start, ag_err *err) {
    char csv[OUT_PATH_MAX], svg[OUT_PATH_MAX];
    options_out_path(o, ".csv", csv, sizeof csv);
    options_out_path(o, "_attention.svg", svg, sizeof svg);
    if (dist_rank() != 0) return true;
    if (o->no_attention) {  // no attention, no weights to draw
        printf("wrote %s (%.2f s in all)\n", trained ? csv : "nothing", now_seconds() - start);
        return true;
    }
    batch one;
    batch_init(&one, d->test, 1, m->cfg.cross);
    batch_fill(&one, d->test, 0, NULL, 1, m->cfg.cross);
    ag_tensor *weights[MAX_LAYERS] = {0};
    bool was = ag_tape_set_grad_enabled(tp, false);
    ag_tape_reset(tp);
    model_input in = {.B = 1, .T = one.T, .ids = one.ids, .S = one.S, .source = one.source};
    model_forward(tp, m, &in, weights);
    ag_tape_set_grad_enabled(tp, was);
    char title[256];
    snprintf(title, sizeof title, "attograd %s: attention weights of every head on test sequence "
             "0%s", ag_task_name((ag_task)o->task),
             o->cross ? " (decoder queries, encoder keys)" : "");
    const int32_t *keys = m->cfg.cross ? one.source : one.ids;
    const bool drawn = heatmap_write(svg, title, weights, m->cfg.layers, one.ids, keys, d->test,
                                     err);
    if (drawn)
        printf("wrote %s%s%s (%.2f s in all)\n", trained ? csv : "", trained ? " and " : "", svg,
               now_seconds() - start);
    else if (trained)
        printf("wrote %s (%.2f s in all)\n", csv, now_seconds() - start);
    batch_free(&one);
    return drawn;
}

int main(int argc, char **argv) {
    dist_start("copy_task", &argc, &argv);
    options o;
    options_parse(&o, argc, argv);  // exits after --help, or on a flag it refuses
    ag_threads_set(o.threads);
    const double start = now_seconds();
    ag_err err;

    // The data: the committed splits, or splits generated from --seed at another --length.
    splits data;
    dist_check(!splits_load(&data, &o, &err), EXIT_FAILED, "%s", err.msg);
    splits_agree(&data);

    // The model and Adam: fresh from --seed, or as --resume saved them (a pruned model
    // is built with the heads it has left).
    run_state rs = {.last_check = -COOLDOWN};
    const int pos_rows = o.pos == AG_POS_NONE ? config_of(&o, &data, &rs).max_len : 0;
    const bool read = !o.resume || run_read(&o, &rs, pos_rows, &err);
    dist_check(!read, EXIT_FAILED, "%s", err.msg);
    model m;
    const model_config mc = config_of(&o, &data, &rs);
    dist_check(!model_init(&m, &mc, o.f64 ? AG_F64 : AG_F32, o.seed), EXIT_FAILED,
               "cannot build the model");
    ag_optim *opt = adam_new(&m, o.lr);
    const bool loaded = !o.resume || run_load(o.resume, &m, opt, &rs, &err);
    dist_check(!loaded, EXIT_FAILED, "%s", err.msg);
    // The learning rate is the checkpoint's (Adam's state holds it) unless --lr asks for
    // another from the resumed step on. --lr was ignored unsaid, and the banner showed the
    // flag's value (or the default) rather than the rate the run trained with.
    const double saved_lr = o.resume ? ag_optim_lr(opt) : o.lr;
    if (o.resume && o.lr_given) ag_optim_set_lr(opt, o.lr);
    o.lr = ag_optim_lr(opt);
    dist_agree_state(m.ps, opt, o.resume);
    print_run(&o, &m, &data, &rs, saved_lr);

    // Training, unless the checkpoint's run is over (pruned), and the model saved; with
    // --prune, the model saved is the pruned one, after fine-tuning.
    trainer t =
        trainer_new(&m, data.train, o.batch, o.bf16 ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF);
    int saved_at = -1;
    const bool trains = rs.pruned == 0;
    bool csv_written = true;
    ag_err csv_err;
    const double seconds =
        trains ? train(&t, &m, opt, &data, &o, &rs, &saved_at, &csv_written, &csv_err) : 0;
    const bool prune = o.prune && trains && !o.no_attention;
    if (o.profile && trains) profile_step(&t, &m, stdout);  // on the last training batch
    if (o.save && !prune && saved_at != rs.step) run_save(&o, &m, opt, &rs);
    if (o.save && !prune) printf("saved %s at step %d\n", o.save, rs.step);
    if ((o.analyze_heads || prune) && !o.no_attention)
        heads_after_training(&t, &m, &opt, &data, &o, prune, &rs);

    // The held-out results.
    const eval_result test = evaluate(t.tp, &m, data.test);
    ag_err svg_err;
    const bool drawn = write_attention(t.tp, &m, &data, &o, trains && csv_written, start, &svg_err);
    if (data.longer) {
        const eval_result r = evaluate(t.tp, &m, data.longer);
        printf("test at length %d: token_acc=%.4f seq_acc=%.4f\n", o.test_length, r.token_acc,
               r.seq_acc);
    }
    printf("test: token_acc=%.4f seq_acc=%.4f steps=%d seconds=%.2f\n", test.token_acc,
           test.seq_acc, rs.step, seconds);
    // A file of the run that could not be written (a full disk) fails it, after the
    // checkpoint and the results: the CSV's rows were lost without a word, and a picture
    // that could not be written was said, and both exited 0.
    dist_check(!csv_written, EXIT_FAILED, "%s", csv_err.msg);
    dist_check(!drawn, EXIT_FAILED, "%s", svg_err.msg);
    trainer_free(&t);
    ag_optim_free(opt);
    model_free(&m);
    splits_free(&data);
    dist_finish();
    return 0;
}
