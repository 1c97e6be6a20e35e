// How much each attention head matters, two ways, both around a user callback that
// computes a loss with one head mask per layer (the masks go into ag_mha_opts.head_mask):
//   gradient: I[l][j] = mean over batches of |d loss / d mask[l][j]| at mask = 1
//             (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?");
//   ablation: I[l][j] = mean loss with mask[l][j] = 0 (the rest 1) - mean loss with all 1
//             (the seeds' head_importance: the loss increase when the head is silenced).
// The gradient takes one forward and backward per batch for every head at once; ablation
// takes layers * heads + 1 forwards per batch, in no-grad mode.
#include <limits.h>
#include <math.h>

#include "nn.h"

typedef struct {
    ag_tensor *mask[AG_HEAD_MAX_LAYERS];
    int layers;
} mask_set;

// Checks every argument of both measures, then makes the masks.
static bool make_masks(mask_set *s, ag_head_loss_fn fn, const double *importance, ag_dtype dt,
                       int layers, int heads, int batches, const char *who) {
    if (!fn || !importance) {
        ag_error("%s: the %s is NULL", who, !fn ? "loss callback" : "importance array");
        return false;
    }
    if (layers < 1 || layers > AG_HEAD_MAX_LAYERS || heads < 1) {
        ag_error("%s: layers %d must be in [1, %d] and heads %d >= 1", who, layers,
                 AG_HEAD_MAX_LAYERS, heads);
        return false;
    }
    if ((long long)layers * heads > INT_MAX) {
        ag_error("%s: layers %d x heads %d scores are more than %d", who, layers, heads,
                 INT_MAX);
        return false;
    }
    if (batches < 1) {
        ag_error("%s: batches %d; a mean needs at least 1", who, batches);
        return false;
    }
    if (!agi_is_float(dt)) {
        ag_error("%s: the masks' dtype must be f32 or f64, got %s", who, ag_dtype_name(dt));
        return false;
    }
    s->layers = layers;
    for (int l = 0; l < layers; l++) s->mask[l] = ag_tensor_ones(dt, 1, (int[]){heads});
    return true;
}

static void free_masks(mask_set *s) {
    for (int l = 0; l < s->layers; l++) ag_tensor_free(s->mask[l]);
}

// The loss of batch `batch` on tp; NULL if the callback failed (it reported why) or, after
// reporting, returned something other than one value.
static ag_tensor *batch_loss(ag_tape *tp, ag_head_loss_fn fn, void *user, const mask_set *s,
                             int batch, const char *who) {
    ag_tape_reset(tp);
    ag_tensor *loss = fn(tp, s->mask, batch, user);
    if (loss && loss->numel != 1) {
        ag_error("%s: the loss callback returned %s for batch %d; it must return one value",
                 who, agi_shape(loss), batch);
        return NULL;
    }
    return loss;
}

// Adds the loss of one batch to *sum; false if there is none. A NaN loss is a loss: it
// spreads into the scores it touches, as in the gradient measure.
static bool add_batch_loss(ag_tape *tp, ag_head_loss_fn fn, void *user, const mask_set *s,
                           int batch, double *sum) {
    ag_tensor *loss = batch_loss(tp, fn, user, s, batch, "head_importance_ablation");
    if (loss) *sum += ag_tensor_item(loss, 0);
    return loss != NULL;
}

bool ag_head_importance_gradient(ag_head_loss_fn fn, void *user, ag_dtype dt, int layers,
                                 int heads, int batches, double *importance) {
    mask_set s;
    if (!make_masks(&s, fn, importance, dt, layers, heads, batches, "head_importance_gradient"))
        return false;
    for (int l = 0; l < layers; l++) ag_tensor_set_requires_grad(s.mask[l], true);
    for (int i = 0; i < layers * heads; i++) importance[i] = 0;
    ag_tape *tp = ag_tape_new();
    bool ok = true;
    for (int b = 0; ok && b < batches; b++) {
        ag_tensor *loss = batch_loss(tp, fn, user, &s, b, "head_importance_gradient");
        if (!loss) {
            ok = false;
            break;
        }
        // Without a graph behind it the loss has no derivative: backward would refuse it
        // and leave every score 0, which reads as "no head matters".
        if (!loss->requires_grad) {
            ag_error("head_importance_gradient: the loss callback returned a loss %s for batch "
                     "%d that does not require grad (computed in no-grad mode, or from no "
                     "mask or parameter); the masks' derivatives need one",
                     agi_shape(loss), b);
            ok = false;
            break;
        }
        for (int l = 0; l < layers; l++) ag_tensor_zero_grad(s.mask[l]);
        // A backward that reports an error (a loss recorded on another tape, an op with no
        // backward) leaves the masks' gradients 0 or partial: no scores to return.
        const unsigned long errors = agi_errors_reported();
        ag_backward(tp, loss);
        if (agi_errors_reported() != errors) {
            ok = false;
            break;
        }
        // A NaN loss has no derivative to speak of, though the masks' may come out
        // finite (the NaN in a term that does not involve them): it is NaN all the same.
        const bool nan = isnan(ag_tensor_item(loss, 0));
        for (int l = 0; l < layers; l++)
            for (int j = 0; j < heads; j++)
                importance[l * heads + j] +=
                    nan ? NAN : fabs(ag_tensor_grad_item(s.mask[l], (size_t)j));
    }
    for (int i = 0; ok && i < layers * heads; i++) importance[i] /= batches;
    ag_tape_free(tp);
    free_masks(&s);
    return ok;
}

bool ag_head_importance_ablation(ag_head_loss_fn fn, void *user, ag_dtype dt, int layers,
                                 int heads, int batches, double *importance) {
    mask_set s;
    if (!make_masks(&s, fn, importance, dt, layers, heads, batches, "head_importance_ablation"))
        return false;
    ag_tape *tp = ag_tape_new();
    ag_tape_set_grad_enabled(tp, false);
    double base = 0;
    bool ok = true;
    for (int b = 0; ok && b < batches; b++) ok = add_batch_loss(tp, fn, user, &s, b, &base);
    for (int l = 0; ok && l < layers; l++)
        for (int j = 0; ok && j < heads; j++) {
            ag_tensor_set_item(s.mask[l], (size_t)j, 0.0);
            double loss = 0;
            for (int b = 0; ok && b < batches; b++) ok = add_batch_loss(tp, fn, user, &s, b, &loss);
            ag_tensor_set_item(s.mask[l], (size_t)j, 1.0);
            importance[l * heads + j] = (loss - base) / batches;
        }
    ag_tape_free(tp);
    free_masks(&s);
    return ok;
}
