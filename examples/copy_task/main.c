// copy_task: trains a MultiheadAttention model on a synthetic sequence task
// (copy by default) with attograd, and shows what the attention learned.
//
//     ./build/examples/copy_task [options]      (--help lists them)
//
// The last line on stdout is always the held-out result, e.g.
//     test: token_acc=0.9995 seq_acc=0.9960 steps=300 seconds=4.2
// (seconds = training wall time, including the validation passes that decide
// when to stop).
#define _POSIX_C_SOURCE 200809L  // mkdir, access
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "heads.h"
#include "heatmap.h"
#include "model.h"
#include "progress.h"
#include "train.h"

typedef struct {
    ag_task task;
    int length, d_model, heads, layers, batch, steps, threads, eval_every;
    int prune, finetune_steps, test_length, save_every;
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
            "                    (with --prune: the pruned model, after fine-tuning)\n"
            "  --save-every N    with --save, also save every N training steps\n"
            "  --resume FILE     continue a run saved with --save, up to --steps in all;\n"
            "                    it reaches the same numbers as a run never stopped (a pruned\n"
            "                    model is rebuilt with its heads and tested: its run is over)\n"
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

// The problem parse_options found; main prints it once every rank has seen it.
static char complaint[512];

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void complain(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(complaint, sizeof complaint, fmt, ap);
    va_end(ap);
}

static bool parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    if (int_in_range(s, lo, hi, out)) return true;
    complain("%s needs an integer in [%d, %d], got '%s'", flag, lo, hi, s);
    return false;
}

static bool parse_real(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        complain("%s needs a number in [%g, %g], got '%s'", flag, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

// Returns 0 to run, 1 to exit successfully (--help), 2 on a usage error (in complaint).
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
            if (documented(a)) complain("%s needs a value (see --help)", a);
            else complain("unknown option '%s' (see --help)", a);
            return 2;
        } else if (!strcmp(a, "--task")) {
            ok = ag_task_from_name(v, &o->task) == 0;
            if (!ok) complain("unknown task '%s' (copy, reverse, recall)", v);
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
            if (!ok) complain("unknown --pos '%s' (none, relative, t5, alibi, rope)", v);
        } else if (!strcmp(a, "--test-length")) {
            ok = parse_int(a, v, 1, 500, &o->test_length);
        } else if (!strcmp(a, "--prune")) {
            ok = parse_int(a, v, 0, 255 * MAX_LAYERS, &o->prune);
        } else if (!strcmp(a, "--finetune-steps")) {
            ok = parse_int(a, v, 0, STEPS_MAX, &o->finetune_steps);
        } else if (!strcmp(a, "--batch")) {
            ok = parse_int(a, v, 1, 65536, &o->batch);
        } else if (!strcmp(a, "--steps")) {
            ok = parse_int(a, v, 1, STEPS_MAX, &o->steps);
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
        } else if (!strcmp(a, "--save-every")) {
            ok = parse_int(a, v, 1, STEPS_MAX, &o->save_every);
        } else if (!strcmp(a, "--resume")) {
            o->resume = v;
        } else {
            complain("unknown option '%s' (see --help)", a);
            return 2;
        }
        if (!ok) return 2;
        if (takes_value) i++;
    }
    // Each task's own limit, checked before any data is generated.
    int max_length = o->task == AG_TASK_RECALL ? AG_SEQ_MAX_PAIRS : 500;
    if (o->length > max_length || o->test_length > max_length) {
        bool test = o->length <= max_length;
        complain("%s %d is too long for task %s (at most %d%s)",
                 test ? "--test-length" : "--length", test ? o->test_length : o->length,
                 ag_task_name(o->task), max_length,
                 o->task == AG_TASK_RECALL ? " key-value pairs" : "");
        return 2;
    }
    // Recall's single scored token per sequence makes its gradients noisier.
    if (o->lr == 0) o->lr = o->task == AG_TASK_RECALL ? 0.003 : 0.01;
    if (o->d_model % o->heads != 0) {
        complain("--d-model %d must be a multiple of --heads %d", o->d_model, o->heads);
        return 2;
    }
    if (o->pos == AG_POS_ROPE && o->d_model / o->heads % 2 != 0) {
        complain("--pos rope rotates pairs of dimensions: a head's --d-model %d / --heads %d = %d "
                 "must be even", o->d_model, o->heads, o->d_model / o->heads);
        return 2;
    }
    // Pruning keeps a head in every layer (heads_prune).
    if (o->prune > o->layers * (o->heads - 1)) {
        complain("--prune %d would leave a layer with no head: %d layer%s of %d heads can lose "
                 "at most %d", o->prune, o->layers, o->layers > 1 ? "s" : "", o->heads,
                 o->layers * (o->heads - 1));
        return 2;
    }
    if (o->save_every && !o->save) {
        complain("--save-every needs --save");
        return 2;
    }
    return 0;
}

// --save's directory must exist and take a new file, and the name must not be a
// directory or a device: found before training rather than after it.
static bool save_path_usable(const char *path, char *msg, size_t size) {
    char dir[1024];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    if (n >= sizeof dir) {
        snprintf(msg, size, "--save %.200s...: the name is too long", path);
        return false;
    }
    if (!slash) memcpy(dir, ".", 2);
    else if (n == 0) memcpy(dir, "/", 2);
    else memcpy(dir, path, n), dir[n] = '\0';
    struct stat st;
    if (stat(dir, &st) != 0) {
        snprintf(msg, size, "--save %s: the directory %s: %s", path, dir, strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(msg, size, "--save %s: %s is not a directory", path, dir);
        return false;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(msg, size, "--save %s: cannot write in %s: %s", path, dir, strerror(errno));
        return false;
    }
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(msg, size, "--save %s: exists and is not a regular file", path);
        return false;
    }
    return true;
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

// The settings that decide a run's numbers: a checkpoint resumes only under the same.
// (Positions other than the default are named, so older checkpoints still resume.)
static void describe_run(const options *o, int length, char *buf, size_t size) {
    static const char *const pos_names[] = {"none", "relative", "t5", "alibi", "rope"};
    int n = snprintf(buf, size, "task=%s length=%d d_model=%d heads=%d layers=%d batch=%d "
                     "seed=%llu dropout=%g cross=%d no_attention=%d f64=%d",
                     ag_task_name(o->task), length, o->d_model, o->heads, o->layers, o->batch,
                     (unsigned long long)o->seed, o->dropout, o->cross, o->no_attention, o->f64);
    if (o->pos != AG_POS_NONE && n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, " pos=%s", pos_names[o->pos]);
}

// FNV-1a, continued from h: what every rank must have the same of, in a few bits.
static uint32_t fnv1a(uint32_t h, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

// Besides the run's description, every setting that decides which collective
// operations a rank takes part in, and when: ranks that differ would wait for each
// other forever (or train apart).
static uint32_t settings_hash(const options *o, const char *run) {
    char more[1024];
    snprintf(more, sizeof more, "%.512s lr=%.17g steps=%d target_acc=%.17g eval_every=%d prune=%d "
             "finetune_steps=%d analyze_heads=%d test_length=%d save=%d save_every=%d resume=%d",
             run, o->lr, o->steps, o->target_acc, o->eval_every, o->prune, o->finetune_steps,
             o->analyze_heads, o->test_length, o->save != NULL, o->save_every, o->resume != NULL);
    return fnv1a(2166136261u, more, strlen(more));
}

static uint32_t splits_hash(const splits *d) {
    uint32_t h = 2166136261u;
    const ag_seqdata *s[3] = {d->train, d->valid, d->test};
    for (int i = 0; i < 3; i++)
        h = fnv1a(h, s[i]->tokens, sizeof(int32_t) * (size_t)s[i]->count * (size_t)s[i]->seq_len);
    return h;
}

static uint32_t model_hash(const model *m) {
    return fnv1a(2166136261u, ag_params_data(m->ps),
                 ag_params_buffer_len(m->ps) * ag_dtype_size(ag_params_dtype(m->ps)));
}

// "step 12: the loss is inf; stopped without saving": a step whose loss or gradient is
// not finite ends the run, and the model it leaves is never saved over a good checkpoint.
static void describe_nonfinite(const char *which, int n, const step_result *r, bool save,
                               char *buf, size_t size) {
    const char *end = save ? "; stopped without saving" : "; stopped";
    if (r->bad_grad)
        snprintf(buf, size, "%s %d: the gradient of %s is not finite%s", which, n,
                 r->bad_grad->name, end);
    else  // (glibc prints a NaN with its sign bit as "-nan")
        snprintf(buf, size, "%s %d: the loss is %s%s", which, n,
                 isnan(r->loss) ? "nan" : r->loss > 0 ? "inf" : "-inf", end);
}

// Rank 0 saves; every rank learns whether it went well. False (reported, after ending
// the progress line p if not NULL) if not.
static bool save_everywhere(const options *o, const model *m, ag_optim *opt, const char *run,
                            const run_state *rs, progress *p) {
    ag_err err;
    bool bad = dist_rank() == 0 && !run_save(o->save, m, opt, run, rs, &err);
    if (bad && p) progress_end(p);
    return !dist_failed(bad, err.msg);
}

// --analyze-heads and --prune: the head table, then pruning and fine-tuning (with a new
// Adam, in *opt) with the held-out accuracy at each stage, and the pruned model saved
// with its heads. False (reported) if the run must stop.
static bool analyze_and_prune(ag_tape *tp, ag_data_parallel *dp, model *m, ag_optim **opt,
                              const splits *data,
                              batch *scratch, const options *o, bool prune, run_state *rs,
                              const char *run) {
    size_t n = (size_t)m->cfg.layers * (size_t)m->attn[0].cfg.num_heads;
    double *gradient = malloc(sizeof(double) * n), *ablation = malloc(sizeof(double) * n);
    bool ok = !dist_failed(!heads_analyze(tp, m, data->valid, stdout, gradient, ablation),
                           "the validation loss is NaN: the heads cannot be ranked");
    if (!ok || !prune) goto out;
    size_t before_params = ag_params_numel(m->ps);
    double before = evaluate(tp, m, data->test, scratch).token_acc;
    ok = !dist_failed(!heads_prune(m, ablation, o->prune, stdout), "pruning failed");
    if (!ok) goto out;
    double after = evaluate(tp, m, data->test, scratch).token_acc;
    ag_optim_config oc = ag_optim_get_config(*opt);
    ag_optim_free(*opt);  // made for the store before pruning repacked it
    *opt = ag_optim_new(m->ps, &oc);
    step_result bad;
    int steps = heads_finetune(dp, m, *opt, data->train, o->batch, o->finetune_steps, o->seed,
                               &bad);
    if (steps < o->finetune_steps) {
        char msg[512];
        describe_nonfinite("fine-tuning step", steps + 1, &bad, o->save != NULL, msg, sizeof msg);
        dist_failed(bad.mine, msg);
        ok = false;
        goto out;
    }
    double tuned = evaluate(tp, m, data->test, scratch).token_acc;
    printf("prune: %d of %d heads, %zu -> %zu parameters; test token_acc %.4f before, "
           "%.4f after, %.4f after %d fine-tuning steps\n",
           o->prune, m->cfg.layers * o->heads, before_params, ag_params_numel(m->ps), before,
           after, tuned, o->finetune_steps);
    rs->pruned = o->prune, rs->finetuned = o->finetune_steps;
    if (o->save && (ok = save_everywhere(o, m, *opt, run, rs, NULL)))
        printf("saved %s at step %d: the pruned model, after %d fine-tuning steps\n", o->save,
               rs->step, rs->finetuned);
out:
    free(gradient);
    free(ablation);
    return ok;
}

int main(int argc, char **argv) {
    // MPI first: under mpirun, every error from here on (a flag's too) is agreed on by
    // every rank, printed once, and ends the job on every rank (dist_failed).
    dist_start(&argc, &argv);
    options o;
    int rc = parse_options(argc, argv, &o);
    if (dist_failed(rc == 2, complaint) || rc == 1) {
        dist_finish();
        return rc == 1 ? 0 : 2;
    }
    double t0 = now_seconds();
    ag_threads_set(o.threads);
    if (dist_size() > 1)
        printf("data-parallel on %d processes (MPI): each trains on its slice of the batch\n",
               dist_size());

    int status = 1;  // until the run has gone well
    char msg[1200] = "", run[512];
    ag_err err = {0};
    splits data = {0};
    ag_seqdata *longer = NULL;  // --test-length
    model m;
    memset(&m, 0, sizeof m);
    ag_optim *opt = NULL;
    ag_tape *tp = NULL;
    ag_data_parallel *dp = NULL;  // the training steps' threads
    batch b = {0}, scratch = {0};
    int *indices = NULL;
    progress p = {0};
    int length = o.length ? o.length : (o.task == AG_TASK_RECALL ? 8 : 16);
    describe_run(&o, length, run, sizeof run);
    if (dist_failed(dist_differs_from_rank0(settings_hash(&o, run)),
                    "started with other flags than rank 0 (every rank needs the same)"))
        goto done;

    // Rank 0 writes the files: where they go must work before any training.
    bool bad = false;
    if (dist_rank() == 0 && o.save) bad = !save_path_usable(o.save, msg, sizeof msg);
    if (dist_rank() == 0 && !bad && mkdir(o.out_dir, 0777) != 0 && errno != EEXIST) {
        snprintf(msg, sizeof msg, "cannot create %s: %s", o.out_dir, strerror(errno));
        bad = true;
    }
    if (dist_failed(bad, msg)) goto done;

    bool generated;
    bad = !splits_load(&data, o.data_dir ? o.data_dir : default_data_dir(), o.task, length,
                       o.seed, &generated, &err);
    if (dist_failed(bad, err.msg)) goto done;
    if (dist_failed(dist_differs_from_rank0(splits_hash(&data)),
                    "its datasets differ from rank 0's (--data)"))
        goto done;
    const ag_seqdata *train = data.train;
    if (o.test_length) {
        longer = ag_seqdata_generate(o.task, o.test_length, data.test->count, o.seed, 103);
        snprintf(msg, sizeof msg, "cannot generate test data of length %d", o.test_length);
        if (dist_failed(!longer, msg)) goto done;
    }

    // A pruned model is built with the heads its checkpoint says it has left.
    run_state rs = {.last_check = -COOLDOWN};
    if (o.resume) {
        bad = !run_read(o.resume, run, o.layers, o.heads, &rs, &err);
        bool uniform = true;
        for (int l = 1; l < o.layers; l++) uniform = uniform && rs.heads[l] == rs.heads[0];
        if (!bad && rs.pruned && o.prune && o.prune != rs.pruned) {
            bad = true;
            snprintf(err.msg, sizeof err.msg, "%s: holds a model pruned by %d heads after "
                     "training; resume it with --prune %d or without --prune", o.resume,
                     rs.pruned, rs.pruned);
        } else if (!bad && rs.pruned && o.analyze_heads && !uniform) {
            bad = true;
            snprintf(err.msg, sizeof err.msg, "%s: --analyze-heads needs as many heads in every "
                     "layer, and this pruned model has %d in layer 0", o.resume, rs.heads[0]);
        }
        if (dist_failed(bad, err.msg)) goto done;
    }
    // With --pos none and --test-length, the absolute table gets rows for the longer
    // sequences too; training never reaches them, so they keep their initial values.
    int max_len = longer && longer->seq_len > train->seq_len ? longer->seq_len : train->seq_len;
    model_config mc = {.vocab = train->vocab, .d_model = o.d_model, .heads = o.heads,
                       .layers = o.layers, .max_len = max_len, .dropout = o.dropout,
                       .cross = o.cross, .no_attention = o.no_attention, .pos = o.pos,
                       .max_distance = o.pos == AG_POS_RELATIVE ? train->seq_len : 0};
    for (int l = 0; rs.pruned && l < o.layers; l++) mc.layer_heads[l] = rs.heads[l];
    if (dist_failed(!model_init(&m, &mc, o.f64 ? AG_F64 : AG_F32, o.seed),
                    "cannot build the model"))
        goto done;
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    oc.lr = o.lr;
    opt = ag_optim_new(m.ps, &oc);
    tp = ag_tape_new();
    dp = ag_data_parallel_new(m.ps);
    if (o.resume && dist_failed(!run_load(o.resume, &m, opt, &rs, &err), err.msg)) goto done;
    if (o.resume)
        snprintf(msg, sizeof msg, "%s holds another model than rank 0's copy", o.resume);
    else
        snprintf(msg, sizeof msg, "its initial model differs from rank 0's");
    if (dist_failed(dist_differs_from_rank0(model_hash(&m)), msg)) goto done;

    printf("attograd %s: task %s, L=%d%s, %s%d layer%s, d_model %d, %d heads, %zu parameters, "
           "batch %d, Adam lr %g, %d thread%s%s\n",
           ag_version(), ag_task_name(o.task), length, generated ? " (generated)" : "",
           o.cross ? "encoder-decoder, " : "", o.layers, o.layers > 1 ? "s" : "", o.d_model,
           o.heads, ag_params_numel(m.ps), o.batch, o.lr, o.threads, o.threads > 1 ? "s" : "",
           o.no_attention ? ", attention ablated" : "");
    if (o.resume && rs.pruned)
        printf("resumed %s at step %d: a model pruned by %d heads after training and fine-tuned "
               "%d steps, whose run is over\n", o.resume, rs.step, rs.pruned, rs.finetuned);
    else if (o.resume)
        printf("resumed %s at step %d\n", o.resume, rs.step);

    char csv_path[1024], svg_path[1024];
    snprintf(csv_path, sizeof csv_path, "%s/%s.csv", o.out_dir, ag_task_name(o.task));
    snprintf(svg_path, sizeof svg_path, "%s/%s_attention.svg", o.out_dir, ag_task_name(o.task));
    batch_init(&b, train, o.batch, o.cross);
    batch_init(&scratch, train, 256, o.cross);
    indices = malloc(sizeof(int) * (size_t)o.batch);

    // Training, unless the checkpoint's run is over (pruned).
    bool trains = !rs.pruned;
    double train_seconds = 0;
    int step = rs.step, last_check = rs.last_check, saved_at = -1;
    if (trains) {
        bad = !progress_start(&p, rs.step, o.steps, dist_rank() == 0 ? csv_path : NULL);
        if (bad) snprintf(msg, sizeof msg, "cannot write %s: %s", csv_path, strerror(errno));
        if (dist_failed(bad, msg)) goto done;
        double train_start = now_seconds();
        bool stopped = false;
        int mine_first, mine;  // this process's part of every batch
        dist_slice(o.batch, &mine_first, &mine);
        while (step < o.steps && !stopped) {
            sample_indices(o.seed, step, train->count, o.batch, indices);
            batch_fill(&b, train, 0, indices + mine_first, mine, o.cross);
            step_result r = train_step(dp, &m, opt, &b, o.seed * 1000003u + (uint64_t)step);
            if (!isfinite(r.loss) || r.bad_grad) {  // the same on every rank: all stop here
                progress_end(&p);
                describe_nonfinite("step", step + 1, &r, o.save != NULL, msg, sizeof msg);
                dist_failed(r.mine, msg);
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
            if (o.save_every && step % o.save_every == 0) {
                run_state now = {.step = step, .last_check = last_check};
                progress_flush(&p);
                if (!save_everywhere(&o, &m, opt, run, &now, &p)) goto done;
                saved_at = step;
            }
        }
        train_seconds = now_seconds() - train_start;
        progress_end(&p);
        dist_report(step - rs.step, train_seconds);
    }

    if (o.profile) profile_step(tp, &m, &b, stdout);
    // With --prune, what is saved is the pruned model, after fine-tuning.
    bool prune = o.prune && !rs.pruned && !o.no_attention;
    if (o.save && !prune) {
        run_state now = rs;
        now.step = step, now.last_check = last_check;
        if (saved_at != step && !save_everywhere(&o, &m, opt, run, &now, NULL)) goto done;
        printf("saved %s at step %d\n", o.save, step);
    }
    rs.step = step, rs.last_check = last_check;
    if ((o.analyze_heads || prune) && !o.no_attention &&
        !analyze_and_prune(tp, dp, &m, &opt, &data, &scratch, &o, prune, &rs, run))
        goto done;
    eval_result test = evaluate(tp, &m, data.test, &scratch);
    if (dist_rank() != 0)  // rank 0 writes the files
        ;
    else if (o.no_attention)  // no attention, no weights to draw
        printf("wrote %s (%.2f s in all)\n", trains ? csv_path : "nothing", now_seconds() - t0);
    else if (!write_heatmap(tp, &m, data.test, svg_path, &o, &err))
        fprintf(stderr, "copy_task: %s\n", err.msg);
    else
        printf("wrote %s%s%s (%.2f s in all)\n", trains ? csv_path : "", trains ? " and " : "",
               svg_path, now_seconds() - t0);
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
    progress_end(&p);
    ag_seqdata_free(longer);
    free(indices);
    batch_free(&b);
    batch_free(&scratch);
    ag_tape_free(tp);
    ag_data_parallel_free(dp);
    ag_optim_free(opt);
    model_free(&m);
    splits_free(&data);
    dist_finish();
    return status;
}
