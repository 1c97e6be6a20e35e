// Initialisers with torch.nn.init's formulas, drawing from a pcg32 stream.
// Values are drawn in double and rounded to the tensor's dtype, so an f32 and
// an f64 tensor initialised from equal generators hold the same numbers.
#include <math.h>

#include "internal.h"

static bool is_float_tensor(const char *op, const ag_tensor *t) {
    if (t && agi_is_float(t->dtype)) return true;
    ag_error("%s: needs a float tensor, got %s", op,
             t ? ag_dtype_name(t->dtype) : "NULL");
    return false;
}

void ag_init_uniform(ag_tensor *t, ag_pcg32 *rng, double lo, double hi) {
    if (!is_float_tensor("init_uniform", t)) return;
    for (size_t i = 0; i < t->numel; i++)
        ag_tensor_set(t, i, lo + (hi - lo) * ag_pcg32_double(rng));
}

void ag_init_normal(ag_tensor *t, ag_pcg32 *rng, double mean, double std) {
    if (!is_float_tensor("init_normal", t)) return;
    for (size_t i = 0; i < t->numel; i++)
        ag_tensor_set(t, i, mean + std * ag_pcg32_normal(rng));
}

// As torch.nn.init._calculate_fan_in_and_fan_out: [out, in, *receptive].
static bool fans(const char *op, const ag_tensor *t, int *fan_in, int *fan_out) {
    if (t->ndim < 2) {
        ag_error("%s: fan in and fan out need at least 2 dimensions, got %s", op,
                 agi_shape(t));
        return false;
    }
    int receptive = 1;
    for (int i = 2; i < t->ndim; i++) receptive *= t->shape[i];
    *fan_in = t->shape[1] * receptive;
    *fan_out = t->shape[0] * receptive;
    return true;
}

int ag_fan_in(const ag_tensor *t) {
    int in = 0, out = 0;
    fans("fan_in", t, &in, &out);
    return in;
}

int ag_fan_out(const ag_tensor *t) {
    int in = 0, out = 0;
    fans("fan_out", t, &in, &out);
    return out;
}

void ag_init_xavier_uniform(ag_tensor *t, ag_pcg32 *rng, double gain) {
    int in, out;
    if (!is_float_tensor("init_xavier_uniform", t) ||
        !fans("init_xavier_uniform", t, &in, &out))
        return;
    double bound = gain * sqrt(6.0 / (double)(in + out));
    ag_init_uniform(t, rng, -bound, bound);
}

void ag_init_kaiming_uniform(ag_tensor *t, ag_pcg32 *rng, double a) {
    int in, out;
    if (!is_float_tensor("init_kaiming_uniform", t) ||
        !fans("init_kaiming_uniform", t, &in, &out))
        return;
    double bound = sqrt(6.0 / ((1.0 + a * a) * (double)in));
    ag_init_uniform(t, rng, -bound, bound);
}
