#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/dist.h"
#include "../common/dist_agree.h"

bool splits_load(splits *s, const options *o, ag_err *err) {
    const char *names[3] = {"train", "valid", "test"};
    ag_seqdata **out[3] = {&s->train, &s->valid, &s->test};
    const ag_task task = (ag_task)o->task;
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s/%s.txt", o->data, ag_task_name(task), names[i]);
        *out[i] = ag_seqdata_load_task(path, task, err);
        if (!*out[i]) {
            splits_free(s);
            return false;
        }
        if ((*out[i])->length != o->length) s->generated = true;
    }
    if (s->generated) {
        // Another length than the committed files: the same sizes, generated
        // from the run's seed, each split on its own stream.
        int counts[3] = {s->train->count, s->valid->count, s->test->count};
        splits_free(s);
        s->generated = true;
        for (int i = 0; i < 3; i++) {
            *out[i] = ag_seqdata_generate(task, o->length, counts[i], o->seed,
                                          STREAM_SPLITS + (uint64_t)i);
            if (!*out[i]) {
                snprintf(err->msg, sizeof err->msg, "cannot generate %s data with length %d",
                         ag_task_name(task), o->length);
                splits_free(s);
                return false;
            }
        }
    }
    if (o->test_length) {
        s->longer = ag_seqdata_generate(task, o->test_length, s->test->count, o->seed,
                                        STREAM_LONGER);
        if (!s->longer) {
            snprintf(err->msg, sizeof err->msg, "cannot generate test data of length %d",
                     o->test_length);
            splits_free(s);
            return false;
        }
    }
    return true;
}

void splits_free(splits *s) {
    ag_seqdata_free(s->train);
    ag_seqdata_free(s->valid);
    ag_seqdata_free(s->test);
    ag_seqdata_free(s->longer);
    memset(s, 0, sizeof *s);
}

void splits_agree(const splits *s) {
    const ag_seqdata *all[3] = {s->train, s->valid, s->test};
    for (int i = 0; i < 3; i++) {
        size_t tokens = (size_t)all[i]->count * (size_t)all[i]->seq_len;
        dist_agree_data(all[i]->tokens, sizeof(int32_t) * tokens, "--data");
    }
}

bool batch_init(batch *b, const ag_seqdata *d, int cap, bool cross) {
    memset(b, 0, sizeof *b);
    int B = cap;
    b->cap = b->B = cap;
    b->T = cross ? d->target_len : d->seq_len - 1;
    b->S = cross ? d->source_len : 0;
    b->ids = malloc(sizeof(int32_t) * (size_t)B * b->T);
    b->targets = malloc(sizeof(int32_t) * (size_t)B * b->T);
    b->source = cross ? malloc(sizeof(int32_t) * (size_t)B * b->S) : NULL;
    b->gather = malloc(sizeof(int32_t) * (size_t)B * d->seq_len);
    b->seq_stats = malloc(sizeof(long) * 3 * (size_t)B);
    if (b->ids && b->targets && (b->source || !cross) && b->gather && b->seq_stats) return true;
    batch_free(b);  // unchecked, a batch was filled through NULL
    memset(b, 0, sizeof *b);
    return false;
}

void batch_free(batch *b) {
    free(b->ids);
    free(b->targets);
    free(b->source);
    free(b->gather);
    free(b->seq_stats);
}

void batch_fill(batch *b, const ag_seqdata *d, int first, const int *indices, int n, bool cross) {
    b->B = n;
    ag_seqdata view = *d;  // the batch's sequences, as a dataset of B rows
    view.count = b->B;
    view.tokens = b->gather;
    for (int i = 0; i < b->B; i++)
        memcpy(b->gather + (size_t)i * d->seq_len,
               ag_seqdata_seq(d, indices ? indices[i] : first + i),
               sizeof(int32_t) * (size_t)d->seq_len);
    if (cross)
        ag_seqdata_batch_seq2seq(&view, 0, b->B, b->source, b->ids, b->targets);
    else
        ag_seqdata_batch(&view, 0, b->B, b->ids, b->targets);
}

void count_correct(const ag_tensor *logits, const batch *b, long *scored, long *correct,
                   long *seqs_right) {
    int V = logits->shape[2];
    for (int i = 0; i < b->B; i++) {
        bool all = true;
        for (int t = 0; t < b->T; t++) {
            int32_t target = b->targets[(size_t)i * b->T + t];
            if (target == AG_IGNORE_INDEX) continue;
            size_t row = ((size_t)i * b->T + t) * (size_t)V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (ag_tensor_item(logits, row + (size_t)v) > ag_tensor_item(logits, row + (size_t)best))
                    best = v;
            *scored += 1;
            *correct += best == target;
            all = all && best == target;
        }
        *seqs_right += all;
    }
}

static model_input input_of(const batch *b, bool training, uint64_t dropout_seed) {
    model_input in = {.B = b->B, .T = b->T, .ids = b->ids, .S = b->S, .source = b->source,
                      .training = training, .dropout_seed = dropout_seed};
    return in;
}

typedef struct {
    model *m;
    const batch *b;
    uint64_t dropout_seed;
    ag_autocast autocast;
} step_slices;

// 2^64 / the golden ratio: the dropout seeds of a step's slices, this far apart, draw
// other masks.
#define SLICE_STRIDE UINT64_C(0x9e3779b97f4a7c15)

// Sequences [begin, end) of the batch on one thread: their loss, weighted by the
// positions they score, and their accuracy counts in b->seq_stats (at `begin`, a place no
// other slice writes). Dropout draws from the step's seed moved by `begin`, so a
// one-thread step is the plain step.
static ag_tensor *slice_loss(ag_tape *tp, int begin, int end, void *user, double *weight) {
    const step_slices *c = user;
    ag_tape_set_autocast(tp, c->autocast);
    const batch *b = c->b;
    batch s = *b;
    s.B = end - begin;
    s.ids += (size_t)begin * b->T;
    s.targets += (size_t)begin * b->T;
    if (s.source) s.source += (size_t)begin * b->S;
    model_input in = input_of(&s, true, c->dropout_seed + (uint64_t)begin * SLICE_STRIDE);
    ag_tensor *logits = model_forward(tp, c->m, &in, NULL);
    ag_tensor *loss =
        ag_cross_entropy(tp, logits, s.targets, (size_t)s.B * (size_t)s.T, AG_IGNORE_INDEX);
    if (!loss) return NULL;
    long *st = b->seq_stats + 3 * (size_t)begin;
    st[0] = st[1] = st[2] = 0;
    count_correct(logits, &s, &st[0], &st[1], &st[2]);
    *weight = (double)st[0];
    return loss;
}

trainer trainer_new(model *m, const ag_seqdata *train, int batch_size,
                    ag_autocast autocast) {
    trainer t = {.dp = ag_data_parallel_new(m->ps), .tp = ag_tape_new(),
                 .indices = malloc(sizeof(int) * (size_t)batch_size), .batch_size = batch_size,
                 .cross = m->cfg.cross, .autocast = autocast};
    ag_tape_set_autocast(t.tp, autocast);
    dist_slice(batch_size, &t.first, &t.count);
    const bool room = batch_init(&t.b, train, t.count, t.cross) && t.indices;
    dist_check(!room, EXIT_FAILED, "--batch %d: out of memory for its %d sequences of %d "
               "tokens", batch_size, t.count, train->seq_len);
    return t;
}

void trainer_free(trainer *t) {
    ag_data_parallel_free(t->dp);
    ag_tape_free(t->tp);
    batch_free(&t->b);
    free(t->indices);
}

step_result trainer_step(trainer *t, model *m, ag_optim *opt, const ag_seqdata *train,
                         ag_pcg32 *rng, uint64_t dropout_seed) {
    for (int i = 0; i < t->batch_size; i++)
        t->indices[i] = (int)ag_pcg32_bounded(rng, (uint32_t)train->count);
    batch *b = &t->b;
    batch_fill(b, train, 0, t->indices + t->first, t->count, t->cross);
    ag_params_zero_grad(m->ps);
    for (int i = 0; i < b->B; i++) b->seq_stats[3 * i] = -1;  // marks the slices' starts
    step_slices c = {m, b, dropout_seed, t->autocast};
    double loss = ag_data_parallel_step(t->dp, b->B, slice_loss, &c);
    double counts[2] = {0, 0};  // scored positions, correct predictions
    for (int i = 0; i < b->B; i++) {
        if (b->seq_stats[3 * i] < 0) continue;
        counts[0] += (double)b->seq_stats[3 * i];
        counts[1] += (double)b->seq_stats[3 * i + 1];
    }
    // The loss is a mean over the scored positions: each rank's counts with its share.
    const bool blame = dist_combine(m->ps, &loss, counts[0], counts, 2);
    step_result r = {.loss = loss, .accuracy = counts[0] > 0 ? counts[1] / counts[0] : 0,
                     .blame = blame};
    // A NaN or an infinity must stop training where it appears: Adam would
    // spread it into every parameter, and a model saved afterwards is lost.
    // Combined, every process sees the same loss and gradients, so all stop
    // at the same step.
    if (!isfinite(r.loss)) return r;
    r.bad_grad = ag_params_first_nonfinite(m->ps, true);
    if (r.bad_grad) {
        r.blame = true;  // combined: the same on every rank
        return r;
    }
    ag_optim_step(opt);
    return r;
}

bool step_failed(const step_result *r) { return !isfinite(r->loss) || r->bad_grad; }

void step_check(const step_result *r, const char *which, int n, bool saving) {
    const char *end = saving ? "; stopped without saving" : "; stopped";
    if (r->bad_grad)
        dist_check(r->blame, EXIT_FAILED, "%s %d: the gradient of %s is not finite%s", which, n,
                   r->bad_grad->name, end);
    else  // (glibc prints a NaN with its sign bit as "-nan")
        dist_check(r->blame, EXIT_FAILED, "%s %d: the loss is %s%s", which, n,
                   isnan(r->loss) ? "nan" : r->loss > 0 ? "inf" : "-inf", end);
}

void profile_step(trainer *t, model *m, FILE *f) {
    const batch *b = &t->b;
    ag_tape *tp = t->tp;
    ag_tape_reset(tp);
    ag_tape_set_profiling(tp, true);
    ag_params_zero_grad(m->ps);
    model_input in = input_of(b, true, 0);
    ag_tensor *logits = model_forward(tp, m, &in, NULL);
    ag_backward(tp, ag_cross_entropy(tp, logits, b->targets, (size_t)b->B * (size_t)b->T,
                                     AG_IGNORE_INDEX));
    ag_tape_profile_print(tp, f);
    ag_tape_set_profiling(tp, false);
    ag_params_zero_grad(m->ps);
}

eval_result evaluate(ag_tape *tp, const model *m, const ag_seqdata *d) {
    bool was = ag_tape_set_grad_enabled(tp, false);
    batch scratch;
    batch_init(&scratch, d, EVAL_BATCH, m->cfg.cross);
    long scored = 0, correct = 0, seqs = 0;
    int lo, mine;
    dist_slice(d->count, &lo, &mine);  // each rank its part of the split
    for (int first = lo; first < lo + mine; first += EVAL_BATCH) {
        int n = lo + mine - first < EVAL_BATCH ? lo + mine - first : EVAL_BATCH;
        ag_tape_reset(tp);
        batch_fill(&scratch, d, first, NULL, n, m->cfg.cross);
        model_input in = input_of(&scratch, false, 0);
        count_correct(model_forward(tp, m, &in, NULL), &scratch, &scored, &correct, &seqs);
    }
    batch_free(&scratch);
    ag_tape_set_grad_enabled(tp, was);
    double counts[3] = {(double)scored, (double)correct, (double)seqs};
    dist_sum(counts, 3);
    eval_result r = {counts[0] > 0 ? counts[1] / counts[0] : 0, counts[2] / d->count};
    return r;
}
