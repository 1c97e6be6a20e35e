// Two losses small models use: negative log-likelihood and binary cross-entropy on logits.
//   nll_loss:         logp: [..., C] (log-probabilities, e.g. ag_log_softmax), targets:
//                     n_targets = numel/C ints in [0, C) or == ignore_index -> y: []
//                     y = -(1/N) sum over kept rows r of logp[r, t_r]  (N kept rows)
//                     dlogp[r, t_r] = -dy / N; every other entry 0
//   bce_with_logits:  x, target: same shape -> y: []
//                     y = (1/n) sum max(x, 0) - x t + log(1 + e^-|x|)
//                     (= -(t log s + (1-t) log(1-s)), s = sigmoid(x), without overflow)
//                     max(x, 0) - x t taken as (1 - t) x for x > 0, -t x otherwise: an
//                     infinite x gives +inf, or NaN where that is 0 * inf (PyTorch: NaN
//                     for every x = -inf)
//                     dx = dy (s - t) / n;  dt = -dy x / n
// As ag_cross_entropy: classes are the last dim, targets are copied, every target ignored
// gives 0 with zero gradient (PyTorch: NaN). Sums run in double, in order.

#include "op.h"

typedef struct {
    const int32_t *targets;  // a copy in tape memory
    int32_t ignore_index;
    size_t kept;
} nll_params;

static void nll_loss_forward(ag_node *n) {
    const nll_params *p = n->params;
    const ag_tensor *x = n->in[0];
    size_t C = (size_t)agi_last(x), rows = agi_rows(x);
    const real *lp = x->data;
    double s = 0;
    for (size_t r = 0; r < rows; r++)
        if (p->targets[r] != p->ignore_index) s -= (double)lp[r * C + (size_t)p->targets[r]];
    ((real *)n->out->data)[0] = p->kept ? (real)(s / (double)p->kept) : 0;
}

static void nll_loss_backward(ag_node *n) {
    const nll_params *p = n->params;
    const ag_tensor *x = n->in[0];
    if (!p->kept) return;
    size_t C = (size_t)agi_last(x), rows = agi_rows(x);
    real g = (real)(-(double)((const real *)n->out->grad)[0] / (double)p->kept);
    real *dx = x->grad;
    for (size_t r = 0; r < rows; r++)
        if (p->targets[r] != p->ignore_index) dx[r * C + (size_t)p->targets[r]] += g;
}

static void bce_forward(ag_node *n) {
    const real *x = n->in[0]->data, *t = n->in[1]->data;
    size_t count = n->in[0]->numel;
    double s = 0;
    for (size_t k = 0; k < count; k++)
        // (1 - t) x, not x - x t: x = +inf with t < 1 is +inf, as in PyTorch, not inf - inf.
        s += (double)((x[k] > 0 ? (1 - t[k]) * x[k] : -(t[k] * x[k])) +
                      log1p((double)r_exp(-r_fabs(x[k]))));
    ((real *)n->out->data)[0] = (real)(s / (double)count);
}

static void bce_backward(ag_node *n) {
    const real *x = n->in[0]->data, *t = n->in[1]->data;
    real *dx = n->in[0]->grad, *dt = n->in[1]->grad;
    size_t count = n->in[0]->numel;
    real g = (real)((double)((const real *)n->out->grad)[0] / (double)count);
    for (size_t k = 0; k < count; k++) {
        if (dx) dx[k] += g * (1 / (1 + r_exp(-x[k])) - t[k]);
        if (dt) dt[k] -= g * x[k];
    }
}

const ag_op R(agi_nll_loss_op) = {"nll_loss", nll_loss_forward, nll_loss_backward,
    "dlogp[r, t_r] = -dy / N"};
const ag_op R(agi_bce_with_logits_op) = {"bce_with_logits", bce_forward, bce_backward,
    "dx = dy (sigmoid(x) - t) / n; dt = -dy x / n"};

#if AG_ONCE
ag_tensor *ag_nll_loss(ag_tape *tp, ag_tensor *logp, const int32_t *targets,
                       size_t n_targets, int32_t ignore_index) {
    size_t kept;
    int32_t *copy = agi_targets_copy("nll_loss", "logp", logp, tp, targets, n_targets,
                                     ignore_index, &kept);
    if (!copy) return NULL;
    nll_params p = {copy, ignore_index, kept};
    return ag_op_apply(tp, agi_pick(logp, &agi_nll_loss_op_f32, &agi_nll_loss_op_f64), 1, &logp, 0,
                    NULL, &p, sizeof p);
}

ag_tensor *ag_bce_with_logits(ag_tape *tp, ag_tensor *x, ag_tensor *target) {
    if (!agi_check_float("bce_with_logits", "x", x) ||
        !agi_check_float("bce_with_logits", "target", target) ||
        !agi_check_same_dtype("bce_with_logits", x, target) ||
        !agi_check_same_shape("bce_with_logits", x, target))
        return NULL;
    ag_tensor *in[] = {x, target};
    return ag_op_apply(tp, agi_pick(x, &agi_bce_with_logits_op_f32, &agi_bce_with_logits_op_f64), 2,
                    in, 0, NULL, NULL, 0);
}
#endif
