// copy_task: trains a MultiheadAttention model on a synthetic sequence task
// (copy by default) with attograd, and shows what the attention learned.
//
//     ./build/examples/copy_task [options]      (--help lists them)
//
// The last line on stdout is always the held-out result, e.g.
//     test: token_acc=0.9995 seq_acc=0.9960 steps=300 seconds=4.2
// (seconds = training wall time, including the validation passes that decide
// when to stop).
#define _POSIX_C_SOURCE 200809L  // mkdir
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "heads.h"
#include "heatmap.h"
#include "model.h"
#include "progress.h"
#include "train.h"

// Steps between two early-stopping validations that did not stop.
#define COOLDOWN 10

typedef struct {
    ag_task task;
    int length, d_model, heads, layers, batch, steps, threads, eval_every;
    int prune, finetune_steps, test_length;
    bool analyze_heads;
    ag_pos_kind pos;
    double lr, dropout, target_acc;
    uint64_t seed;
    bool cross, no_attention, f64, profile;
    const char *data_dir, *out_dir, *save, *resume;
} options;

static const char usage_text[] =
            "usage: copy_task [options]\n"
            "  --task copy|reverse|recall  the task (default copy)\n"
            "  --length N        symbols per half (copy, reverse: up to 500) or pairs\n"
            "                    (recall: up to 16);\n"
            "                    default: the committed datasets' (16, or 8 pairs);\n"
            "                    another value generates the data from --seed\n"
            "  --d-model N       model width (default 64)\n"
            "  --heads N         attention heads (default 4)\n"
            "  --layers N        attention layers (default 1; recall needs 2)\n"
            "  --batch N         sequences per step (default 64)\n"
            "  --steps N         at most this many steps (default 1000)\n"
            "  --lr X            Adam learning rate (default 0.01; recall 0.003)\n"
            "  --dropout P       dropout on the attention weights (default 0)\n"
            "  --seed N          seeds initialisation, batches, dropout (default 1)\n"
            "  --threads N       attograd threads (default 1)\n"
            "  --target-acc X    stop once validation token accuracy reaches X\n"
            "                    (checked when a training batch reaches it, at most\n"
            "                    every 10 steps; default 0.999; 0 trains all --steps)\n"
            "  --eval-every N    also validate every N steps (default 100)\n"
            "  --cross           encoder-decoder: the second half attends to the first\n"
            "                    through cross-attention\n"
            "  --no-attention    replace every attention output with zeros (ablation)\n"
            "  --f64             train in float64 (slower; for checking)\n"
            "  --profile         after training, time a forward and backward op by op\n"
            "  --analyze-heads   after training, print each head's entropy, distance,\n"
            "                    strongest pair and importance (gradient, ablation)\n"
            "  --prune K         after training, prune the K heads of least ablation\n"
            "                    importance, then fine-tune (test accuracy before, after,\n"
            "                    and after fine-tuning)\n"
            "  --finetune-steps N  steps of fine-tuning after --prune (default 100)\n"
            "  --pos none|relative|t5|alibi|rope  positions: none = a learned absolute\n"
            "                    table added to the embeddings (default); the others live\n"
            "                    inside every attention (no absolute table)\n"
            "  --test-length N   also test the trained model on generated data of length N\n"
            "  --save FILE       save model, Adam state and progress (safetensors) at the end\n"
            "  --resume FILE     continue a run saved with --save, up to --steps in all;\n"
            "                    it reaches the same numbers as a run never stopped\n"
            "  --data DIR        datasets directory (default: datasets)\n"
            "  --out DIR         where the CSV and the SVG go (default: out)\n";

static void usage(FILE *f) { fputs(usage_text, f); }

// True for a flag --help lists ("\n  --flag "): an option given last without
// its value is then missing a value, and anything else is unknown.
static bool documented(const char *flag) {
    char line[64];
    snprintf(line, sizeof line, "\n  %s ", flag);
    return strlen(flag) < 40 && strstr(usage_text, line) != NULL;
}

// Decimal digits with an optional '-', all of s, in [lo, hi]: no spaces, no
// '+', no trailing text, nothing strtol would quietly clamp.
static bool int_in_range(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!(*s == '-' || (*s >= '0' && *s <= '9')) || errno || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static bool parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    if (int_in_range(s, lo, hi, out)) return true;
    fprintf(stderr, "copy_task: %s needs an integer in [%d, %d], got '%s'\n", flag, lo, hi, s);
    return false;
}

static bool parse_real(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "copy_task: %s needs a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

// Returns 0 to run, 1 to exit successfully (--help), 2 on a usage error.
static int parse_options(int argc, char **argv, options *o) {
    *o = (options){.task = AG_TASK_COPY, .length = 0, .d_model = 64, .heads = 4, .layers = 1,
                   .batch = 64, .steps = 1000, .threads = 1, .eval_every = 100, .lr = 0,
                   .dropout = 0, .target_acc = 0.999, .seed = 1, .data_dir = NULL, .out_dir = "out",
                   .finetune_steps = 100};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes_value = true;
        int seed;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--cross")) {
            o->cross = true, takes_value = false;
        } else if (!strcmp(a, "--no-attention")) {
            o->no_attention = true, takes_value = false;
        } else if (!strcmp(a, "--f64")) {
            o->f64 = true, takes_value = false;
        } else if (!strcmp(a, "--profile")) {
            o->profile = true, takes_value = false;
        } else if (!strcmp(a, "--analyze-heads")) {
            o->analyze_heads = true, takes_value = false;
        } else if (!v || !*v || !documented(a)) {  // --save "" must not get as far as a file
            if (documented(a)) fprintf(stderr, "copy_task: %s needs a value (see --help)\n", a);
            else fprintf(stderr, "copy_task: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "--task")) {
            ok = ag_task_from_name(v, &o->task) == 0;
            if (!ok) fprintf(stderr, "copy_task: unknown task '%s' (copy, reverse, recall)\n", v);
        } else if (!strcmp(a, "--length")) {
            ok = parse_int(a, v, 1, 500, &o->length);
        } else if (!strcmp(a, "--d-model")) {
            ok = parse_int(a, v, 1, 4096, &o->d_model);
        } else if (!strcmp(a, "--heads")) {
            ok = parse_int(a, v, 1, 256, &o->heads);
        } else if (!strcmp(a, "--layers")) {
            ok = parse_int(a, v, 1, MAX_LAYERS, &o->layers);
        } else if (!strcmp(a, "--pos")) {
            static const char *const names[] = {"none", "relative", "t5", "alibi", "rope"};
            ok = false;
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, names[k])) o->pos = (ag_pos_kind)k, ok = true;
            if (!ok)
                fprintf(stderr, "copy_task: unknown --pos '%s' (none, relative, t5, alibi, rope)\n",
                        v);
        } else if (!strcmp(a, "--test-length")) {
            ok = parse_int(a, v, 1, 500, &o->test_length);
        } else if (!strcmp(a, "--prune")) {
            ok = parse_int(a, v, 0, 255 * MAX_LAYERS, &o->prune);
        } else if (!strcmp(a, "--finetune-steps")) {
            ok = parse_int(a, v, 0, 100000000, &o->finetune_steps);
        } else if (!strcmp(a, "--batch")) {
            ok = parse_int(a, v, 1, 65536, &o->batch);
        } else if (!strcmp(a, "--steps")) {
            ok = parse_int(a, v, 1, 100000000, &o->steps);
        } else if (!strcmp(a, "--threads")) {
            ok = parse_int(a, v, 1, 64, &o->threads);
        } else if (!strcmp(a, "--eval-every")) {
            ok = parse_int(a, v, 1, 100000000, &o->eval_every);
        } else if (!strcmp(a, "--seed")) {
            ok = parse_int(a, v, 0, 2147483647, &seed);
            o->seed = (uint64_t)seed;
        } else if (!strcmp(a, "--lr")) {
            ok = parse_real(a, v, 1e-9, 10, &o->lr);
        } else if (!strcmp(a, "--dropout")) {
            ok = parse_real(a, v, 0, 0.99, &o->dropout);
        } else if (!strcmp(a, "--target-acc")) {
            ok = parse_real(a, v, 0, 1, &o->target_acc);
        } else if (!strcmp(a, "--data")) {
            o->data_dir = v;
        } else if (!strcmp(a, "--out")) {
            o->out_dir = v;
        } else if (!strcmp(a, "--save")) {
            o->save = v;
        } else if (!strcmp(a, "--resume")) {
            o->resume = v;
        } else {
            fprintf(stderr, "copy_task: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) return 2;
        if (takes_value) i++;
    }
    // Each task's own limit, checked before any data is generated.
    int max_length = o->task == AG_TASK_RECALL ? AG_SEQ_MAX_PAIRS : 500;
    if (o->length > max_length) {
        fprintf(stderr, "copy_task: --length %d is too long for task %s (at most %d%s)\n",
                o->length, ag_task_name(o->task), max_length,
                o->task == AG_TASK_RECALL ? " key-value pairs" : "");
        return 2;
    }
    // Recall's single scored token per sequence makes its gradients noisier.
    if (o->lr == 0) o->lr = o->task == AG_TASK_RECALL ? 0.003 : 0.01;
    if (o->d_model % o->heads != 0) {
        fprintf(stderr, "copy_task: --d-model %d must be a multiple of --heads %d\n", o->d_model,
                o->heads);
        return 2;
    }
    return 0;
}

// The committed datasets: ./datasets when run from the source tree, else the
// source tree's, found through the path compiled in. (A build tree has a
// datasets/ directory too, for the generator, so look for a data file.)
static const char *default_data_dir(void) {
    struct stat st;
    return stat("datasets/copy/train.txt", &st) == 0 && S_ISREG(st.st_mode)
               ? "datasets"
               : AG_SOURCE_DIR "/datasets";
}

// Draws step `step`'s batch: B training sequences, from pcg32 stream `step`,
// so any step's batch is known without replaying the ones before it.
static void sample_indices(uint64_t seed, int step, int n, int B, int *out) {
    ag_pcg32 rng = ag_pcg32_make(seed, 0x6261746368000000ULL + (uint64_t)step);  // "batch"
    for (int i = 0; i < B; i++) out[i] = (int)ag_pcg32_bounded(&rng, (uint32_t)n);
}

static bool write_heatmap(ag_tape *tp, const model *m, const ag_seqdata *test, const char *path,
                          const options *o, ag_err *err) {
    batch one;
    batch_init(&one, test, 1, m->cfg.cross);
    batch_fill(&one, test, 0, NULL, 1, m->cfg.cross);
    ag_tensor *weights[MAX_LAYERS] = {0};
    bool was = ag_tape_set_grad_enabled(tp, false);
    ag_tape_reset(tp);
    model_input in = {.B = 1, .T = one.T, .ids = one.ids, .S = one.S, .source = one.source};
    model_forward(tp, m, &in, weights);
    ag_tape_set_grad_enabled(tp, was);
    char title[256];
    snprintf(title, sizeof title, "attograd %s: attention weights of every head on test sequence 0%s",
             ag_task_name(o->task), o->cross ? " (decoder queries, encoder keys)" : "");
    bool ok = heatmap_write(path, title, weights, m->cfg.layers, one.ids,
                            m->cfg.cross ? one.source : one.ids, test, err);
    batch_free(&one);
    return ok;
}

// What a checkpoint must hold besides the model and Adam: where training
// stands, and the run it belongs to (a resume with other settings would not
// reach the same numbers, so it is refused).
typedef struct {
    int step, last_check;
} run_state;

static void describe_run(const options *o, int length, char *buf, size_t size) {
    snprintf(buf, size, "task=%s length=%d d_model=%d heads=%d layers=%d batch=%d seed=%llu "
             "dropout=%g cross=%d no_attention=%d f64=%d",
             ag_task_name(o->task), length, o->d_model, o->heads, o->layers, o->batch,
             (unsigned long long)o->seed, o->dropout, o->cross, o->no_attention, o->f64);
}

static bool save_run(const char *path, const model *m, ag_optim *opt, const options *o,
                     int length, run_state rs, ag_err *err) {
    char run[512], step[32], last[32];
    describe_run(o, length, run, sizeof run);
    snprintf(step, sizeof step, "%d", rs.step);
    snprintf(last, sizeof last, "%d", rs.last_check);
    const char *meta[] = {"copy_task.run", run, "copy_task.step", step,
                          "copy_task.last_check", last, NULL};
    return ag_checkpoint_save(m->ps, ag_optim_state(opt), path, meta, err) == 0;
}

static bool resume_run(const char *path, model *m, ag_optim *opt, const options *o, int length,
                       run_state *rs, ag_err *err) {
    char run[512];
    describe_run(o, length, run, sizeof run);
    ag_safetensors *file = NULL;
    // Check the run's description before touching the model.
    ag_safetensors *peek = ag_safetensors_load(path, err);
    if (!peek) return false;
    const char *saved = ag_safetensors_meta(peek, "copy_task.run");
    const char *step = ag_safetensors_meta(peek, "copy_task.step");
    const char *last = ag_safetensors_meta(peek, "copy_task.last_check");
    bool ok = saved && step && last && strcmp(saved, run) == 0;
    if (!ok)
        snprintf(err->msg, sizeof err->msg, "%s: %s", path,
                 saved ? "saved by a run with other settings; resume with the same --task, "
                         "--length, model, --batch, --seed, --dropout and variant flags"
                       : "not a copy_task checkpoint (no copy_task.run metadata)");
    else if (!int_in_range(step, 0, INT_MAX, &rs->step) ||
             !int_in_range(last, -COOLDOWN, rs->step, &rs->last_check)) {
        ok = false;
        snprintf(err->msg, sizeof err->msg, "%s: copy_task.step '%.40s' and copy_task.last_check "
                 "'%.40s' must be integers, 0 <= step <= %d and %d <= last_check <= step",
                 path, step, last, INT_MAX, -COOLDOWN);
    }
    ag_safetensors_free(peek);
    if (!ok) return false;
    if (ag_checkpoint_load(m->ps, ag_optim_state(opt), path, &file, err) != 0) return false;
    ag_safetensors_free(file);
    const ag_tensor *bad = ag_params_first_nonfinite(m->ps, false);
    if (bad)
        snprintf(err->msg, sizeof err->msg, "%s: parameter %s holds a NaN or an infinity", path,
                 bad->name);
    return bad == NULL;
}

// --analyze-heads and --prune: the head table, then pruning and fine-tuning with the
// held-out accuracy at each stage.
static bool analyze_and_prune(ag_tape *tp, model *m, const splits *data, batch *scratch,
                              const options *o) {
    size_t n = (size_t)m->cfg.layers * m->cfg.heads;
    double *gradient = malloc(sizeof(double) * n), *ablation = malloc(sizeof(double) * n);
    bool ok = heads_analyze(tp, m, data->valid, stdout, gradient, ablation);
    if (ok && o->prune) {
        size_t before_params = ag_params_numel(m->ps);
        double before = evaluate(tp, m, data->test, scratch).token_acc;
        ok = heads_prune(m, ablation, o->prune, stdout);
        if (ok) {
            double after = evaluate(tp, m, data->test, scratch).token_acc;
            heads_finetune(tp, m, data->train, o->batch, o->finetune_steps, o->lr, o->seed);
            double tuned = evaluate(tp, m, data->test, scratch).token_acc;
            printf("prune: %d of %d heads, %zu -> %zu parameters; test token_acc %.4f before, "
                   "%.4f after, %.4f after %d fine-tuning steps\n",
                   o->prune, m->cfg.layers * m->cfg.heads, before_params, ag_params_numel(m->ps),
                   before, after, tuned, o->finetune_steps);
        }
    }
    free(gradient);
    free(ablation);
    return ok;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    dist_start(&argc, &argv);
    double t0 = now_seconds();
    ag_threads_set(o.threads);

    splits data;
    ag_err err;
    bool generated;
    int length = o.length ? o.length : (o.task == AG_TASK_RECALL ? 8 : 16);
    if (!splits_load(&data, o.data_dir ? o.data_dir : default_data_dir(), o.task, length, o.seed,
                     &generated, &err)) {
        fprintf(stderr, "copy_task: %s\n", err.msg);
        return 1;
    }
    if (mkdir(o.out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "copy_task: cannot create %s: %s\n", o.out_dir, strerror(errno));
        return 1;
    }

    const ag_seqdata *train = data.train;
    ag_seqdata *longer = NULL;  // --test-length
    if (o.test_length)
        longer = ag_seqdata_generate(o.task, o.test_length, data.test->count, o.seed, 103);
    if (o.test_length && !longer) {
        fprintf(stderr, "copy_task: cannot generate test data of length %d\n", o.test_length);
        return 1;
    }
    // With --pos none and --test-length, the absolute table gets rows for the longer
    // sequences too; training never reaches them, so they keep their initial values.
    int max_len = longer && longer->seq_len > train->seq_len ? longer->seq_len : train->seq_len;
    model_config mc = {.vocab = train->vocab, .d_model = o.d_model, .heads = o.heads,
                       .layers = o.layers, .max_len = max_len, .dropout = o.dropout,
                       .cross = o.cross, .no_attention = o.no_attention, .pos = o.pos,
                       .max_distance = o.pos == AG_POS_RELATIVE ? train->seq_len : 0};
    model m;
    if (!model_init(&m, &mc, o.f64 ? AG_F64 : AG_F32, o.seed)) return 1;
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    oc.lr = o.lr;
    ag_optim *opt = ag_optim_new(m.ps, &oc);
    ag_tape *tp = ag_tape_new();

    printf("attograd %s: task %s, L=%d%s, %s%d layer%s, d_model %d, %d heads, %zu parameters, "
           "batch %d, Adam lr %g, %d thread%s%s\n",
           ag_version(), ag_task_name(o.task), length, generated ? " (generated)" : "",
           o.cross ? "encoder-decoder, " : "", o.layers, o.layers > 1 ? "s" : "", o.d_model,
           o.heads, ag_params_numel(m.ps), o.batch, o.lr, o.threads, o.threads > 1 ? "s" : "",
           o.no_attention ? ", attention ablated" : "");

    char csv_path[1024], svg_path[1024];
    snprintf(csv_path, sizeof csv_path, "%s/%s.csv", o.out_dir, ag_task_name(o.task));
    snprintf(svg_path, sizeof svg_path, "%s/%s_attention.svg", o.out_dir, ag_task_name(o.task));
    batch b, scratch;
    batch_init(&b, train, o.batch, o.cross);
    batch_init(&scratch, train, 256, o.cross);
    int *indices = malloc(sizeof(int) * (size_t)o.batch);

    int status = 1;  // until training and saving have gone well
    run_state rs = {0, -COOLDOWN};
    if (o.resume) {
        if (!resume_run(o.resume, &m, opt, &o, length, &rs, &err)) {
            fprintf(stderr, "copy_task: %s\n", err.msg);
            goto done;
        }
        printf("resumed %s at step %d\n", o.resume, rs.step);
    }

    progress p;
    if (!progress_start(&p, rs.step, o.steps, dist_rank() == 0 ? csv_path : NULL)) {
        fprintf(stderr, "copy_task: cannot write %s: %s\n", csv_path, strerror(errno));
        goto done;
    }
    double train_start = now_seconds();
    int step = rs.step, last_check = rs.last_check;
    bool stopped = false;
    int mine_first, mine;  // this process's part of every batch
    dist_slice(o.batch, &mine_first, &mine);
    while (step < o.steps && !stopped) {
        sample_indices(o.seed, step, train->count, o.batch, indices);
        batch_fill(&b, train, 0, indices + mine_first, mine, o.cross);
        step_result r = train_step(tp, &m, opt, &b, o.seed * 1000003u + (uint64_t)step);
        if (!isfinite(r.loss) || r.bad_grad) {
            progress_end(&p);
            char what[200];
            if (r.bad_grad)
                snprintf(what, sizeof what, "the gradient of %s is not finite", r.bad_grad->name);
            else
                snprintf(what, sizeof what, "the loss is %g", r.loss);
            if (dist_rank() == 0)
                fprintf(stderr, "copy_task: step %d: %s; stopped%s\n", step + 1, what,
                        o.save ? " without saving" : "");
            goto done;
        }
        // Validate when the batch says we may be done (not again for COOLDOWN
        // steps if we were not), and every eval_every steps.
        double valid = -1;
        bool maybe_done = o.target_acc > 0 && r.accuracy >= o.target_acc &&
                          step - last_check >= COOLDOWN;
        if (maybe_done || (step + 1) % o.eval_every == 0) {
            valid = evaluate(tp, &m, data.valid, &scratch).token_acc;
            if (maybe_done) last_check = step;
        }
        progress_step(&p, step, r.loss, r.accuracy, valid);
        step++;
        stopped = maybe_done && valid >= o.target_acc;
    }
    double train_seconds = now_seconds() - train_start;
    progress_end(&p);
    dist_report(step - rs.step, train_seconds);

    if (o.profile) profile_step(tp, &m, &b, stdout);
    if (o.save && dist_rank() == 0) {
        run_state now = {step, last_check};
        if (!save_run(o.save, &m, opt, &o, length, now, &err)) {
            fprintf(stderr, "copy_task: %s\n", err.msg);
            goto done;
        }
        printf("saved %s at step %d\n", o.save, step);
    }
    if ((o.analyze_heads || o.prune) && !o.no_attention &&
        !analyze_and_prune(tp, &m, &data, &scratch, &o))
        goto done;
    eval_result test = evaluate(tp, &m, data.test, &scratch);
    if (dist_rank() != 0)  // rank 0 writes the files
        ;
    else if (o.no_attention)  // no attention, no weights to draw
        printf("wrote %s (%.2f s in all)\n", csv_path, now_seconds() - t0);
    else if (!write_heatmap(tp, &m, data.test, svg_path, &o, &err))
        fprintf(stderr, "copy_task: %s\n", err.msg);
    else
        printf("wrote %s and %s (%.2f s in all)\n", csv_path, svg_path, now_seconds() - t0);
    if (longer) {
        batch lb;
        batch_init(&lb, longer, 256, o.cross);
        eval_result r = evaluate(tp, &m, longer, &lb);
        printf("test at length %d: token_acc=%.4f seq_acc=%.4f\n", o.test_length, r.token_acc,
               r.seq_acc);
        batch_free(&lb);
    }
    printf("test: token_acc=%.4f seq_acc=%.4f steps=%d seconds=%.2f\n", test.token_acc,
           test.seq_acc, step, train_seconds);
    status = 0;

done:
    ag_seqdata_free(longer);
    free(indices);
    batch_free(&b);
    batch_free(&scratch);
    ag_tape_free(tp);
    ag_optim_free(opt);
    model_free(&m);
    splits_free(&data);
    dist_finish();
    return status;
}
