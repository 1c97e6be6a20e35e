// Initialisers with torch.nn.init's formulas, drawing from a pcg32 stream.
// Values are drawn in double and rounded to the tensor's dtype, so an f32 and
// an f64 tensor initialised from equal generators hold the same numbers.
#include <limits.h>
#include <math.h>

#include "internal.h"

static bool is_float_tensor(const char *op, const ag_tensor *t) {
    if (t && agi_is_float(t->dtype)) return true;
    ag_error("%s: needs a float tensor, got %s", op,
             t ? ag_dtype_name(t->dtype) : "NULL");
    return false;
}

// A float tensor and a generator: what every initialiser draws with.
static bool can_draw(const char *op, const ag_tensor *t, const ag_pcg32 *rng) {
    if (!is_float_tensor(op, t)) return false;
    if (!t->data) {  // else every element would report it
        ag_error("%s: tensor %s has no data (a gradient no backward has reached)", op,
                 agi_shape(t));
        return false;
    }
    if (rng) return true;
    ag_error("%s: rng is NULL (tensor %s)", op, agi_shape(t));
    return false;
}

// As torch's uniform_, a range that is reversed, NaN or wider than a double
// is refused: it would fill the tensor with numbers outside it, or with NaN.
bool agi_init_uniform(const char *op, ag_tensor *t, ag_pcg32 *rng, double lo, double hi) {
    if (!can_draw(op, t, rng)) return false;
    if (!(lo <= hi) || !isfinite(hi - lo)) {
        ag_error("%s: needs lo <= hi, both finite, got lo %g, hi %g (tensor %s)", op, lo, hi,
                 agi_shape(t));
        return false;
    }
    for (size_t i = 0; i < t->numel; i++)
        ag_tensor_set_item(t, i, lo + (hi - lo) * ag_pcg32_double(rng));
    return true;
}

bool agi_init_normal(const char *op, ag_tensor *t, ag_pcg32 *rng, double mean, double std) {
    if (!can_draw(op, t, rng)) return false;
    if (!(std >= 0)) {
        ag_error("%s: std must be >= 0, got %g (tensor %s)", op, std, agi_shape(t));
        return false;
    }
    for (size_t i = 0; i < t->numel; i++)
        ag_tensor_set_item(t, i, mean + std * ag_pcg32_normal(rng));
    return true;
}

void ag_tensor_init_uniform(ag_tensor *t, ag_pcg32 *rng, double lo, double hi) {
    agi_init_uniform("tensor_init_uniform", t, rng, lo, hi);
}

void ag_tensor_init_normal(ag_tensor *t, ag_pcg32 *rng, double mean, double std) {
    agi_init_normal("tensor_init_normal", t, rng, mean, std);
}

// As torch.nn.init._calculate_fan_in_and_fan_out: [out, in, *receptive].
static bool fans(const char *op, const ag_tensor *t, int *fan_in, int *fan_out) {
    if (!t || t->ndim < 2) {
        ag_error("%s: fan in and fan out need at least 2 dimensions, got %s", op,
                 agi_shape(t));
        return false;
    }
    // Each product is of two numbers below 2^31: no long long overflows.
    long long receptive = 1, in = INT_MAX + 1LL, out = in;
    for (int i = 2; i < t->ndim && receptive <= INT_MAX; i++) receptive *= t->shape[i];
    if (receptive <= INT_MAX) {
        in = t->shape[1] * receptive;
        out = t->shape[0] * receptive;
    }
    if (in > INT_MAX || out > INT_MAX) {
        ag_error("%s: the fans of %s exceed %d", op, agi_shape(t), INT_MAX);
        return false;
    }
    *fan_in = (int)in;
    *fan_out = (int)out;
    return true;
}

int ag_tensor_fan_in(const ag_tensor *t) {
    int in = 0, out = 0;
    fans("tensor_fan_in", t, &in, &out);
    return in;
}

int ag_tensor_fan_out(const ag_tensor *t) {
    int in = 0, out = 0;
    fans("tensor_fan_out", t, &in, &out);
    return out;
}

void ag_tensor_init_xavier_uniform(ag_tensor *t, ag_pcg32 *rng, double gain) {
    int in, out;
    if (!can_draw("tensor_init_xavier_uniform", t, rng) ||
        !fans("tensor_init_xavier_uniform", t, &in, &out))
        return;
    double bound = gain * sqrt(6.0 / ((double)in + (double)out));  // no int sum to wrap
    agi_init_uniform("tensor_init_xavier_uniform", t, rng, -bound, bound);
}

void ag_tensor_init_kaiming_uniform(ag_tensor *t, ag_pcg32 *rng, double a) {
    int in, out;
    if (!can_draw("tensor_init_kaiming_uniform", t, rng) ||
        !fans("tensor_init_kaiming_uniform", t, &in, &out))
        return;
    double bound = sqrt(6.0 / ((1.0 + a * a) * (double)in));
    agi_init_uniform("tensor_init_kaiming_uniform", t, rng, -bound, bound);
}
