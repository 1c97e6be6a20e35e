// Learning-rate schedules: plain functions of the step, so a training loop
// (or a checkpoint resumed at step k) needs no schedule object.
#include "../core/internal.h"
#include "attograd/optim.h"

#include <math.h>

static const double pi = 3.14159265358979323846;

// Warmup ramps linearly to base_lr, reaching it on its last step; then half
// a cosine period takes the lr from base_lr down to min_lr at total_steps.
double ag_lr_warmup_cosine(int64_t step, int64_t warmup_steps, int64_t total_steps,
                           double base_lr, double min_lr) {
    if (step < 0 || warmup_steps < 0 || total_steps < warmup_steps) {
        ag_error("lr_warmup_cosine: need 0 <= step and 0 <= warmup_steps <= total_steps, "
                 "got step %lld, warmup_steps %lld, total_steps %lld",
                 (long long)step, (long long)warmup_steps, (long long)total_steps);
        return NAN;
    }
    // The fraction first: it is exactly 1 on warmup's last step, so that step's lr is
    // base_lr itself (base_lr * (step + 1) rounded, then divided, was often an ulp off).
    if (step < warmup_steps) return base_lr * ((double)(step + 1) / (double)warmup_steps);
    if (step >= total_steps) return min_lr;
    double progress = (double)(step - warmup_steps) / (double)(total_steps - warmup_steps);
    // Measured down from base_lr, so that decay starts at base_lr exactly (min_lr plus the
    // whole rounded difference missed it by an ulp), and kept from passing min_lr, which
    // the rounded difference could near the end.
    double lr = base_lr - (base_lr - min_lr) * (0.5 * (1.0 - cos(pi * progress)));
    return (base_lr >= min_lr ? lr < min_lr : lr > min_lr) ? min_lr : lr;
}
