#include "checkpoint.h"

#include <stdio.h>

bool checkpoint_load_checked(ag_params *ps, ag_optim *opt, const char *path, int last_step,
                             ag_safetensors **file, ag_err *err) {
    ag_safetensors *f;
    if (file) *file = NULL;
    if (ag_checkpoint_load(ps, opt ? ag_optim_state(opt) : NULL, path, &f, err)) return false;
    const ag_tensor *bad = ag_params_first_nonfinite(ps, false);
    const long long step = opt ? ag_optim_step_count(opt) : 0;
    if (bad)
        snprintf(err->msg, sizeof err->msg, "%.300s: parameter %.100s holds a NaN or an infinity",
                 path, bad->name);
    else if (step < 0 || step > last_step)
        snprintf(err->msg, sizeof err->msg, "%.300s: optimizer.step %lld is outside [0, --steps "
                 "%d]", path, step, last_step);
    else
        return file ? *file = f, true : (ag_safetensors_free(f), true);
    ag_safetensors_free(f);
    return false;
}
