// Cross-entropy from logits, fused with log-softmax.
//   logits: [..., C], targets: numel/C ints -> y: []
//   lse[r] = log sum_c exp(x[r, c])              (a row r whose target is ignored is skipped)
//   y = (1 / N) sum over kept rows of lse[r] - x[r, t[r]],   N = number of kept rows
//   dx[r, c] = dy (softmax(x[r])[c] - [c == t[r]]) / N, and 0 on ignored rows,
//   because d lse / dx[r, c] = exp(x[r, c] - lse[r]) = softmax(x[r])[c].
// Stable: lse = m + log sum exp(x - m) with m the row maximum, so logits of
// +-1000 give a finite loss and gradient. The row sums and the loss sum are
// accumulated in double. If every target is ignored, N = 0 and the loss is 0
// with a zero gradient (PyTorch returns NaN there, 0/0).
//
// Rows are independent, so both passes are split over threads by rows; the
// loss sum itself runs serially in row order over the saved lse, so the result
// does not depend on the thread count.
#include <string.h>

#include "op.h"

typedef struct {
    const int32_t *targets;  // a copy in tape memory
    int32_t ignore_index;
    size_t kept;             // N: rows whose target is not ignore_index
} cross_entropy_params;

typedef struct {
    const real *x;
    const int32_t *targets;
    int32_t ignore_index;
    size_t C;
    double *lse;   // per row, in tape memory
    real *dx;      // backward only
    real g;        // backward only: dy / N
} rows_ctx;

static void lse_rows(int begin, int end, void *ctx) {
    const rows_ctx *c = ctx;
    for (int r = begin; r < end; r++) {
        if (c->targets[r] == c->ignore_index) {
            c->lse[r] = 0;
            continue;
        }
        const real *x = c->x + (size_t)r * c->C;
        real m = x[0];
        for (size_t k = 1; k < c->C; k++) m = x[k] > m ? x[k] : m;
        double s = 0;
        for (size_t k = 0; k < c->C; k++) s += r_exp(x[k] - m);
        c->lse[r] = (double)m + log(s);
    }
}

static void cross_entropy_forward(ag_node *n) {
    const cross_entropy_params *p = n->params;
    const ag_tensor *logits = n->in[0];
    size_t C = (size_t)agi_last(logits);
    int rows = (int)agi_rows(logits);
    // Scratch for the loss sum, and what backward needs: kept only when recording.
    double *lse = ag_tape_alloc(n->tape, (size_t)rows * sizeof *lse);
    rows_ctx c = {logits->data, p->targets, p->ignore_index, C, lse, NULL, 0};
    // Work: about 20 flop-equivalents per logit, most of it the exp.
    agi_parallel_for(rows, 20.0 * (double)logits->numel, lse_rows, &c);

    double total = 0;
    for (int r = 0; r < rows; r++)
        if (p->targets[r] != p->ignore_index)
            total += lse[r] - (double)c.x[(size_t)r * C + (size_t)p->targets[r]];
    ((real *)n->out->data)[0] = p->kept ? (real)(total / (double)p->kept) : 0;
    n->saved = n->recording ? lse : NULL;
}

static void grad_rows(int begin, int end, void *ctx) {
    const rows_ctx *c = ctx;
    for (int r = begin; r < end; r++) {
        int32_t t = c->targets[r];
        if (t == c->ignore_index) continue;
        const real *x = c->x + (size_t)r * c->C;
        real *dx = c->dx + (size_t)r * c->C;
        for (size_t k = 0; k < c->C; k++) {
            // x - lse in double: lse carries more digits than real can hold.
            real prob = r_exp((real)((double)x[k] - c->lse[r]));
            dx[k] += (prob - (k == (size_t)t)) * c->g;
        }
    }
}

static void cross_entropy_backward(ag_node *n) {
    const cross_entropy_params *p = n->params;
    const ag_tensor *logits = n->in[0];
    if (p->kept == 0 || !logits->grad) return;  // every target ignored: zero gradient
    real g = (real)((double)((const real *)n->out->grad)[0] / (double)p->kept);
    rows_ctx c = {logits->data, p->targets, p->ignore_index, (size_t)agi_last(logits),
                  n->saved, logits->grad, g};
    agi_parallel_for((int)agi_rows(logits), 20.0 * (double)logits->numel, grad_rows, &c);
}

const ag_op R(agi_cross_entropy_op) = {"cross_entropy", cross_entropy_forward, cross_entropy_backward,
    "dx = dy * (softmax(x) - onehot(target)) / N"};

#if AG_ONCE
extern const ag_op agi_cross_entropy_op_f32, agi_cross_entropy_op_f64;

ag_tensor *ag_cross_entropy(ag_tape *tp, ag_tensor *logits, const int32_t *targets,
                            size_t n_targets, int32_t ignore_index) {
    if (!tp) {
        ag_error("cross_entropy: tape is NULL");
        return NULL;
    }
    if (!agi_check_float("cross_entropy", "logits", logits) ||
        !agi_check_ndim("cross_entropy", "logits [..., C]", logits, 1, AG_MAX_DIMS))
        return NULL;
    size_t rows = agi_rows(logits);
    int C = agi_last(logits);
    if (!targets) {
        ag_error("cross_entropy: targets is NULL (logits %s, %zu targets expected)",
                 agi_shape(logits), rows);
        return NULL;
    }
    // The count is checked before any target is read: a short array is an error,
    // never a read past its end.
    if (n_targets != rows) {
        ag_error("cross_entropy: %zu targets for logits %s, which has %zu rows", n_targets,
                 agi_shape(logits), rows);
        return NULL;
    }
    size_t kept = 0;
    for (size_t r = 0; r < rows; r++) {
        if (targets[r] == ignore_index) continue;
        if (targets[r] < 0 || targets[r] >= C) {
            ag_error("cross_entropy: target %d at position %zu is out of range for %d classes "
                     "(logits %s, ignore_index %d)",
                     (int)targets[r], r, C, agi_shape(logits), (int)ignore_index);
            return NULL;
        }
        kept++;
    }
    int32_t *copy = ag_tape_alloc(tp, rows * sizeof *copy);
    memcpy(copy, targets, rows * sizeof *copy);
    cross_entropy_params p = {copy, ignore_index, kept};
    return ag_apply(tp, agi_pick(logits, &agi_cross_entropy_op_f32, &agi_cross_entropy_op_f64),
                    1, &logits, 0, NULL, &p, sizeof p);
}
#endif
