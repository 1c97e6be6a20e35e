#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool splits_load(splits *s, const char *dir, ag_task task, int length, uint64_t seed,
                 bool *generated, ag_err *err) {
    const char *names[3] = {"train", "valid", "test"};
    ag_seqdata **out[3] = {&s->train, &s->valid, &s->test};
    memset(s, 0, sizeof *s);
    *generated = false;
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s/%s.txt", dir, ag_task_name(task), names[i]);
        *out[i] = ag_seqdata_load_task(path, task, err);
        if (!*out[i]) {
            splits_free(s);
            return false;
        }
        if ((*out[i])->length != length) *generated = true;
    }
    if (*generated) {
        // Another length than the committed files: the same sizes, generated
        // from the run's seed, each split on its own stream.
        int counts[3] = {s->train->count, s->valid->count, s->test->count};
        splits_free(s);
        for (int i = 0; i < 3; i++) {
            *out[i] = ag_seqdata_generate(task, length, counts[i], seed, 100 + (uint64_t)i);
            if (!*out[i]) {
                snprintf(err->msg, sizeof err->msg, "cannot generate %s data with length %d",
                         ag_task_name(task), length);
                splits_free(s);
                return false;
            }
        }
    }
    return true;
}

void splits_free(splits *s) {
    ag_seqdata_free(s->train);
    ag_seqdata_free(s->valid);
    ag_seqdata_free(s->test);
    memset(s, 0, sizeof *s);
}

void batch_init(batch *b, const ag_seqdata *d, int cap, bool cross) {
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
                if (ag_tensor_get(logits, row + (size_t)v) > ag_tensor_get(logits, row + (size_t)best))
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
} step_slices;

// Sequences [begin, end) of the batch on one thread: their loss, weighted by the
// positions they score, and their accuracy counts in b->seq_stats (at `begin`, a place no
// other slice writes). Dropout draws from the step's seed moved by `begin`, so a
// one-thread step is the plain step.
static ag_tensor *slice_loss(ag_tape *tp, int begin, int end, void *user, double *weight) {
    const step_slices *c = user;
    const batch *b = c->b;
    batch s = *b;
    s.B = end - begin;
    s.ids += (size_t)begin * b->T;
    s.targets += (size_t)begin * b->T;
    if (s.source) s.source += (size_t)begin * b->S;
    model_input in = input_of(&s, true, c->dropout_seed + (uint64_t)begin * 0x9E3779B97F4A7C15u);
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

step_result train_step(ag_data_parallel *dp, model *m, ag_optim *opt, const batch *b,
                       uint64_t dropout_seed) {
    ag_params_zero_grad(m->ps);
    for (int i = 0; i < b->B; i++) b->seq_stats[3 * i] = -1;  // marks the slices' starts
    step_slices c = {m, b, dropout_seed};
    double value = ag_data_parallel_step(dp, b->B, slice_loss, &c);
    long scored = 0, correct = 0;
    for (int i = 0; i < b->B; i++)
        if (b->seq_stats[3 * i] >= 0) {
            scored += b->seq_stats[3 * i];
            correct += b->seq_stats[3 * i + 1];
        }
    bool mine;
    dist_combine_step(m->ps, &value, &scored, &correct, &mine);
    step_result r = {value, scored ? (double)correct / scored : 0, NULL, mine};
    // A NaN or an infinity must stop training where it appears: Adam would
    // spread it into every parameter, and a model saved afterwards is lost.
    // Combined, every process sees the same loss and gradients, so all stop
    // at the same step.
    if (!isfinite(r.loss)) return r;
    if ((r.bad_grad = ag_params_first_nonfinite(m->ps, true))) {
        r.mine = true;  // combined: the same on every rank
        return r;
    }
    ag_optim_step(opt);
    return r;
}

void profile_step(ag_tape *tp, model *m, const batch *b, FILE *f) {
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

eval_result evaluate(ag_tape *tp, const model *m, const ag_seqdata *d, batch *scratch) {
    bool was = ag_tape_set_grad_enabled(tp, false);
    long scored = 0, correct = 0, seqs = 0, counted = 0;
    bool cross = m->cfg.cross;
    int lo, mine;
    dist_slice(d->count, &lo, &mine);  // each rank its part of the split
    for (int first = lo; first < lo + mine; first += scratch->cap) {
        int n = lo + mine - first < scratch->cap ? lo + mine - first : scratch->cap;
        ag_tape_reset(tp);
        batch_fill(scratch, d, first, NULL, n, cross);
        model_input in = input_of(scratch, false, 0);
        count_correct(model_forward(tp, m, &in, NULL), scratch, &scored, &correct, &seqs);
        counted += scratch->B;
    }
    ag_tape_set_grad_enabled(tp, was);
    long counts[4] = {scored, correct, seqs, counted};
    dist_sum_counts(counts, 4);
    scored = counts[0], correct = counts[1], seqs = counts[2], counted = counts[3];
    eval_result r = {scored ? (double)correct / scored : 0, counted ? (double)seqs / counted : 0};
    return r;
}
