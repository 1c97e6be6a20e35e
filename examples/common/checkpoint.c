#define _POSIX_C_SOURCE 200809L  // access
#include "checkpoint.h"

#include <stdio.h>

#include "dist.h"

bool checkpoint_load_checked(ag_params *ps, ag_optim *opt, const char *path, int last_step,
                             ag_safetensors **file, ag_err *err) {
    if (file) *file = NULL;
    ag_safetensors *f;
    if (ag_checkpoint_load(ps, opt ? ag_optim_state(opt) : NULL, path, &f, err) != 0)
        return false;
    const ag_tensor *bad = ag_params_first_nonfinite(ps, false);
    const long long step = opt ? ag_optim_step_count(opt) : 0;
    bool ok = false;
    if (bad)
        snprintf(err->msg, sizeof err->msg, "%.300s: parameter %.100s holds a NaN or an infinity",
                 path, bad->name);
    else if (step < 0 || step > last_step)
        snprintf(err->msg, sizeof err->msg, "%.300s: optimizer.step %lld is outside [0, --steps "
                 "%d]", path, step, last_step);
    else
        ok = true;
    if (ok && file)
        *file = f;
    else
        ag_safetensors_free(f);
    return ok;
}

void checkpoint_save_everywhere(const ag_params *ps, ag_optim *opt, const char *path,
                                const char *const meta[], int status) {
    ag_err err;
    bool saved = true;
    if (dist_rank() == 0)
        saved = ag_checkpoint_save(ps, ag_optim_state(opt), path, meta, &err) == 0;
    dist_check(!saved, status, "%s", err.msg);
}

bool checkpoint_path_usable(const char *flag, const char *path, ag_err *err) {
    ag_err why;
    if (ag_file_path_check(path, &why) == 0) return true;
    snprintf(err->msg, sizeof err->msg, "%.40s %.460s", flag, why.msg);
    return false;
}
